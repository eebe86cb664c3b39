"""DeepSpeed ZeRO stage 2: whole weights on every rank, gradients and optimizer state partitioned.

Forwards call the module directly, as in the other layouts. DeepSpeed's engine owns the backward
(its hooks reduce-scatter each backward's gradients into this rank's partition, so every rank runs
every backward) and the step (clipping, AdamW on the partition, all-gather of the new weights).
Checkpoints hold the whole AdamW state keyed by parameter name, gathered and scattered
collectively, as the other layouts write it.
"""

from __future__ import annotations

import os
from types import ModuleType
from typing import Any

import torch
from torch import nn

from flowpost.core.extras import DEEPSPEED_INSTALL
from flowpost.core.parallel.replicated import Replicated
from flowpost.errors import FlowpostError

MOMENTS = ("exp_avg", "exp_avg_sq")


def import_deepspeed() -> ModuleType:
    """DeepSpeed, set up for this machine (its CPU accelerator over gloo when there is no GPU)."""
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    try:
        import deepspeed
        import deepspeed.ops
    except ImportError:
        raise FlowpostError(
            f"launch.backend 'deepspeed-zero2' needs DeepSpeed: {DEEPSPEED_INSTALL}", where="launch.backend"
        ) from None
    # The shared-memory collective serves inference only and would be compiled at start-up.
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    return deepspeed


def engine_config(world_size: int) -> dict[str, Any]:
    """ZeRO-2 in fp32; every ``step()`` is an accumulation boundary (the trainer counts micro-batches)."""
    return {
        "train_batch_size": world_size,
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "managed_gradient_accumulation": False,
        "zero_optimization": {"stage": 2},
        "gradient_clipping": 0.0,
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 2**31 - 1,
        "wall_clock_breakdown": False,
    }


class EngineOptimizer:
    """The trainer's optimizer under ZeRO-2: ``step`` is the engine's; ``optimizer`` the AdamW inside it."""

    def __init__(self, engine: Any, optimizer: torch.optim.Optimizer) -> None:
        self.engine = engine
        self.optimizer = optimizer

    def step(self) -> None:
        self.engine.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.engine.zero_grad()


class ZeroPartitioned(Replicated):
    """DeepSpeed ZeRO-2 over the stage's processes (``launch.backend: deepspeed-zero2``)."""

    name = "deepspeed-zero2"
    collective_passes = True
    engine: Any = None

    def prepare_optimizer(self, model: nn.Module, optimizer: torch.optim.Optimizer, accelerator: Any) -> Any:
        deepspeed = import_deepspeed()
        self.engine, *_ = deepspeed.initialize(
            model=model,
            optimizer=optimizer,
            config=engine_config(accelerator.num_processes),
            dist_init_required=False,
        )
        self._trainable = {name: p for name, p in model.named_parameters() if p.requires_grad}
        return EngineOptimizer(self.engine, optimizer)

    def backward(self, loss: torch.Tensor, accelerator: Any) -> None:
        self.engine.backward(loss, scale_wrt_gas=False)

    def sync_gradients(self, parameters: list[nn.Parameter]) -> float | None:
        return None  # each backward already reduce-scattered its gradients

    def clip_gradients(self, accelerator: Any, model: nn.Module, max_norm: float) -> float | None:
        """The engine clips inside its step: set the threshold now; the norm is a step metric."""
        self.engine.optimizer.clip_grad = float(max_norm)
        return None

    def step_metrics(self) -> dict[str, float]:
        norm = self.engine.get_global_grad_norm()
        return {} if norm is None else {"grad_norm": float(norm)}

    def optimizer_state(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """The whole model's AdamW state keyed by parameter name, as every layout writes it
        (collective: each moment is gathered)."""
        from deepspeed.utils import safe_get_full_optimizer_state

        partitions = self.engine.optimizer.single_partition_of_fp32_groups
        step = optimizer.state.get(partitions[0], {}).get("step")
        state = {}
        if step is not None:
            for name, param in self._trainable.items():
                moments = {key: safe_get_full_optimizer_state(param, key).detach().cpu() for key in MOMENTS}
                state[name] = {"step": step.detach().clone().cpu(), **moments}
        groups = [{k: v for k, v in group.items() if k != "params"} for group in optimizer.param_groups]
        groups[0]["params"] = list(self._trainable)
        return {"state": state, "param_groups": groups}

    def load_model_state(self, model: nn.Module, state: dict[str, torch.Tensor]) -> None:
        """The module's weights and the engine's fp32 partitions, which are separate copies."""
        from deepspeed.utils import safe_set_full_fp32_param

        model.load_state_dict(state)
        for param in self._trainable.values():
            safe_set_full_fp32_param(param, param.detach())

    def load_optimizer_state(self, model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        from deepspeed.utils import safe_set_full_optimizer_state

        for group, saved in zip(optimizer.param_groups, state["param_groups"], strict=True):
            group.update({k: v for k, v in saved.items() if k != "params"})
        if not state["state"]:
            return
        zero = self.engine.optimizer
        step = next(iter(state["state"].values()))["step"]
        for partition in zero.single_partition_of_fp32_groups:  # AdamW creates its state lazily
            optimizer.state[partition] = {"step": step.clone(), **{k: torch.zeros_like(partition) for k in MOMENTS}}
        zero._lazy_init_hp_params_optimizer_state()
        for name, param in self._trainable.items():
            for key in MOMENTS:
                safe_set_full_optimizer_state(param, state["state"][name][key].to(param.device), key)
