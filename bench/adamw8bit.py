"""``train.optimizer: adamw8bit`` against ``adamw``: the optimizer state's bytes on real-width parameter sets,
and the default pipeline's SFT loss curve under each.

    python bench/adamw8bit.py [--workspace bench-ws] [--steps 20] [--set stages.sft.train.batch_size=16 ...]

Memory: each parameter set (LoRA rank 64 on the twelve linears of one FLUX.1 double-stream block, width 3072,
feed-forward 12288; one whole 3072 x 3072 attention projection with its bias) takes one step of each optimizer
on random gradients; the bytes of every state tensor are summed (torchao's 8-bit moments: codes, block scales
and code map) and set against the preflight's bytes per value (8 for fp32 AdamW, ``STATE_BYTES_PER_VALUE``).

Loss curve: the default pipeline's SFT stage (built from scratch, same seed and data) for ``--steps`` optimizer
steps under each optimizer; prints both losses per step, the largest gap, how far apart the final weights are
against the size of AdamW's update (``|w_8bit - w_adamw| / |w_adamw - w_start|``) and each arm's median step.
Writes ``WORKSPACE/adamw8bit.json``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

import torch
from prepared import bench_pipeline, fresh_spec, prepared_run, unit_seconds

from flowpost.core.events import read_events
from flowpost.core.io import write_json_atomic
from flowpost.core.trainers.base import BaseTrainer
from flowpost.core.trainers.eight_bit import STATE_BYTES_PER_VALUE, adamw8bit
from flowpost.stage import build_trainer

WIDTH, FEED_FORWARD, RANK = 3072, 12288, 64
OPTIMIZERS = ("adamw", "adamw8bit")


def lora_block() -> list[torch.nn.Parameter]:
    """Rank-``RANK`` adapters (A: rank x in, B: out x rank) on one FLUX.1 double-stream block's linears: per
    stream, q, k, v and the output projection (width to width) and the feed-forward's two (width to 4 width)."""
    shapes = [(WIDTH, WIDTH)] * 4 + [(WIDTH, FEED_FORWARD), (FEED_FORWARD, WIDTH)]
    return [
        torch.nn.Parameter(torch.zeros(*shape))
        for _ in range(2)  # image and text streams
        for fan_in, fan_out in shapes
        for shape in ((RANK, fan_in), (fan_out, RANK))
    ]


def whole_projection() -> list[torch.nn.Parameter]:
    return [torch.nn.Parameter(torch.zeros(WIDTH, WIDTH)), torch.nn.Parameter(torch.zeros(WIDTH))]


def state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of every tensor in ``optimizer``'s state (an 8-bit moment: its codes, scales and code map)."""
    total = 0
    for state in optimizer.state.values():
        for value in state.values():
            parts = [value.codes, value.scale, value.qmap] if hasattr(value, "codes") else [value]
            total += sum(part.numel() * part.element_size() for part in parts)
    return total


def measure(parameters: list[torch.nn.Parameter], name: str) -> dict[str, float]:
    """One step of optimizer ``name`` over ``parameters`` on random gradients: its state's bytes."""
    generator = torch.Generator().manual_seed(0)
    for param in parameters:
        param.grad = torch.randn(param.shape, generator=generator)
    hyper = {"lr": 1e-4, "betas": (0.9, 0.999), "weight_decay": 0.0}
    optimizer = (
        adamw8bit(parameters, **hyper, where="bench") if name == "adamw8bit" else torch.optim.AdamW(parameters, **hyper)
    )
    optimizer.step()
    values = sum(p.numel() for p in parameters)
    measured = state_bytes(optimizer)
    estimate = values * (STATE_BYTES_PER_VALUE if name == "adamw8bit" else 8)
    return {"values": values, "bytes": measured, "per_value": measured / values, "estimate": estimate}


def memory() -> dict[str, dict[str, dict[str, float]]]:
    sets = {f"LoRA r{RANK}, one FLUX.1 double block": lora_block, "one 3072x3072 projection, full": whole_projection}
    return {label: {name: measure(build(), name) for name in OPTIMIZERS} for label, build in sets.items()}


def curves(workspace: Path, steps: int, overrides: list[str]) -> dict[str, Any]:
    """The default SFT stage for ``steps`` steps under each optimizer: losses, final weights and step times."""
    losses, weights, seconds = {}, {}, {}
    for name in OPTIMIZERS:
        run = prepared_run(
            workspace, bench_pipeline({"sft": steps}, [*overrides, f"stages.sft.train.optimizer={name}"])
        )
        out = workspace / "adamw8bit" / name
        trainer = build_trainer(fresh_spec(run, "sft", out))
        start = flat_weights(trainer)
        trainer.start()
        losses[name] = [e["metrics"]["loss"] for e in read_events(out / "events.jsonl") if e["event"] == "progress"]
        weights[name] = flat_weights(trainer)
        seconds[name] = statistics.median(unit_seconds(out / "events.jsonl"))
    gap = max(abs(a - b) for a, b in zip(losses["adamw"], losses["adamw8bit"], strict=True))
    apart = (weights["adamw8bit"] - weights["adamw"]).norm() / (weights["adamw"] - start).norm()
    return {"losses": losses, "max_gap": gap, "update_relative_difference": float(apart), "step_seconds": seconds}


def flat_weights(trainer: BaseTrainer) -> torch.Tensor:
    return torch.cat([p.detach().flatten().clone() for p in trainer.adapter.module().parameters()])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workspace", type=Path, default=Path("bench-ws"))
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--set", action="append", default=[], dest="overrides", metavar="KEY=VALUE")
    args = parser.parse_args(argv)
    result = {"memory": memory(), "curves": curves(args.workspace, args.steps, args.overrides)}
    for label, arms in result["memory"].items():
        for name, r in arms.items():
            print(
                f"{label} | {name} | {r['values'] / 1e6:.2f} M values | {r['bytes'] / 2**20:.1f} MiB "
                f"| {r['per_value']:.4f} B/value | preflight {r['estimate'] / 2**20:.1f} MiB"
            )
    c = result["curves"]
    for step, (a, b) in enumerate(zip(c["losses"]["adamw"], c["losses"]["adamw8bit"], strict=True), start=1):
        print(f"step {step:3d} | adamw {a:.5f} | adamw8bit {b:.5f} | gap {b - a:+.5f}")
    print(
        f"largest loss gap {c['max_gap']:.5f}; the final weights differ by {c['update_relative_difference']:.2e} "
        f"of AdamW's update; median step {c['step_seconds']['adamw']:.3f} s (adamw), "
        f"{c['step_seconds']['adamw8bit']:.3f} s (adamw8bit)"
    )
    write_json_atomic(args.workspace / "adamw8bit.json", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
