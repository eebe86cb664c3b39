"""Node ``export``: a diffusers folder plus manifest, provenance and a model card."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from flowpost.core.io import read_json, write_bytes_atomic, write_json_atomic
from flowpost.core.models.base import ADAPTER_FILE, LORA_BASE_DIR, LORA_DIR
from flowpost.core.models.kohya_layouts import KOHYA_LAYOUTS
from flowpost.core.models.kohya_lora import save_kohya_lora
from flowpost.core.models.lora import LORA_WEIGHTS
from flowpost.core.models.registry import load_adapter
from flowpost.core.models.text_encoders import encoder_package
from flowpost.core.provenance import git_state, library_versions
from flowpost.errors import FlowpostError
from flowpost.tasks.guard_record import describe_guard, guard_outcome, read_guard_record
from flowpost.tasks.weights import stage_weights

EXPORT_MANIFEST = "export.json"
KOHYA_LORA_FILE = "lora_kohya.safetensors"


def export_stage(
    *,
    stage: str,
    train_dir: Path,
    out_dir: Path,
    weights: str,
    resolved_config: dict[str, Any],
    fingerprints: dict[str, str],
    metrics: dict[str, Any] | None = None,
    formats: tuple[str, ...] = ("diffusers",),
) -> dict[str, Any]:
    """Copy a stage's weights to ``out_dir`` and describe them: ``transformer/`` (LoRA merged) loads with
    diffusers' ``from_pretrained``, ``lora/`` (when the stage trained LoRA) with ``load_lora_weights``, with
    the ``pipeline`` format the folder itself with ``DiffusionPipeline.from_pretrained``, and with the ``kohya``
    format ``lora_kohya.safetensors`` in ComfyUI and kohya-based tools (and ``load_lora_weights``). A pretrained
    family's ``scheduler/`` comes along, so ``flowpost sample`` needs only the VAE and text encoders of the
    source pipeline (none with the ``pipeline`` format)."""
    source, used = stage_weights(train_dir, weights)
    for part in ("transformer", "transformer_2", "scheduler", LORA_DIR, f"{LORA_DIR}_2", LORA_BASE_DIR):
        if (out_dir / part).exists():
            shutil.rmtree(out_dir / part)
        if (source / part).is_dir():
            shutil.copytree(source / part, out_dir / part)
    if "pipeline" in formats:
        load_adapter(source).save_pipeline(out_dir)
    adapter = read_json(source / ADAPTER_FILE, what="model adapter manifest")
    write_json_atomic(out_dir / ADAPTER_FILE, adapter)
    progress = read_json(train_dir / "final" / "progress.json", what="stage progress")
    (out_dir / KOHYA_LORA_FILE).unlink(missing_ok=True)
    if "kohya" in formats:
        _write_kohya_lora(out_dir, adapter, stage=stage, step=progress["optimizer_step"])
    guard = read_guard_record(train_dir)
    manifest = {
        "stage": stage,
        "weights": used,
        "step": progress["optimizer_step"],
        "formats": list(formats),
        "model": adapter,
        "encoder": {
            "name": adapter["encoder"],
            "package": encoder_package(adapter["encoder"]) or "the pipeline's text encoders",
            "max_length": adapter.get("encoder_max_length"),
            "fingerprint": _encoder_fingerprint(train_dir),
        },
        "encoder_max_length": adapter.get("encoder_max_length"),
        "schedule": adapter["schedule"],
        "metrics": metrics or {},
        **({"guard": guard_outcome(guard)} if guard is not None else {}),
        "provenance": {
            "git": git_state(),
            "versions": library_versions(),
            "fingerprints": fingerprints,
            "config": resolved_config,
        },
    }
    write_json_atomic(out_dir / EXPORT_MANIFEST, manifest)
    write_bytes_atomic(out_dir / "README.md", model_card(manifest).encode())
    return manifest


def _write_kohya_lora(out_dir: Path, adapter: dict[str, Any], *, stage: str, step: int) -> None:
    """``lora/`` again as one file in the family's kohya layout, its header naming the stage and step."""
    lora, layout = adapter.get("trained_with_lora"), KOHYA_LAYOUTS.get(adapter["family"])
    if not lora or layout is None:
        raise FlowpostError(
            f"'kohya' needs a LoRA stage of a family with a kohya layout; stage {stage!r} trains "
            f"{adapter['family']!r}{' with LoRA' if lora else ' without LoRA'}",
            where="export.formats",
        )
    save_kohya_lora(
        out_dir / LORA_DIR / LORA_WEIGHTS,
        out_dir / KOHYA_LORA_FILE,
        layout,
        rank=lora["rank"],
        alpha=lora["alpha"],
        metadata={"flowpost.family": adapter["family"], "flowpost.stage": stage, "flowpost.step": str(step)},
    )


def _encoder_fingerprint(train_dir: Path) -> str | None:
    """The fingerprint of the condition encoder the stage trained with (from its stage spec)."""
    spec_path = train_dir / "stage.json"
    if not spec_path.is_file():
        return None
    spec = read_json(spec_path, what="stage spec")
    return (spec.get("extra") or {}).get("encoder", {}).get("fingerprint") or spec.get("encoder_fingerprint")


def model_card(manifest: dict[str, Any]) -> str:
    model, metrics = manifest["model"], manifest["metrics"]
    lines = [
        f"# {manifest['provenance']['config'].get('name', 'flowpost')} — stage `{manifest['stage']}`",
        "",
        f"A `{model['family']}` flow-matching transformer ({manifest['weights']} weights after "
        f"{manifest['step']} optimizer steps), trained with flowpost.",
        "",
        f"- Transformer: `transformer/` (diffusers `{_transformer_class(model)}.from_pretrained`)",
        *(
            ["- Low-noise expert: `transformer_2/` (the pipeline's `transformer_2`, the same class)"]
            if "boundary_ratio" in model
            else []
        ),
        *_lora_lines(model),
        *(
            ["- Pipeline: this folder (`DiffusionPipeline.from_pretrained`)"]
            if "pipeline" in manifest["formats"]
            else []
        ),
        *(
            [
                f"- LoRA for ComfyUI and kohya-based tools: `{KOHYA_LORA_FILE}` (kohya key layout, the original "
                "checkpoint's module names; `pipe.load_lora_weights` loads it too)"
            ]
            if "kohya" in manifest["formats"]
            else []
        ),
        f"- Text encoder: {manifest['encoder']['name']} (package `{manifest['encoder']['package']}`, "
        f"max length {manifest['encoder']['max_length']} tokens)",
        f"- Output codec: {model['output_codec']}",
        f"- Schedule: flow matching, {_shift_words(model['schedule'])}, velocity = noise - x0",
        f'- Sample: `flowpost sample {{this folder}} --prompt "your prompt" -n 16 --out {_sample_file(model)}`',
    ]
    if "guard" in manifest:
        lines += ["", f"Guard: {describe_guard(manifest['stage'], manifest['guard'])}."]
    if metrics:
        lines += ["", "## Evaluation", "", "| metric | value |", "| --- | --- |"]
        lines += [f"| {k} | {metrics[k]} |" for k in ("adherence", "reward_mean", "fd", "n_samples") if k in metrics]
    git = manifest["provenance"]["git"]
    lines += ["", f"Built from commit `{git['commit']}` (dirty: {git['dirty']}).", ""]
    return "\n".join(lines)


def _lora_lines(model: dict[str, Any]) -> list[str]:
    """How to load ``lora/``: into the stock pipeline (a pretrained family) or into the base transformer."""
    lora = model.get("trained_with_lora")
    if not lora:
        return []
    line = f"- LoRA (rank {lora['rank']}, alpha {lora['alpha']}): `lora/`, diffusers' LoRA format; "
    if "experts" in lora:
        return _expert_lora_lines(model, lora)
    if lora.get("base") == "pretrained":
        return [line + f'`pipe.load_lora_weights("lora")` on the stock pipeline `{model["pretrained"]["path"]}`']
    return [
        line + f"on the weights in `{lora.get('base')}/` (`{_transformer_class(model)}.from_pretrained`): "
        '`transformer.load_lora_adapter("lora", prefix="transformer", use_safetensors=True)`'
    ]


def _expert_lora_lines(model: dict[str, Any], lora: dict[str, Any]) -> list[str]:
    """How to load a two-expert model's adapters: ``lora/`` into ``transformer``, ``lora_2/`` into ``transformer_2``."""
    calls = {
        "high": 'pipe.load_lora_weights("lora")',
        "low": 'pipe.load_lora_weights("lora_2", load_into_transformer_2=True)',
    }
    folders = {"high": "`lora/` (high-noise expert)", "low": "`lora_2/` (low-noise expert)"}
    trained = [expert for expert in ("high", "low") if expert in lora["experts"]]
    line = f"- LoRA (rank {lora['rank']}, alpha {lora['alpha']}): {' and '.join(folders[e] for e in trained)}; "
    if lora.get("base") == "pretrained":
        steps = "; ".join(f"`{calls[e]}`" for e in trained)
        return [line + f"{steps} on the stock pipeline `{model['pretrained']['path']}`"]
    return [line + f"on the unmerged weights of each adapted expert in `{lora.get('base')}/`"]


def _shift_words(schedule: dict[str, Any]) -> str:
    """The sigma shift: constant, or dynamic (``mu`` from the image token count) with unshifted training sigmas."""
    dynamic = schedule.get("dynamic_shift")
    if not dynamic:
        return f"shift {schedule['shift']}"
    if "mu" in dynamic:  # a family's own rule (FLUX.2's empirical fit), in words
        return f"sampling shifted by mu from {dynamic['mu']}, training sigmas shift {schedule['shift']}"
    return (
        f"sampling shifted by mu from the image token count (base_shift {dynamic['base_shift']} at "
        f"{dynamic['base_seq_len']} tokens, max_shift {dynamic['max_shift']} at {dynamic['max_seq_len']}), "
        f"training sigmas shift {schedule['shift']}"
    )


def _sample_file(model: dict[str, Any]) -> str:
    """What ``flowpost sample`` writes for the model's media: an mp4 of videos, else a PNG grid."""
    return "sample.mp4" if model.get("media") == "video" else "grid.png"


def _transformer_class(model: dict[str, Any]) -> str:
    """The diffusers class of ``transformer/``: the manifest's, else the SD3 transformer the tiny family uses."""
    return model.get("transformer_class", "SD3Transformer2DModel")
