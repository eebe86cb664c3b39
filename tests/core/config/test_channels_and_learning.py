"""``flowpost validate`` refuses images whose channels the stage's codec cannot take (a grayscale dataset for an
RGB VAE, RGB images for the one-channel tiny transformer), and warns, with exit 0, about runs that validate but
cannot learn: groups of one sample, rewards of weight 0, LoRA ranks above the width of the layers they adapt."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import yaml
from cli_main import flowpost_main
from tiny_flux1_pipeline import RESOLUTION

from flowpost.core.config.loading import default_pipeline_path, load_pipeline, validate_pipeline
from flowpost.errors import FlowpostError

FOLDER = Path(__file__).parents[2] / "data" / "folder"  # captioned shapes, for image-folder datasets
OPTIONS: dict[str, dict[str, Any]] = {
    "sd3": {},
    "flux1": {"resolution": RESOLUTION},
    "flux2": {"resolution": RESOLUTION},
    "qwen-image": {},
    "wan2": {},
    "z-image": {"resolution": RESOLUTION},
}
DIGITS = str(default_pipeline_path())


@pytest.fixture(params=sorted(OPTIONS))
def family_dir(request: pytest.FixtureRequest) -> tuple[str, Path]:
    return request.param, request.getfixturevalue(f"{request.param.replace('-', '_')}_pipeline_dir")


def _shapes(tiny_pipeline, model: dict[str, Any], mode: str) -> dict[str, Any]:
    """The tiny pipeline's SFT stage training ``model`` on the shapes folder, preprocessed in ``mode``."""
    config = tiny_pipeline()
    config["datasets"]["shapes"] = {"source": "image-folder", "path": str(FOLDER), "preprocess": {"mode": mode}}
    config["stages"]["sft"]["model"] = model
    config["stages"]["sft"]["data"]["dataset"] = "shapes"
    if "pretrained" in model:
        encoders = {"family": model["family"], "pretrained": model["pretrained"]}
        config["conditions"]["own"] = {"model": encoders, "datasets": ["digits", "shapes"], "max_length": 8}
        config["stages"]["sft"]["data"]["conditions"] = "own"
    else:
        config["conditions"]["minilm"]["datasets"] = ["digits", "shapes"]
    return config


def _refused(config: dict[str, Any]) -> str:
    with pytest.raises(FlowpostError) as info:
        validate_pipeline(config)
    return str(info.value)


def test_a_grayscale_dataset_for_an_rgb_vae_is_refused_naming_the_mode(
    tiny_pipeline, family_dir: tuple[str, Path]
) -> None:
    family, folder = family_dir
    model = {"family": family, "pretrained": str(folder), "options": OPTIONS[family]}
    message = _refused(_shapes(tiny_pipeline, model, "grayscale"))
    assert "datasets.shapes.preprocess.mode: grayscale makes 1-channel images, and stage 'sft'" in message, message
    assert f"the VAE of family {family!r} ({folder / 'vae'}: in_channels 3)" in message, message
    assert message.endswith("set datasets.shapes.preprocess.mode: rgb"), message
    validate_pipeline(_shapes(tiny_pipeline, model, "rgb"))  # what the message asks for validates


def test_the_digits_for_an_rgb_vae_are_refused_before_anything_runs(
    tiny_pipeline, family_dir: tuple[str, Path]
) -> None:
    family, folder = family_dir
    config = tiny_pipeline()
    config["stages"]["sft"]["model"] = {"family": family, "pretrained": str(folder), "options": OPTIONS[family]}
    config["conditions"]["own"] = {"model": {"family": family, "pretrained": str(folder)}, "datasets": ["digits"]}
    config["stages"]["sft"]["data"]["conditions"] = "own"
    message = _refused(config)
    assert "stages.sft.data.dataset: 'digits' (builtin-digits) holds 1-channel images, and stage 'sft'" in message, (
        message
    )
    assert f"the VAE of family {family!r} ({folder / 'vae'}: in_channels 3)" in message, message
    assert message.endswith("train on an image dataset with preprocess.mode: rgb"), message


def test_a_latent_cache_encoding_grayscale_images_with_an_rgb_vae_is_refused(tiny_pipeline, sd3_pipeline_dir) -> None:
    config = _shapes(tiny_pipeline, {"family": "tiny-sd3"}, "grayscale")
    config["latents"] = {"lat": {"dataset": "shapes", "model": {"family": "sd3", "pretrained": str(sd3_pipeline_dir)}}}
    message = _refused(config)
    assert "datasets.shapes.preprocess.mode: grayscale makes 1-channel images, and latent cache 'lat'" in message
    assert message.endswith("set datasets.shapes.preprocess.mode: rgb"), message


def test_rgb_images_for_the_one_channel_tiny_transformer_are_refused(tiny_pipeline) -> None:
    message = _refused(_shapes(tiny_pipeline, {"family": "tiny-sd3"}, "rgb"))
    assert "datasets.shapes.preprocess.mode: rgb makes 3-channel images" in message, message
    assert "the transformer of family 'tiny-sd3' (in_channels 1, in pixel space)" in message, message
    assert message.endswith("set datasets.shapes.preprocess.mode: grayscale"), message
    validate_pipeline(_shapes(tiny_pipeline, {"family": "tiny-sd3"}, "grayscale"))


def test_the_digits_for_a_three_channel_tiny_transformer_name_the_stages_dataset(tiny_pipeline) -> None:
    config = tiny_pipeline()
    config["stages"]["sft"]["model"]["transformer"].update(in_channels=3, out_channels=3)
    message = _refused(config)
    assert "stages.sft.data.dataset: 'digits' (builtin-digits) holds 1-channel images" in message, message
    assert "(in_channels 3, in pixel space); train on an image dataset with preprocess.mode: rgb" in message


def test_a_stage_starting_from_another_is_checked_against_that_stages_network(tiny_pipeline) -> None:
    rgb = {"family": "tiny-sd3", "transformer": {"in_channels": 3, "out_channels": 3}}
    config = _shapes(tiny_pipeline, rgb, "rgb")
    validate_pipeline(config)
    config["stages"]["more"] = {**config["stages"]["sft"], "model": {"family": "tiny-sd3", "init": "sft"}}
    config["stages"]["more"]["data"] = {"dataset": "digits", "conditions": "minilm"}  # one channel: not sft's three
    message = _refused(config)
    assert "stages.more.data.dataset: 'digits' (builtin-digits) holds 1-channel images, and stage 'more'" in message
    assert "the transformer of family 'tiny-sd3' (in_channels 3, in pixel space)" in message, message


def test_validate_exits_1_on_the_grayscale_dataset(
    tiny_pipeline, sd3_pipeline_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    config = _shapes(tiny_pipeline, {"family": "sd3", "pretrained": str(sd3_pipeline_dir)}, "grayscale")
    Path("pipeline.yaml").write_text(yaml.safe_dump(config))
    outcome = flowpost_main("validate", "pipeline.yaml")
    assert outcome.code == 1 and "Traceback" not in outcome.stderr, outcome
    assert "datasets.shapes.preprocess.mode: grayscale makes 1-channel images" in outcome.stderr


@pytest.mark.parametrize(
    ("overrides", "warning"),
    [
        (
            ["stages.grpo.train.group_size=1"],
            "warning: stages.grpo.train.group_size: 1 puts each prompt's sample in a group of its own, and trainer "
            "'grpo' learns from the reward differences inside a group (group-normalised advantages), so every "
            "advantage is 0",
        ),
        (
            ["stages.grpo.rewards=[{name: digit_adherence, weight: 0}]"],
            "warning: stages.grpo.rewards: every reward has weight 0, so every sample's total reward is 0 and "
            "stage 'grpo' cannot learn",
        ),
        (
            ["stages.grpo.rewards=[{name: digit_adherence}, {name: jpeg_compressibility, weight: 0}]"],
            "warning: stages.grpo.rewards.1.weight: 0, so 'jpeg_compressibility' is computed for every sample and "
            "adds nothing",
        ),
        (
            ["stages.sft.model.lora={rank: 129}"],
            "warning: stages.sft.model.lora.rank: 129 is above the width 128 of the narrowest layer it adapts "
            "(transformer_blocks.0.attn.",
        ),
        (
            ["stages.sft.model.lora={rank: 100000}", "stages.grpo.train.group_size=1"],
            "warning: stages.sft.model.lora.rank: 100000 is above the width 128",
        ),
    ],
    ids=["group-of-one", "all-weights-0", "one-weight-0", "rank-129", "rank-100000"],
)
@pytest.mark.parametrize("command", ["validate", "plan"])
def test_validate_and_plan_warn_about_runs_that_cannot_learn_and_exit_0(
    tmp_path: Path, command: str, overrides: list[str], warning: str
) -> None:
    sets = [argument for override in overrides for argument in ("--set", override)]
    workspace = ["--workspace", str(tmp_path / "ws")] if command == "plan" else []
    outcome = flowpost_main(command, DIGITS, *sets, *workspace)
    assert outcome.code == 0, outcome
    assert warning in outcome.stdout, outcome.stdout
    assert not (tmp_path / "ws").exists()


@pytest.mark.parametrize("command", ["validate", "plan"])
def test_the_default_pipeline_and_a_low_rank_draw_no_warning(tmp_path: Path, command: str) -> None:
    workspace = ["--workspace", str(tmp_path / "ws")] if command == "plan" else []
    outcome = flowpost_main(command, DIGITS, "--set", "stages.sft.model.lora={rank: 128}", *workspace)
    assert outcome.code == 0 and "warning" not in outcome.stdout + outcome.stderr, outcome


def test_trainers_that_use_no_reward_groups_draw_no_group_warning() -> None:
    warnings: list[str] = []
    load_pipeline(Path(DIGITS).parents[2] / "examples" / "digits-opd.yaml", warnings=warnings)  # group_size 1
    assert warnings == []


def test_the_warnings_are_logged_when_a_run_loads_the_pipeline(caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("flowpost.core.config.loading")
    logger.addHandler(caplog.handler)  # the flowpost loggers may not propagate to the root
    try:
        load_pipeline(None, ["stages.grpo.train.group_size=1"])
    finally:
        logger.removeHandler(caplog.handler)
    [record] = {id(record): record for record in caplog.records}.values()  # once, through either route
    assert record.levelno == logging.WARNING
    assert f"{DIGITS}: stages.grpo.train.group_size: 1 puts each prompt's sample" in record.getMessage()


def test_a_lora_rank_above_a_real_familys_narrowest_layer_is_warned_about(tiny_pipeline, sd3_pipeline_dir) -> None:
    def warnings(rank: int, targets: list[str] | None = None) -> list[str]:
        config = _shapes(tiny_pipeline, {"family": "sd3", "pretrained": str(sd3_pipeline_dir)}, "rgb")
        config["stages"]["sft"]["model"]["lora"] = {"rank": rank, "targets": targets}
        found: list[str] = []
        validate_pipeline(config, warnings=found)
        return found

    assert warnings(16) == []  # 2 heads x 8 dimensions: every attention projection is 16 wide
    [warning] = warnings(17)
    assert warning.startswith("stages.sft.model.lora.rank: 17 is above the width 16 of the narrowest layer"), warning
    assert warning.endswith("use a rank of at most 16 (e.g. 8 to 64)")
    [warning] = warnings(17, targets=["proj_out"])  # the targets chosen are the layers measured
    assert "the narrowest layer it adapts (proj_out)" in warning, warning


def test_wan22s_patchifying_vae_takes_rgb_and_refuses_grayscale(tmp_path: Path, tiny_pipeline) -> None:
    """Wan2.2-TI2V-5B's published VAE declares in_channels 12: RGB in 2x2 patches, which it folds itself."""
    import shutil

    shapes = Path(__file__).parents[3] / "docs" / "shapes" / "wan2.2-ti2v-5b"
    folder = tmp_path / "wan22"
    shutil.copytree(shapes, folder)
    model = {"family": "wan2", "pretrained": str(folder), "options": {"height": 64, "width": 64, "num_frames": 5}}
    validate_pipeline(_shapes(tiny_pipeline, model, "rgb"))
    message = _refused(_shapes(tiny_pipeline, model, "grayscale"))
    assert f"({folder / 'vae'}: in_channels 12, 2x2 patches of 3)" in message, message
