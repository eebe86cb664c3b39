"""bf16 precision on a real family's shape: the replayed PPO ratio and whether lr 1e-5 moves the LoRA weights.

    python bench/precision_check.py [--families sd3 flux1] [--shape real|tiny] [--workspace bench-ws]
                                    [--resolution 512] [--group 4] [--steps 10] [--iterations 2]

The pipeline is ``bench/gpu_family_iteration.py``'s (``--shape real``: the released transformer at full
depth, random weights, for a GPU; ``--shape tiny``: the tests' tiny folder, on the CPU), always loaded with
``torch_dtype: bfloat16`` and LoRA rank 32. A GRPO stage at lr 1e-5 first replays one rollout exactly as
training does (``check_consistency``: the largest |ratio - 1| before any update, bf16 autocast), then trains
``--iterations`` iterations; the JSON records the ratio error, the dtypes of the trainable weights and the
Adam moments, and the fraction of ``lora_A`` / ``lora_B`` entries the updates changed
(``WORKSPACE/precision_check.json``, rewritten after each family).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch
from gpu_family_iteration import prepare, release, stage_spec

from flowpost.core.diagnostics import check_consistency
from flowpost.core.io import write_json_atomic
from flowpost.stage import build_trainer

LR = 1e-5


def changed_fraction(before: dict[str, torch.Tensor], network: torch.nn.Module) -> float:
    """The fraction of the entries of ``before``'s parameters that now differ."""
    now = dict(network.named_parameters())
    changed = sum(int((now[name].detach().cpu() != value).sum()) for name, value in before.items())
    return changed / max(sum(value.numel() for value in before.values()), 1)


def check(workspace: Path, family: str, args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """``family``'s bf16 replay error and lr-1e-5 update fractions; its JSON entry."""
    root = workspace / "precision_check" / family
    model = {**prepare(root, family, args, device), "torch_dtype": "bfloat16"}
    replayed = build_trainer(stage_spec(root, root / "replay", family, model, args, lr=LR))
    consistency = check_consistency(replayed)
    del replayed
    trainer = build_trainer(stage_spec(root, root / "trained", family, model, args, lr=LR))
    network = trainer.adapter.module()
    parts = {
        part: {n: p.detach().cpu().clone() for n, p in network.named_parameters() if part in n}
        for part in ("lora_A", "lora_B")
    }
    trainer.start()
    moments = [m for state in trainer.optimizer.optimizer.state.values() for k, m in state.items() if k != "step"]
    result = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "shape": args.shape,
        "lr": LR,
        "max_abs_ratio_error": consistency["max_abs_ratio_error"],
        "per_step_log_prob_mismatch": consistency["per_step_log_prob_mismatch"],
        "trainable_dtypes": sorted({str(p.dtype) for p in trainer.trainable}),
        "frozen_dtypes": sorted({str(p.dtype) for p in network.parameters() if not p.requires_grad}),
        "moment_dtypes": sorted({str(m.dtype) for m in moments}),
        "vae_dtypes": sorted({str(p.dtype) for p in trainer.adapter.vae.parameters()}),
        "optimizer_steps": trainer.progress.optimizer_step,
        **{f"{part}_changed": changed_fraction(before, network) for part, before in parts.items()},
    }
    print(f"{family}: {result}", flush=True)
    del trainer
    release(root, device.type == "cuda")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workspace", type=Path, default=Path("bench-ws"))
    parser.add_argument("--families", nargs="+", choices=["sd3", "flux1"], default=["sd3", "flux1"])
    parser.add_argument("--shape", choices=["real", "tiny"], default="real")
    parser.add_argument("--resolution", type=int, default=512)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--iterations", type=int, default=3, help="A moves from the second update on")
    args = parser.parse_args(argv)
    args.lora_rank, args.train_batch_size = 32, 2
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if args.shape == "real" and device.type != "cuda":
        parser.error("--shape real needs a CUDA device (a full-size transformer); use --shape tiny here")
    results: dict[str, Any] = {}
    for family in args.families:
        results[family] = check(args.workspace, family, args, device)
        write_json_atomic(args.workspace / "precision_check.json", results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
