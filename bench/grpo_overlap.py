"""A GRPO iteration of a small SD3 pipeline under four settings, at equal work: phases, time, peak memory.

    python bench/grpo_overlap.py [--workspace bench-ws] [--rounds 4] [--iterations 4] [--threads 1]
                                 [--reward jpeg|clip] [--prompts 2]

The arms are today's default (``replay_steps_per_pass: 0``, every stored step in one pass; rewards scored
after the rollout), ``auto`` (``replay_steps_per_pass: auto``), ``overlap`` (``overlap_rewards: true``)
and ``both``. The pipeline is the tests' tiny SD3 folder (``tests/tiny_sd3_pipeline.py``) with a larger
transformer (4 blocks, 4 heads of 32, 16x16 latents: 64 image tokens; 2.4 M parameters) trained in
full; GRPO with CFG 4.5, 10 Flow-SDE steps with a 4-step window, ``--prompts`` (2) x 4 rollouts in forward
batches of 4, micro-batches of 4, and one reward: ``jpeg`` (the JPEG size, a cheap CPU-side scorer) or
``clip`` (``clip_score`` through a random CLIP at openai/clip-vit-base-patch32's widths, 224 px, fp32: a
reward model whose scoring is a real share of the iteration, as PickScore's or an OCR model's is). Every
arm samples the same
rollouts (addressed noise) and replays the same steps; the script checks that each arm's first
iteration has the same reward mean and, within 1e-4, the same loss as the default.

Each arm's run is a fresh process (peak RSS is per process), rounds alternating the arms' order. A run
reports the ledger's phase seconds per iteration (rollout, reward, optimize; all iterations), the median
iteration seconds (events, the first iteration left out), the process's CPU seconds per iteration (all
threads, all iterations: what a loaded machine disturbs less) and the peak resident memory of the iterations
above what the built trainer holds (the peak reset after building: ``process_memory.py``). Writes
``WORKSPACE/grpo_overlap.json`` and prints a table of medians over rounds.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from prepared import folder_stage_spec, unit_seconds
from process_memory import peak, reset_peak, resident

from flowpost.core.config.schema import StageConfig
from flowpost.core.events import read_events
from flowpost.core.io import read_json, write_json_atomic
from flowpost.data.condition_cache import update_condition_cache
from flowpost.data.records import Demonstration
from flowpost.data.shards import write_shards
from flowpost.stage import build_trainer

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import tiny_sd3_pipeline as sd3  # noqa: E402
from tiny_clip import VIT_B_32, build_clip  # noqa: E402

FINGERPRINT = "bench-grpo-overlap-encoders"
TRANSFORMER = {
    **sd3.TRANSFORMER,
    "sample_size": 16,
    "pos_embed_max_size": 8,
    "num_layers": 4,
    "num_attention_heads": 4,
    "attention_head_dim": 32,
    "caption_projection_dim": 128,
}
ARMS = {
    "default": {},
    "auto": {"replay_steps_per_pass": "auto"},
    "overlap": {"overlap_rewards": True},
    "both": {"replay_steps_per_pass": "auto", "overlap_rewards": True},
}
PHASES = ("rollout", "reward", "optimize")
REWARDS = ("jpeg", "clip")


def prepare(root: Path, reward: str, prompts: int) -> dict[str, Any]:
    """The pipeline folder (larger transformer), prompt records, condition cache and ``reward``'s stage entry
    under an emptied ``root``."""
    from diffusers import SD3Transformer2DModel

    from flowpost.core.models.pretrained import PretrainedSource
    from flowpost.core.models.registry import adapter_class

    shutil.rmtree(root, ignore_errors=True)
    folder = sd3.build_tiny_sd3_pipeline(root / "pipeline")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        SD3Transformer2DModel(**TRANSFORMER).save_pretrained(root / "transformer")
    image = np.zeros((3, 8, 8), dtype=np.float32)  # rollouts read only the prompts
    texts = sd3.CORPUS[:prompts]
    records = [Demonstration(key=f"p{i}", prompt=prompt, image=image) for i, prompt in enumerate(texts)]
    write_json_atomic(root / "data" / "train" / "manifest.json", write_shards(records, root / "data" / "train"))
    encoder = adapter_class("sd3").prompt_encoder(PretrainedSource(str(folder)), max_length=sd3.T5_LENGTH)
    try:
        update_condition_cache(
            root / "conditions", ["", *texts], encoder_fingerprint=FINGERPRINT, encode=encoder.encode
        )
    finally:
        encoder.release()
    if reward == "clip":
        scorer = {"name": "clip_score", "options": {"model": str(build_clip(root / "clip", **VIT_B_32))}}
    else:
        scorer = {"name": "jpeg_incompressibility"}
    transformer = str(root / "transformer")
    model = {"family": "sd3", "pretrained": str(folder), "components": {"transformer": transformer}}
    return {"model": model, "reward": scorer, "prompts": prompts}


def stage(prepared: dict[str, Any], arm: str, iterations: int) -> StageConfig:
    """The GRPO stage of ``arm``."""
    train = {
        "lr": 1e-4,
        "iterations": iterations,
        "prompts_per_iteration": prepared["prompts"],
        "group_size": 4,
        "rollout_batch_size": 4,
        "train_batch_size": 4,
        "log_every": 1,
        "checkpoint_every": 0,
        **ARMS[arm],
    }
    sampling = {"dynamics": "flow-sde", "steps": 10, "noise_level": 0.7, "guidance": 4.5, "window": 4}
    return StageConfig.model_validate(
        {
            "trainer": "grpo",
            "model": prepared["model"],
            "sampling": sampling,
            "rewards": [prepared["reward"]],
            "train": train,
        }
    )


def run_arm(root: Path, arm: str, iterations: int, threads: int) -> dict[str, Any]:
    """One run of ``arm`` in this process: its phases, iteration seconds, peak RSS growth, first metrics."""
    torch.set_num_threads(threads)
    prepared = read_json(root / "prepared.json")
    out = root / "runs" / arm
    trainer = build_trainer(
        folder_stage_spec(stage(prepared, arm, iterations), root, out, name="grpo", fingerprint=FINGERPRINT)
    )
    before = resident()
    reset_peak()
    cpu = time.process_time()
    trainer.start()
    cpu = time.process_time() - cpu
    growth = peak() - before
    cost = read_json(out / "final" / "cost.json")
    steps = [e["metrics"] for e in read_events(out / "events.jsonl") if e["event"] == "progress"]
    return {
        "phases": {name: cost["phases"].get(name, 0.0) / iterations for name in PHASES},
        "iteration_s": statistics.median(unit_seconds(out / "events.jsonl")),
        "cpu_s": cpu / iterations,
        "peak_rss_growth": growth,
        "first": {key: steps[0][key] for key in ("loss", "reward/total_mean")},
        "steps_per_pass": steps[0].get("replay/steps_per_pass", 4.0),
    }


def in_process(root: Path, arm: str, iterations: int, threads: int) -> dict[str, Any]:
    """``run_arm`` in a fresh Python process."""
    command = [sys.executable, __file__, "--workspace", str(root.parent), "--arm", arm]
    command += ["--iterations", str(iterations), "--threads", str(threads)]
    done = subprocess.run(command, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def check_equal_work(runs: dict[str, list[dict[str, Any]]]) -> None:
    """Every arm's first iteration rewards the same samples alike and takes (about) the same loss."""
    reference = runs["default"][0]["first"]
    for arm, results in runs.items():
        for result in results:
            first = result["first"]
            if first["reward/total_mean"] != reference["reward/total_mean"]:
                raise RuntimeError(f"{arm}: first reward mean {first} differs from the default's {reference}")
            if abs(first["loss"] - reference["loss"]) > 1e-4 * max(1.0, abs(reference["loss"])):
                raise RuntimeError(f"{arm}: first loss {first['loss']!r}, the default's {reference['loss']!r}")


def summary(runs: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, float]]:
    """Medians over rounds of each arm."""
    table = {}
    for arm, results in runs.items():
        row = {f"{name}_s": statistics.median(r["phases"][name] for r in results) for name in PHASES}
        row["iteration_s"] = statistics.median(r["iteration_s"] for r in results)
        row["cpu_s"] = statistics.median(r["cpu_s"] for r in results)
        row["peak_rss_growth_mib"] = statistics.median(r["peak_rss_growth"] for r in results) / 2**20
        row["steps_per_pass"] = results[0]["steps_per_pass"]
        table[arm] = row
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workspace", type=Path, default=Path("bench-ws"))
    parser.add_argument("--rounds", type=int, default=4, help="runs per arm, the arms' order rotating")
    parser.add_argument("--iterations", type=int, default=4, help="GRPO iterations per run (the first untimed)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads of each run")
    parser.add_argument("--reward", choices=REWARDS, default="jpeg", help="the stage's reward (see above)")
    parser.add_argument("--prompts", type=int, default=2, help="prompts per iteration (4 rollouts each)")
    parser.add_argument("--arm", choices=list(ARMS), help=argparse.SUPPRESS)  # one run, in this process
    args = parser.parse_args(argv)
    if args.iterations < 2 or args.rounds < 1 or args.threads < 1 or not 1 <= args.prompts <= len(sd3.CORPUS):
        parser.error(
            f"--iterations must be at least 2 (the first is not timed); --rounds, --threads at least 1; "
            f"--prompts from 1 to {len(sd3.CORPUS)}"
        )
    root = args.workspace / "grpo_overlap"
    if args.arm is not None:
        print(json.dumps(run_arm(root, args.arm, args.iterations, args.threads)))
        return 0
    write_json_atomic(root / "prepared.json", prepare(root, args.reward, args.prompts))
    arms = list(ARMS)
    runs: dict[str, list[dict[str, Any]]] = {arm: [] for arm in arms}
    for number in range(args.rounds):
        for arm in arms[number % len(arms) :] + arms[: number % len(arms)]:
            runs[arm].append(in_process(root, arm, args.iterations, args.threads))
    check_equal_work(runs)
    table = summary(runs)
    write_json_atomic(args.workspace / "grpo_overlap.json", {"runs": runs, "medians": table, **vars(args)})
    default = table["default"]
    print(
        "| arm | steps/pass | rollout s | reward s | optimize s | iteration s | vs default | CPU s | peak RSS growth |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for arm, row in table.items():
        print(
            f"| {arm} | {row['steps_per_pass']:.0f} | {row['rollout_s']:.3f} | {row['reward_s']:.3f} | "
            f"{row['optimize_s']:.3f} | {row['iteration_s']:.3f} | {row['iteration_s'] / default['iteration_s']:.3f} | "
            f"{row['cpu_s']:.3f} | {row['peak_rss_growth_mib']:.0f} MiB |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
