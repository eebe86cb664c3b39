"""K-repeat grouping of prompts across ranks: each drawn prompt appears ``group_size`` times."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from flowpost.core.noise import addressed_generator


@dataclass(frozen=True)
class GroupPlan:
    """One iteration's global layout: sample ``k`` uses prompt ``prompt_rows[k]`` in group ``group_ids[k]``.

    Group ids are unique across iterations (``iteration * prompts_per_iteration + p``), so groups are
    never keyed by prompt strings, which repeat.
    """

    prompt_rows: list[int]
    group_ids: list[int]

    def rank_slice(self, rank: int, world_size: int) -> range:
        """Contiguous global sample indices owned by ``rank``."""
        total = len(self.group_ids)
        if total % world_size:
            raise ValueError(f"{total} samples per iteration do not split evenly over {world_size} ranks")
        size = total // world_size
        return range(rank * size, (rank + 1) * size)


def plan_groups(pool_size: int, *, prompts: int, group_size: int, seed: int, stage: str, iteration: int) -> GroupPlan:
    """Draw ``prompts`` prompts from a pool (without replacement when it is large enough)."""
    generator = addressed_generator(seed, stage, iteration, 0, "prompts")
    if prompts <= pool_size:
        chosen = torch.randperm(pool_size, generator=generator)[:prompts].tolist()
    else:
        chosen = torch.randint(pool_size, (prompts,), generator=generator).tolist()
    rows = [row for row in chosen for _ in range(group_size)]
    groups = [iteration * prompts + p for p in range(prompts) for _ in range(group_size)]
    return GroupPlan(prompt_rows=rows, group_ids=groups)
