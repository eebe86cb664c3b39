"""A LoRA stage's frozen base in 8 bits (``model.quantize``): torchao weight-only quantization of the Linear
weights inside the transformer's repeated blocks (attention projections, feed-forward, AdaLN modulation), one
int8 or float8 (e4m3) value per weight and one fp32 scale per output row. Embedders, norms and the final
projection keep their dtype. Every pass runs the same quantized weights (dequantized in the matmul, so it saves
memory, not time); the adapters PEFT adds over them stay fp32. torchao is imported only when quantizing."""

from __future__ import annotations

import sys
from typing import Any, Literal

import torch
from torch import nn

from flowpost.core.models.compile import repeated_blocks

Quantize = Literal["none", "int8", "fp8"]  # model.quantize


def quantize_frozen(network: nn.Module, kind: str) -> None:
    """Quantize ``network``'s repeated blocks' Linear weights in place (deterministic: the same weights give
    the same bytes). Before LoRA is added: torchao would quantize the adapters' own Linear layers too, and
    PEFT wraps a quantized Linear in its torchao LoRA layer."""
    from torchao.quantization import Float8WeightOnlyConfig, Int8WeightOnlyConfig, quantize_

    if getattr(network, "_hf_peft_config_loaded", False):
        raise ValueError("quantize the base before adding LoRA adapters")
    config = {"int8": Int8WeightOnlyConfig, "fp8": Float8WeightOnlyConfig}[kind]()
    targets = {id(m) for block in repeated_blocks(network) for m in block.modules() if isinstance(m, nn.Linear)}
    quantize_(network, config, filter_fn=lambda module, _: id(module) in targets)


def is_quantized(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is a torchao quantized tensor (never, while torchao is not imported)."""
    utils = sys.modules.get("torchao.utils")
    return utils is not None and isinstance(tensor, utils.TorchAOBaseTensor)


def tensor_bytes(tensor: torch.Tensor) -> int:
    """The bytes ``tensor`` holds: a quantized one's data and scales, else its elements in its dtype."""
    if is_quantized(tensor):
        return sum(tensor_bytes(getattr(tensor, name)) for name in tensor.tensor_data_names)  # type: ignore[attr-defined]
    return tensor.numel() * tensor.element_size()


def has_quantized(network: nn.Module) -> bool:
    return any(is_quantized(p) for p in network.parameters())


def dequantize(network: nn.Module) -> nn.Module:
    """``network`` with each quantized weight replaced, in place, by its frozen dequantized values."""
    for module in network.modules():
        for name, param in list(module.named_parameters(recurse=False)):
            if is_quantized(param):
                setattr(module, name, nn.Parameter(param.dequantize(), requires_grad=False))
    return network


def without_quantized(state: dict[str, Any]) -> dict[str, Any]:
    """A model state less its quantized weights, which the stage re-creates from its base when it resumes."""
    return {key: value for key, value in state.items() if not is_quantized(value)}


def with_quantized(state: dict[str, Any], network: nn.Module) -> dict[str, Any]:
    """``state`` completed with ``network``'s own quantized weights (what ``without_quantized`` left out)."""
    return {**{k: v for k, v in network.state_dict().items() if is_quantized(v)}, **state}
