"""Prompt states for tests that build a condition cache without an encoder."""

from __future__ import annotations

import torch

from flowpost.core.conditions import ConditionBatch


def seeded_prompt_states(prompts: list[str]) -> ConditionBatch:
    """Seeded random states of the tiny family's width (16 tokens of 384), one generator per prompt length."""
    states = torch.stack([torch.randn(16, 384, generator=torch.Generator().manual_seed(len(p))) for p in prompts])
    return ConditionBatch(states, torch.ones(len(prompts), 16, dtype=torch.int8), states.mean(1))
