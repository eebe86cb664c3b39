"""The tiny pipeline with its SFT stage training a given model, and that stage's adapter built as a rank builds it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flowpost.core.config.loading import validate_pipeline
from flowpost.core.trainers.spec import StageSpec
from flowpost.stage import build_adapter

RGB_FOLDER = Path(__file__).parent / "data" / "folder"  # captioned shapes, made RGB for a VAE's 3 channels


def with_model(tiny_pipeline, model: dict[str, Any]) -> dict[str, Any]:
    """The tiny pipeline training ``model``; a pretrained one (a VAE family) trains on the RGB shapes folder
    through a cache of its own family's encoders."""
    config = tiny_pipeline()
    config["stages"]["sft"]["model"] = model
    if "pretrained" in model:
        shapes = {"source": "image-folder", "path": str(RGB_FOLDER), "preprocess": {"mode": "rgb"}}
        config["datasets"]["shapes"] = shapes
        encoders = {"family": model["family"], "pretrained": model["pretrained"]}
        config["conditions"]["own"] = {"model": encoders, "datasets": ["shapes"]}
        config["stages"]["sft"]["data"] = {"dataset": "shapes", "conditions": "own"}
    return config


def sft_adapter(config: dict[str, Any], out_dir: Path) -> Any:
    """The adapter of ``config``'s SFT stage, built by ``flowpost.stage.build_adapter``."""
    stage = validate_pipeline(config).stages["sft"]
    return build_adapter(stage, StageSpec(stage="sft", seed=0, config={}, output_dir=str(out_dir)))


TINY_ROLLOUTS = {"iterations": 1, "prompts_per_iteration": 2, "group_size": 2, "rollout_batch_size": 4}
JPEG = [{"name": "jpeg_incompressibility"}]  # a reward without a checkpoint (PickScore needs its own)


def shrunk_example(
    config: dict[str, Any],
    folder: Path,
    tmp_path: Path,
    *,
    conditions: str,
    stage: str,
    max_length: int,
    options: dict[str, Any] | None = None,
    rewards: list[dict[str, Any]] = JPEG,
) -> dict[str, Any]:
    """A real-weights example's ``config`` pointed at the tiny pipeline ``folder`` and a prompt file of four
    corpus prompts written in ``tmp_path``: smoke budgets, LoRA rank 4, fp32, ``rewards``, the family's
    ``options`` over the example's; the stage's sampling and train budgets are the caller's."""
    from tiny_sd3_pipeline import CORPUS

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(CORPUS[:4]) + "\n")
    config["smoke"] = True
    config["datasets"]["prompts"]["path"] = str(prompts)
    config["conditions"][conditions].update(max_length=max_length)
    config["conditions"][conditions]["model"]["pretrained"] = str(folder)
    trained = config["stages"][stage]
    trained["model"].update(pretrained=str(folder), torch_dtype="float32", lora={"rank": 4, "alpha": 8})
    if options:
        trained["model"]["options"] = {**trained["model"].get("options", {}), **options}
    trained["rewards"] = rewards
    trained["launch"] = {"mixed_precision": "no"}
    return config
