"""Train/inference consistency: replaying a rollout must reproduce its log-probabilities."""

from __future__ import annotations

from typing import Any

import torch

from flowpost.core.contracts import Feedback
from flowpost.core.noise import addressed_generator
from flowpost.core.trainers.base import BaseTrainer
from flowpost.core.trainers.rl.grpo import GRPOTrainer
from flowpost.errors import FlowpostError

RATIO_TOLERANCE = 1e-5


def check_consistency(trainer: BaseTrainer) -> dict[str, Any]:
    """One rollout, then a replay exactly as training does it: its first shuffled micro-batch, the
    model in training mode, its dtype. Before any update the PPO ratio must be 1."""
    if not isinstance(trainer, GRPOTrainer):
        raise FlowpostError(
            f"trainer {type(trainer).__name__} does not replay rollout log-probabilities (not a coupled trainer)",
            where=f"stages.{trainer.stage}.trainer",
        )
    trainer.model.train()
    rollout = trainer.sample()
    if trainer.execution_contract.feedback is Feedback.RUNTIME_REWARD:
        trainer.rollouts.score(rollout)
    local_batch = max(trainer.args.train_batch_size // trainer.accelerator.num_processes, 1)
    generator = addressed_generator(trainer.spec.seed, trainer.stage, trainer.progress.rollout_iteration, 0, "shuffle")
    rows = torch.randperm(len(rollout), generator=generator)[:local_batch].tolist()
    replayed = trainer.replay_log_probs(rollout.select(rows))
    stored = rollout.log_probs[rows].to(replayed.device)
    ratio_error = float((torch.exp(replayed - stored) - 1.0).abs().max())
    return {
        "stage": trainer.stage,
        "trainer": type(trainer).__name__,
        "dynamics": trainer.sampling.dynamics,
        "micro_batch": len(rows),
        "steps": rollout.steps.tolist(),
        "dtype": str(next(trainer.adapter.module().parameters()).dtype),
        "max_abs_ratio_error": ratio_error,
        "per_step_log_prob_mismatch": (replayed - stored).abs().max(0).values.tolist(),
        "ok": ratio_error < RATIO_TOLERANCE,
    }
