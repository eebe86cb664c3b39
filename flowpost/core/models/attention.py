"""The attention backend of a diffusers transformer, chosen through diffusers' own attention dispatch
(``ModelMixin.set_attention_backend``): ``sdpa`` (torch's scaled dot-product attention, diffusers'
``native``), ``flash``, ``sage``, ``xformers``, ``flex`` and the others the installed diffusers knows."""

from __future__ import annotations

from torch import nn

from flowpost.core.models.joint_attention import dispatch_joint_attention
from flowpost.errors import FlowpostError

DEFAULT_ATTENTION = "sdpa"
ALIASES = {"sdpa": "native"}  # flowpost's name -> diffusers' AttentionBackendName value


def known_attention_backends() -> list[str]:
    """Every backend name the installed diffusers dispatches to, flowpost's ``sdpa`` first."""
    from diffusers.models.attention_dispatch import AttentionBackendName

    names = [member.value for member in AttentionBackendName if member.value not in ALIASES.values()]
    return [*ALIASES, *sorted(names)]


def diffusers_backend(name: str) -> str:
    """Diffusers' name of attention backend ``name``; ValueError naming the known ones when it is not one."""
    if name in ALIASES:
        return ALIASES[name]
    known = known_attention_backends()
    if name not in known:
        raise ValueError(f"unknown attention backend {name!r}; the installed diffusers knows: {', '.join(known)}")
    return name


def dispatches_attention(network: nn.Module) -> bool:
    """Whether any attention processor of ``network`` goes through diffusers' dispatch (has a backend slot)."""
    return any(hasattr(getattr(module, "processor", None), "_attention_backend") for module in network.modules())


def set_attention(network: nn.Module, name: str, *, where: str = "model.attention") -> None:
    """Route ``network``'s attention through backend ``name``.

    ``sdpa`` on a transformer whose processors call torch's SDPA directly (SD3's) changes nothing; another
    backend there replaces SD3's joint-attention processors by ones that dispatch. A transformer with
    neither, a backend whose package is not installed, or an unknown name is a ``FlowpostError`` at
    ``where`` saying what to do.
    """
    from diffusers.models.attention_dispatch import AttentionBackendName, _check_attention_backend_requirements

    try:
        backend = diffusers_backend(name)
    except ValueError as error:
        raise FlowpostError(str(error), where=where) from None
    if name == DEFAULT_ATTENTION and not dispatches_attention(network):
        return  # torch's SDPA already, whatever the processors
    try:
        _check_attention_backend_requirements(AttentionBackendName(backend))
    except RuntimeError as error:
        raise FlowpostError(f"attention backend {name!r} is not usable here: {error}", where=where) from None
    if not dispatches_attention(network) and not dispatch_joint_attention(network):
        raise FlowpostError(
            f"{type(network).__name__}'s attention processors do not go through diffusers' attention dispatch, "
            f"so backend {name!r} cannot apply; use {DEFAULT_ATTENTION}",
            where=where,
        )
    try:
        network.set_attention_backend(backend)  # type: ignore[operator]
    except (RuntimeError, ValueError, OSError) as error:
        raise FlowpostError(f"cannot set attention backend {name!r}: {error}", where=where) from None
