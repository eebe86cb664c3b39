"""LoRA through PEFT on any diffusers model: inject, detect, and merge for export."""

from __future__ import annotations

import copy

from torch import nn

SD3_ATTENTION_TARGETS = (
    "to_q",
    "to_k",
    "to_v",
    "to_out.0",
    "add_q_proj",
    "add_k_proj",
    "add_v_proj",
    "to_add_out",
)


def add_lora(module: nn.Module, *, rank: int, alpha: float, targets: tuple[str, ...] | list[str]) -> None:
    """Freeze ``module`` and inject trainable LoRA layers (B = 0, so outputs start unchanged)."""
    from peft import LoraConfig

    module.requires_grad_(False)
    module.add_adapter(  # type: ignore[operator]
        LoraConfig(r=rank, lora_alpha=alpha, target_modules=list(targets), init_lora_weights=True)
    )


def has_lora(module: nn.Module) -> bool:
    return bool(getattr(module, "_hf_peft_config_loaded", False))


def merged_copy(module: nn.Module) -> nn.Module:
    """A copy of ``module`` with its LoRA layers fused into the base weights and removed."""
    merged = copy.deepcopy(module)
    merged.fuse_lora()  # type: ignore[operator]
    merged.unload_lora()  # type: ignore[operator]
    return merged
