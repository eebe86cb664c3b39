"""LoRA adapters as one safetensors file in the kohya / ComfyUI key layout: ``lora_unet_<module>.lora_down.weight``,
``.lora_up.weight`` and ``.alpha``, each module named as the family's original checkpoint names it."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from flowpost.core.io import write_bytes_atomic
from flowpost.errors import FlowpostError

KOHYA_PREFIX = "lora_unet_"
DIFFUSERS_PREFIX = "transformer."  # the keys of ``lora/``: transformer.<module>.lora_A.weight / .lora_B.weight


@dataclass(frozen=True)
class KohyaModule:
    """A module of the original checkpoint and the diffusers modules it holds, stacked along its output rows.

    ``widths``: each part's output rows as a multiple of the module's input width, for a part the LoRA does
    not train (written as zeros).
    """

    name: str
    parts: tuple[str, ...]
    widths: tuple[int, ...] = (1,)


@dataclass(frozen=True)
class KohyaLayout:
    """A family's original module names: ``module(path)`` is the one holding diffusers module ``path``, None for
    the modules in ``unnamed``, which diffusers does not load from a kohya file."""

    module: Callable[[str], KohyaModule | None]
    metadata: Mapping[str, str]  # what the file's header says of the network (kohya's ``ss_*`` keys)
    unnamed: tuple[str, ...] = ()

    def unnamed_targets(self, targets: Sequence[str]) -> list[str]:
        """The LoRA target names (matched as PEFT matches them: a path or its dotted suffix) that would train
        an unnamed module."""
        return [t for t in targets if any(path == t or path.endswith(f".{t}") for path in self.unnamed)]


def diffusers_names(path: str) -> KohyaModule:
    """The layout of a family whose original checkpoint names its modules as diffusers does."""
    return KohyaModule(path, (path,))


def kohya_state_dict(lora: Mapping[str, Tensor], layout: KohyaLayout, *, alpha: float) -> dict[str, Tensor]:
    """Diffusers LoRA weights (``lora_A`` / ``lora_B`` of ``transformer.<module>``, scaled by ``alpha / rank``)
    as kohya keys. Fused parts become one module of rank ``n * rank`` with alpha ``n * alpha``: the downs
    stacked, the ups block-diagonal, so ``up @ down * alpha / rank`` is each part's own update."""
    adapters = {
        key.removeprefix(DIFFUSERS_PREFIX).removesuffix(".lora_A.weight"): (
            down,
            lora[key.replace(".lora_A.", ".lora_B.")],
        )
        for key, down in lora.items()
        if key.endswith(".lora_A.weight")
    }
    modules: dict[str, KohyaModule] = {}
    for path in adapters:
        module = layout.module(path)
        if module is None:
            raise FlowpostError(
                f"the LoRA trains module {path!r}, which the kohya layout has no name for; "
                "remove it from model.lora.targets or the 'kohya' format",
                where="export.formats",
            )
        modules[module.name] = module
    state: dict[str, Tensor] = {}
    for module in modules.values():
        down, up = _stacked(module, adapters)
        key = KOHYA_PREFIX + module.name.replace(".", "_")
        state[f"{key}.lora_down.weight"] = down.contiguous()
        state[f"{key}.lora_up.weight"] = up.contiguous()
        state[f"{key}.alpha"] = torch.tensor(alpha * len(module.parts), dtype=torch.float32)
    return state


def _stacked(module: KohyaModule, adapters: Mapping[str, tuple[Tensor, Tensor]]) -> tuple[Tensor, Tensor]:
    """The module's down (its parts' downs stacked) and up (block-diagonal); an untrained part contributes zeros."""
    trained_down = next(adapters[part][0] for part in module.parts if part in adapters)
    rank, width = trained_down.shape
    downs, ups = [], []
    for part, factor in zip(module.parts, module.widths, strict=True):
        down, up = adapters.get(part) or (
            trained_down.new_zeros(rank, width),
            trained_down.new_zeros(factor * width, rank),
        )
        downs.append(down)
        ups.append(up)
    return torch.cat(downs), torch.block_diag(*ups)


def save_kohya_lora(
    lora_file: Path, out_file: Path, layout: KohyaLayout, *, rank: int, alpha: float, metadata: Mapping[str, str]
) -> None:
    """Write the diffusers LoRA file ``lora_file`` as the kohya file ``out_file``, its header the layout's
    network description, the LoRA's rank and alpha and ``metadata``."""
    from safetensors.torch import load_file, save

    state = kohya_state_dict(load_file(lora_file), layout, alpha=alpha)
    header = {**layout.metadata, "ss_network_dim": str(rank), "ss_network_alpha": str(alpha), **metadata}
    write_bytes_atomic(out_file, save(state, metadata=header))
