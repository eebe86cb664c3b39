"""Where a stage's ``model.quantize`` cannot work: a quantized weight takes no gradient (so LoRA only), the
sharded layouts and the ranks' collectives move plain tensors, and torchao must be installed."""

from __future__ import annotations

from typing import TYPE_CHECKING

from flowpost.core.extras import TORCHAO_INSTALL, torchao_installed

if TYPE_CHECKING:
    from flowpost.core.config.schema.stages import StageConfig


def quantize_problems(name: str, stage: StageConfig) -> list[str]:
    """Why stage ``name`` cannot train over its quantized base (empty when it can or quantizes nothing)."""
    kind, launch = stage.model.quantize, stage.launch
    if kind == "none":
        return []
    where = f"stages.{name}.model.quantize: {kind}"
    problems = []
    if stage.model.lora is None:
        problems.append(
            f"{where} stores a frozen base under LoRA adapters, and this stage trains every weight of the "
            f"transformer (a quantized weight takes no gradient); set stages.{name}.model.lora or quantize: none"
        )
    if launch.backend != "ddp":
        problems.append(
            f"{where} with launch.backend {launch.backend}: FSDP2 shards each parameter as a DTensor and DeepSpeed "
            "ZeRO flattens them into buffers, and neither carries torchao's quantized weights; use launch.backend: "
            "ddp or quantize: none"
        )
    elif launch.num_processes > 1:
        problems.append(
            f"{where} with launch.num_processes {launch.num_processes}: the ranks' broadcast of the starting "
            "weights and their replica check move plain tensors, not quantized ones; train in one process "
            "(launch.num_processes: 1) or set quantize: none"
        )
    if not torchao_installed():
        problems.append(f"{where} needs torchao: {TORCHAO_INSTALL}, or set quantize: none")
    return problems
