"""LoRA through PEFT on any diffusers model: inject, detect, merge and save for export."""

from __future__ import annotations

import copy
import warnings
from pathlib import Path

from torch import nn

from flowpost.core.models.precision import upcast_trainable
from flowpost.core.models.quantize import dequantize, has_quantized

LORA_WEIGHTS = "pytorch_lora_weights.safetensors"  # the file ``save_lora`` writes (diffusers' name)
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
    with warnings.catch_warnings():  # over a quantized base: exports merge into a dequantized copy, not PEFT
        warnings.filterwarnings("ignore", message="TorchaoLoraLinear was instantiated without")
        module.add_adapter(  # type: ignore[operator]
            LoraConfig(r=rank, lora_alpha=alpha, target_modules=list(targets), init_lora_weights=True)
        )


def has_lora(module: nn.Module) -> bool:
    return bool(getattr(module, "_hf_peft_config_loaded", False))


def merged_copy(module: nn.Module) -> nn.Module:
    """A copy of ``module`` with its LoRA layers fused into the base weights (dequantized) and removed."""
    merged = plain_copy(module)
    merged.fuse_lora()  # type: ignore[operator]
    merged.unload_lora()  # type: ignore[operator]
    return merged


def base_copy(module: nn.Module) -> nn.Module:
    """A copy of ``module`` with its LoRA layers removed unmerged: the weights the adapters sit on (dequantized)."""
    base = copy.deepcopy(module)
    base.unload_lora()  # type: ignore[operator]
    return dequantize(base)


def plain_copy(module: nn.Module) -> nn.Module:
    """A copy of ``module`` whose quantized base is dequantized under the same adapters, as plain PEFT layers."""
    if not has_quantized(module):
        return copy.deepcopy(module)
    from peft.utils import get_peft_model_state_dict, set_peft_model_state_dict

    plain = base_copy(module)
    for name, config in module.peft_config.items():  # type: ignore[union-attr]
        plain.add_adapter(copy.deepcopy(config), adapter_name=name)  # type: ignore[operator]
        upcast_trainable(plain)  # the adapters' fp32 values, as trained
        set_peft_model_state_dict(plain, get_peft_model_state_dict(module, adapter_name=name), adapter_name=name)
    plain.set_adapter(module.active_adapters())  # type: ignore[operator]
    return plain


def without_lora(module: nn.Module) -> nn.Module:
    """``module`` itself, or a merged copy when it has LoRA layers: a plain diffusers model either way."""
    return merged_copy(module) if has_lora(module) else module


def save_lora(module: nn.Module, folder: Path, *, pipeline_class: str = "StableDiffusion3Pipeline") -> None:
    """The LoRA layers as ``pipeline_class.save_lora_weights`` writes them: ``LORA_WEIGHTS``
    with ``transformer.`` keys and the PEFT config (rank, alpha, targets) in its metadata, which
    ``load_lora_weights`` and ``load_lora_adapter`` read."""
    import diffusers
    from peft.utils import get_peft_model_state_dict

    getattr(diffusers, pipeline_class).save_lora_weights(
        folder,
        transformer_lora_layers=get_peft_model_state_dict(module),
        transformer_lora_adapter_metadata=module.peft_config["default"].to_dict(),  # type: ignore[index]
    )
