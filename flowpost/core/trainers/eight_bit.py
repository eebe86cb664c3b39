"""``adamw8bit``: AdamW with block-wise 8-bit moments (``torchao.optim.AdamW8bit``), and its moments in the
checkpoint as plain tensors (codes, block scales, code map) so that a checkpoint reads back without torchao's
classes being allowed for unpickling.

torchao quantizes the moments of a tensor of at least 4096 values that ``BLOCK_SIZE`` divides; the moments of
smaller tensors (biases, norms, tiny adapters) stay fp32.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from flowpost.core.extras import TORCHAO_INSTALL, torchao_installed
from flowpost.errors import FlowpostError

BLOCK_SIZE = 256  # values per fp32 scale: torchao's default
STATE_BYTES_PER_VALUE = 2 * (1 + 4 / BLOCK_SIZE)  # two moments: a uint8 code and a share of an fp32 scale each
EIGHT_BIT_BACKENDS = ("ddp",)  # FSDP2 cannot load torchao's 8-bit moments back into shards; DeepSpeed owns its own
_CODES = "int8_codes"  # marks a moment written as plain tensors
MISSING = f"adamw8bit needs torchao, which is not installed; {TORCHAO_INSTALL}"


def adamw8bit(
    parameters: Iterable[nn.Parameter], *, lr: float, betas: tuple[float, float], weight_decay: float, where: str
) -> torch.optim.Optimizer:
    """torchao's ``AdamW8bit`` over ``parameters`` (torchao is imported here: it logs at import); ``where``
    names the config key that chose it."""
    if not torchao_installed():
        raise FlowpostError(MISSING, where=where)
    from torchao.optim import AdamW8bit

    return AdamW8bit(parameters, lr=lr, betas=betas, weight_decay=weight_decay, block_size=BLOCK_SIZE)


def eight_bit_problems(backend: str, processes: int) -> list[str]:
    """Why ``adamw8bit`` cannot run on ``processes`` of ``backend`` here (none when it can)."""
    problems = []
    if not torchao_installed():
        problems.append(MISSING)
    if processes > 1 and backend not in EIGHT_BIT_BACKENDS:
        reason = (
            "DeepSpeed ZeRO-2 steps an optimizer of its own"
            if backend == "deepspeed-zero2"
            else "FSDP2 cannot load 8-bit moments back into its shards, so the stage could not resume"
        )
        problems.append(f"adamw8bit runs on launch.backend ddp only ({reason}); use ddp, or adamw")
    return problems


def check_eight_bit(backend: str, processes: int, *, where: str) -> None:
    """Raise the ``eight_bit_problems`` of ``adamw8bit``, named at config key ``where``."""
    if problems := eight_bit_problems(backend, processes):
        raise FlowpostError("; ".join(problems), where=where)


def plain_state(state: dict[str, Any]) -> dict[str, Any]:
    """An optimizer state dict with each 8-bit moment as ``{_CODES: codes, scale, qmap, signed, dtype}`` (the
    empty dict a rank other than 0 gathers into stays empty)."""
    if "state" not in state:
        return state
    return {
        **state,
        "state": {name: {k: _plain(v) for k, v in moments.items()} for name, moments in state["state"].items()},
    }


def quantized_state(state: dict[str, Any]) -> dict[str, Any]:
    """The inverse of ``plain_state``: each moment written as plain tensors is an 8-bit moment again."""
    if "state" not in state or not any(_is_plain(v) for moments in state["state"].values() for v in moments.values()):
        return state
    from torchao.optim.subclass_8bit import OptimState8bit

    def restore(value: Any) -> Any:
        if not _is_plain(value):
            return value
        return OptimState8bit(value[_CODES], value["scale"], value["qmap"], value["signed"], value["dtype"])

    return {
        **state,
        "state": {name: {k: restore(v) for k, v in moments.items()} for name, moments in state["state"].items()},
    }


def _plain(value: Any) -> Any:
    module = sys.modules.get("torchao.optim.subclass_8bit")  # imported wherever an 8-bit moment exists
    if module is None or not isinstance(value, module.OptimState8bit):
        return value
    return {_CODES: value.codes, "scale": value.scale, "qmap": value.qmap, "signed": value.signed, "dtype": value.dtype}


def _is_plain(value: Any) -> bool:
    return isinstance(value, dict) and _CODES in value
