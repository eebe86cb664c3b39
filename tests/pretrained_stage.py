"""The tiny pipeline with its SFT stage training a given model, and that stage's adapter built as a rank builds it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flowpost.core.config.loading import validate_pipeline
from flowpost.core.trainers.spec import StageSpec
from flowpost.stage import build_adapter


def with_model(tiny_pipeline, model: dict[str, Any]) -> dict[str, Any]:
    """The tiny pipeline training ``model``; a pretrained one reads a cache of its own family's encoders."""
    config = tiny_pipeline()
    config["stages"]["sft"]["model"] = model
    if "pretrained" in model:
        encoders = {"family": model["family"], "pretrained": model["pretrained"]}
        config["conditions"]["own"] = {"model": encoders, "datasets": ["digits"]}
        config["stages"]["sft"]["data"]["conditions"] = "own"
    return config


def sft_adapter(config: dict[str, Any], out_dir: Path) -> Any:
    """The adapter of ``config``'s SFT stage, built by ``flowpost.stage.build_adapter``."""
    stage = validate_pipeline(config).stages["sft"]
    return build_adapter(stage, StageSpec(stage="sft", seed=0, config={}, output_dir=str(out_dir)))


def shrunk_example(
    config: dict[str, Any],
    folder: Path,
    prompts: Path,
    *,
    conditions: str,
    stage: str,
    max_length: int,
    resolution: int,
) -> dict[str, Any]:
    """A real-weights image example's ``config`` pointed at the tiny pipeline ``folder`` and the prompt file
    ``prompts``: smoke budgets, LoRA rank 4, fp32, a reward without a checkpoint; the stage's sampling and
    train budgets are the caller's."""
    config["smoke"] = True
    config["datasets"]["prompts"]["path"] = str(prompts)
    config["conditions"][conditions].update(max_length=max_length)
    config["conditions"][conditions]["model"]["pretrained"] = str(folder)
    trained = config["stages"][stage]
    model = {"pretrained": str(folder), "torch_dtype": "float32"}
    trained["model"].update(
        model, lora={"rank": 4, "alpha": 8}, options={**trained["model"]["options"], "resolution": resolution}
    )
    trained["rewards"] = [{"name": "jpeg_incompressibility"}]  # PickScore needs its checkpoint
    trained["launch"] = {"mixed_precision": "no"}
    return config
