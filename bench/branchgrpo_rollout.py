"""Rollout forward passes of BranchGRPO against flat GRPO at equal samples per iteration.

    python bench/branchgrpo_rollout.py [--workspace bench-ws] [--rounds 3]

Both arms are built from the default pipeline's SFT export (its data, condition cache and SFT stage are
the ones ``bench/rl_efficiency.py`` runs, cached) and sample one iteration of the same prompts and final
sample count, both with SDE on every trainable step. Every model call is counted by the rows it
evaluates (one row = one sample at one step); the replay rows are what training forwards per inner epoch
(flat GRPO: every sample at every stored step; BranchGRPO: every distinct transition once). Wall time is
the median of ``--rounds`` rollouts per arm, alternating the arms. Writes
``WORKSPACE/branchgrpo_rollout.json``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from rl_efficiency import EXAMPLES, UPSTREAM

from flowpost.core.config.loading import load_pipeline, pipeline_to_dict, validate_pipeline
from flowpost.core.io import write_json_atomic
from flowpost.stage import build_trainer
from flowpost.tasks.runner import PipelineRun

SHAPES: dict[str, dict[str, Any]] = {  # equal samples: prompts x group_size in both arms
    "digits example: 10 steps, 8 prompts x 8, split at 0, 3, 6": {
        "steps": 10,
        "prompts": 8,
        "branch": {"group_size": 8, "branch_steps": [0, 3, 6]},
    },
    "the reference's FLUX schedule: 20 steps, 4 prompts x 16, split at 0, 3, 6, 9": {
        "steps": 20,
        "prompts": 4,
        "branch": {"group_size": 16, "branch_steps": [0, 3, 6, 9]},
    },
}


def shape_pipeline(shape: dict[str, Any]) -> Any:
    """The default pipeline with a ``grpo`` and a ``branchgrpo`` stage of ``shape``."""
    data = pipeline_to_dict(load_pipeline(None))
    data["stages"]["branchgrpo"] = yaml.safe_load((EXAMPLES / "digits-branchgrpo.yaml").read_text())["stages"][
        "branchgrpo"
    ]
    group = shape["branch"]["group_size"]
    for name in ("grpo", "branchgrpo"):
        stage = data["stages"][name]
        stage["sampling"] = {**stage["sampling"], "steps": shape["steps"], "window": None}  # SDE on every step
        stage["train"] |= {"prompts_per_iteration": shape["prompts"], "group_size": group}
        stage["train"] |= {"rollout_batch_size": shape["prompts"] * group}
        stage["callbacks"].pop("trackers", None)
    data["stages"]["branchgrpo"]["train"] |= shape["branch"]
    data["evaluate"] = {**data["evaluate"], "after": ["sft"]}
    data["export"] = None
    return validate_pipeline(data, source="bench pipeline")


def count_rows(trainer: Any) -> list[int]:
    """Rows of every model call the trainer's adapter makes from now on."""
    calls: list[int] = []
    forward = trainer.adapter.forward

    def counted(x: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(int(x.shape[0]))
        return forward(x, *args, **kwargs)

    trainer.adapter.forward = counted
    return calls


def measure(run: PipelineRun, rounds: int, scratch: Path) -> dict[str, dict[str, Any]]:
    """Per arm: rollout rows and calls, samples, replay rows, median rollout seconds."""
    trainers = {arm: build_trainer(run.train_spec(arm, scratch / arm, resume=False)) for arm in ("grpo", "branchgrpo")}
    calls = {arm: count_rows(trainer) for arm, trainer in trainers.items()}
    seconds: dict[str, list[float]] = {arm: [] for arm in trainers}
    result: dict[str, dict[str, Any]] = {}
    for number in range(rounds):
        for arm in list(trainers)[:: 1 if number % 2 == 0 else -1]:
            calls[arm].clear()
            start = time.perf_counter()
            rollout = trainers[arm].sample()
            seconds[arm].append(time.perf_counter() - start)
            owners = getattr(rollout, "owners", None)
            replay = int(owners.sum()) if owners is not None else len(rollout) * len(rollout.steps)
            result[arm] = {"samples": len(rollout), "rows": sum(calls[arm]), "calls": len(calls[arm]), "replay": replay}
    for arm, values in seconds.items():
        result[arm]["seconds"] = statistics.median(values)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workspace", type=Path, default=Path("bench-ws"))
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    results = {}
    lines = [
        "| shape | samples | GRPO rollout rows | BranchGRPO rollout rows | ratio | rows / sample (GRPO, Branch) "
        "| replay rows (GRPO, Branch) | rollout s (GRPO, Branch) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for label, shape in SHAPES.items():
        run = PipelineRun(shape_pipeline(shape), args.workspace)
        for node in UPSTREAM[:3]:
            run.execute(node)
        with tempfile.TemporaryDirectory() as scratch:
            measured = measure(run, args.rounds, Path(scratch))
        results[label] = measured
        flat, tree = measured["grpo"], measured["branchgrpo"]
        assert flat["samples"] == tree["samples"]
        lines.append(
            f"| {label} | {flat['samples']} | {flat['rows']} | {tree['rows']} | {tree['rows'] / flat['rows']:.3f} "
            f"| {flat['rows'] / flat['samples']:.2f}, {tree['rows'] / tree['samples']:.2f} "
            f"| {flat['replay']}, {tree['replay']} | {flat['seconds']:.2f}, {tree['seconds']:.2f} |"
        )
        print(lines[-1], flush=True)
    print("\n".join(lines))
    write_json_atomic(args.workspace / "branchgrpo_rollout.json", {"results": results, "table": lines})
    return 0


if __name__ == "__main__":
    sys.exit(main())
