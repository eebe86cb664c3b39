"""One GRPO iteration of a real family's full-size transformer (random weights): seconds, peak memory, MFU.

    python bench/gpu_family_iteration.py [--families sd3 flux1] [--shape real|tiny] [--workspace bench-ws]
                                         [--resolution 512] [--group 8] [--lora-rank 32] [--steps 10]
                                         [--train-batch-size 2] [--iterations 3] [--peak-tflops 989]

``--shape real`` (for a GPU) gives each family its released transformer's shape, SD3.5-Medium's (2.2 B
parameters) or FLUX.1-dev's (11.9 B), with random weights in bfloat16, next to text encoders of the real
widths and token counts (CLIP-L/G 77 tokens, T5 256 for sd3, 512 for flux1) but two narrow layers each
and a narrow VAE of the real latent shape: the transformer is what a GRPO iteration spends its time on.
The pipeline is saved as a diffusers folder and trained through flowpost's own stage (LoRA rank
``--lora-rank`` on the family's targets, bf16 autocast, one prompt with ``--group`` rollouts of
``--steps`` Flow-SDE steps, CFG 4.5 for sd3, a JPEG-size reward, ``--train-batch-size`` samples per
micro-batch) for ``--iterations`` iterations; the first, with its warm-up, is not timed. Peak memory is
the CUDA allocator's. Model FLOPs are counted by ``torch.utils.flop_counter`` over one more iteration of
a fresh stage (rollouts and training alike), and MFU is those FLOPs over the median iteration's seconds
times ``--peak-tflops`` (the H100/H200 bf16 dense peak by default). ``--shape tiny`` runs the tests' tiny
pipelines, on the CPU, to check the wiring.

After each family ``WORKSPACE/gpu_family_iteration.json`` is rewritten with the families measured so
far, and that family's folders (the pipeline and each stage's merged final weights: 22 GiB each for FLUX
in bf16) are deleted. Sized for a 141 GB H200; on an 80 GB GPU keep ``--train-batch-size`` at 1 for FLUX.
"""

from __future__ import annotations

import argparse
import gc
import json
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from prepared import folder_stage_spec, unit_seconds
from torch.utils.flop_counter import FlopCounterMode

from flowpost.core.config.schema import StageConfig
from flowpost.core.io import write_json_atomic
from flowpost.core.trainers.spec import StageSpec
from flowpost.data.condition_cache import update_condition_cache
from flowpost.data.records import Demonstration
from flowpost.data.shards import write_shards
from flowpost.stage import build_trainer

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import tiny_flux1_pipeline as flux1  # noqa: E402
import tiny_sd3_pipeline as sd3  # noqa: E402

FINGERPRINT = "bench-gpu-family-encoders"
PROMPTS = sd3.CORPUS[:4]
SHAPES = Path(__file__).resolve().parents[1] / "docs" / "shapes"  # the released models' component configs
SHAPE_FOLDERS = {"sd3": "sd3.5-medium", "flux1": "flux1-dev"}
TRANSFORMERS = {"sd3": "SD3Transformer2DModel", "flux1": "FluxTransformer2DModel"}
NARROW_VAE = {"block_out_channels": (8, 8, 8, 8), "layers_per_block": 1, "norm_num_groups": 8}  # its 8x, 16 ch
TEXT_TOKENS = {"sd3": 256, "flux1": 512}  # T5 tokens: each stock pipeline's max_sequence_length
CLIP_TOKENS = 77


def shape_config(family: str, component: str, name: str = "config.json") -> dict[str, Any]:
    """The released ``family`` model's ``component`` config (``docs/shapes``)."""
    return json.loads((SHAPES / SHAPE_FOLDERS[family] / component / name).read_text())


def full_size_transformer(family: str, *, resolution: int) -> Any:
    """``family``'s released transformer shape with random weights, on the current default device."""
    import diffusers

    config = shape_config(family, "transformer")
    if family == "sd3":  # SD3's default size is its sample_size; its position embedding covers 384 patches
        config["sample_size"] = resolution // 8
    return getattr(diffusers, TRANSFORMERS[family]).from_config(config)


def build_real_shaped(family: str, folder: Path, *, resolution: int, device: torch.device) -> Path:
    """``family``'s pipeline with its full-size random transformer (built on ``device`` in bf16) saved to
    ``folder``; text encoders and VAE one layer deep at the real widths."""
    import diffusers

    clip, t5 = sd3.clip_tokenizer(CLIP_TOKENS), sd3.t5_tokenizer()
    t5.model_max_length = TEXT_TOKENS[family]
    with torch.device(device):
        transformer = full_size_transformer(family, resolution=resolution).to(torch.bfloat16)
    vae = diffusers.AutoencoderKL.from_config(shape_config(family, "vae"), **NARROW_VAE)
    scheduler = diffusers.FlowMatchEulerDiscreteScheduler.from_config(
        shape_config(family, "scheduler", "scheduler_config.json")
    )
    if family == "sd3":
        pipeline = diffusers.StableDiffusion3Pipeline(
            transformer=transformer,
            scheduler=scheduler,
            vae=vae,
            text_encoder=sd3.clip_encoder(768, len(clip), max_length=CLIP_TOKENS),
            tokenizer=clip,
            text_encoder_2=sd3.clip_encoder(1280, len(clip), max_length=CLIP_TOKENS),
            tokenizer_2=clip,
            text_encoder_3=sd3.t5_encoder(len(t5), width=4096),
            tokenizer_3=t5,
        )
    else:
        pipeline = diffusers.FluxPipeline(
            transformer=transformer,
            scheduler=scheduler,
            vae=vae,
            text_encoder=sd3.clip_encoder(768, len(clip), projection=False, max_length=CLIP_TOKENS),
            tokenizer=clip,
            text_encoder_2=sd3.t5_encoder(len(t5), width=4096),
            tokenizer_2=t5,
        )
    pipeline.save_pretrained(folder)
    return folder


def model_section(family: str, folder: Path, *, shape: str, resolution: int, lora_rank: int) -> dict[str, Any]:
    """The stage's ``model:`` on ``folder``: bf16 weights for the real shape, LoRA on the family's targets."""
    options = {"resolution": resolution if shape == "real" else flux1.RESOLUTION} if family == "flux1" else {}
    model: dict[str, Any] = {"family": family, "pretrained": str(folder), "options": options}
    model["lora"] = {"rank": lora_rank, "alpha": 2 * lora_rank}
    if shape == "real":
        model["torch_dtype"] = "bfloat16"
    return model


def prepare(root: Path, family: str, args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """Pipeline folder, prompt records and their condition cache under an emptied ``root``; the model section."""
    from flowpost.core.models.pretrained import PretrainedSource
    from flowpost.core.models.registry import adapter_class

    shutil.rmtree(root, ignore_errors=True)
    folder = root / "pipeline"
    if args.shape == "real":
        build_real_shaped(family, folder, resolution=args.resolution, device=device)
    else:
        (sd3.build_tiny_sd3_pipeline if family == "sd3" else flux1.build_tiny_flux1_pipeline)(folder)
    model = model_section(family, folder, shape=args.shape, resolution=args.resolution, lora_rank=args.lora_rank)
    image = np.zeros((3, 8, 8), dtype=np.float32)  # rollouts read only the prompts
    records = [Demonstration(key=f"p{i}", prompt=prompt, image=image) for i, prompt in enumerate(PROMPTS)]
    write_json_atomic(root / "data" / "train" / "manifest.json", write_shards(records, root / "data" / "train"))
    max_length = TEXT_TOKENS[family] if args.shape == "real" else sd3.T5_LENGTH
    encoder = adapter_class(family).prompt_encoder(PretrainedSource(str(folder)), max_length=max_length)
    try:  # the text encoders alone, as the conditions node loads them
        update_condition_cache(
            root / "conditions", ["", *PROMPTS], encoder_fingerprint=FINGERPRINT, encode=encoder.encode
        )
    finally:
        encoder.release()
    return model


def stage_spec(
    root: Path, out: Path, family: str, model: dict[str, Any], args: argparse.Namespace, *, lr: float = 3e-4
) -> StageSpec:
    """A GRPO stage of ``args.iterations`` iterations at ``lr``, one prompt of ``args.group`` rollouts each."""
    stage = StageConfig.model_validate(
        {
            "trainer": "grpo",
            "model": model,
            "sampling": {
                "dynamics": "flow-sde",
                "steps": args.steps,
                "noise_level": 0.7,
                "guidance": 4.5 if family == "sd3" else 1.0,
                "window": 2,
            },
            "rewards": [{"name": "jpeg_incompressibility"}],
            "train": {
                "lr": lr,
                "iterations": args.iterations,
                "prompts_per_iteration": 1,
                "group_size": args.group,
                "rollout_batch_size": args.group,
                "train_batch_size": args.train_batch_size,
                "log_every": 1,
                "checkpoint_every": 0,
            },
            "launch": {"mixed_precision": "bf16" if args.shape == "real" else "no"},
        }
    )
    return folder_stage_spec(stage, root, out, name="grpo", fingerprint=FINGERPRINT)


def measure(workspace: Path, family: str, args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """Build ``family``'s pipeline, time its iterations, count one iteration's FLOPs; its JSON entry."""
    root = workspace / "gpu_family_iteration" / family
    started = time.perf_counter()
    model = prepare(root, family, args, device)
    prepared_s = time.perf_counter() - started
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    trainer = build_trainer(stage_spec(root, root / "timed", family, model, args))
    parameters = sum(p.numel() for p in trainer.adapter.module().parameters())
    trainable = sum(p.numel() for p in trainer.trainable)
    trainer.start()
    seconds = unit_seconds(root / "timed" / "events.jsonl")
    peak = torch.cuda.max_memory_allocated(device) if cuda else None
    del trainer
    release(root / "timed", cuda)
    counter = FlopCounterMode(display=False)
    with counter:  # one iteration, rollouts and training alike
        once = argparse.Namespace(**{**vars(args), "iterations": 1})
        build_trainer(stage_spec(root, root / "counted", family, model, once)).start()
    flops = counter.get_total_flops()
    release(root, cuda)
    median = statistics.median(seconds) if seconds else float("nan")
    mfu = flops / (median * args.peak_tflops * 1e12)
    memory = f"{peak / 2**30:.1f} GiB peak" if peak is not None else "peak memory not tracked on the CPU"
    print(
        f"{family}: {parameters / 1e6:,.1f} M parameters ({trainable / 1e6:,.2f} M trained), iteration "
        f"{median:.3f} s (median of {len(seconds)}), {memory}, {flops / 1e12:,.3f} TFLOP per iteration, "
        f"MFU {mfu:.2%} of {args.peak_tflops:g} TFLOPS",
        flush=True,
    )
    return {
        "device": torch.cuda.get_device_name(device) if cuda else "cpu",
        "shape": args.shape,
        "parameters": parameters,
        "trainable_parameters": trainable,
        "resolution": args.resolution if args.shape == "real" else None,
        "group_size": args.group,
        "train_batch_size": args.train_batch_size,
        "sampling_steps": args.steps,
        "lora_rank": args.lora_rank,
        "iteration_seconds": seconds,
        "median_iteration_s": median,
        "peak_memory_bytes": peak,
        "flops_per_iteration": flops,
        "peak_tflops": args.peak_tflops,
        "mfu": mfu,
        "prepare_s": prepared_s,
    }


def release(folder: Path, cuda: bool) -> None:
    """Delete ``folder`` and give the freed memory back (the next stage loads the weights again)."""
    shutil.rmtree(folder, ignore_errors=True)
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workspace", type=Path, default=Path("bench-ws"))
    parser.add_argument("--families", nargs="+", choices=["sd3", "flux1"], default=["sd3", "flux1"])
    parser.add_argument("--shape", choices=["real", "tiny"], default="real")
    parser.add_argument("--resolution", type=int, default=512, help="image side in pixels (--shape real)")
    parser.add_argument("--group", type=int, default=8, help="rollouts of the iteration's one prompt")
    parser.add_argument("--lora-rank", type=int, default=32)
    parser.add_argument("--steps", type=int, default=10, help="Flow-SDE sampling steps per rollout")
    parser.add_argument("--train-batch-size", type=int, default=2, help="samples per training micro-batch")
    parser.add_argument("--iterations", type=int, default=3, help="GRPO iterations; the first is not timed")
    parser.add_argument("--peak-tflops", type=float, default=989.0, help="the device's bf16 dense peak")
    args = parser.parse_args(argv)
    if args.iterations < 2 or args.group < 2 or args.steps < 3 or args.resolution % 16:
        parser.error(
            "--iterations and --group must be at least 2, --steps at least 3 (2 trained), --resolution a multiple of 16"
        )
    if args.group % args.train_batch_size:
        parser.error(f"--train-batch-size {args.train_batch_size} must divide --group {args.group}")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if args.shape == "real" and device.type != "cuda":
        parser.error("--shape real needs a CUDA device (a full-size transformer); use --shape tiny here")
    results: dict[str, Any] = {}
    for family in args.families:  # written after each: a later family's failure keeps the earlier ones
        results[family] = measure(args.workspace, family, args, device)
        write_json_atomic(args.workspace / "gpu_family_iteration.json", results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
