"""``stages.NAME.offload``: refused by validation where it names nothing the stage holds or cannot work, naming the
path and the fix; left out of the params unset and out of every fingerprint (results do not change)."""

from __future__ import annotations

from typing import Any

import pytest

from flowpost.core.config.loading import validate_pipeline
from flowpost.errors import FlowpostError
from flowpost.tasks.graph import build_nodes, fingerprints

WHERE = "stages.sft.offload"


def _offloading(tiny_pipeline, *offload: str, **stage: Any) -> dict[str, Any]:
    config = tiny_pipeline()
    config["stages"]["sft"].update(offload=list(offload), **stage)
    return config


def _refusal(config: dict[str, Any]) -> str:
    with pytest.raises(FlowpostError) as caught:
        validate_pipeline(config)
    return str(caught.value)


def test_an_offloaded_snapshot_the_stage_holds_validates_and_changes_no_fingerprint(tiny_pipeline) -> None:
    assert validate_pipeline(_offloading(tiny_pipeline, "ema")).stages["sft"].offload == ["ema"]
    prints = [fingerprints(build_nodes(validate_pipeline(c)), code="code") for c in (tiny_pipeline(),)]
    prints.append(fingerprints(build_nodes(validate_pipeline(_offloading(tiny_pipeline, "ema"))), code="code"))
    assert prints[0] == prints[1]


def test_a_snapshot_the_trainer_does_not_capture_is_refused_with_the_ones_it_holds(tiny_pipeline) -> None:
    message = _refusal(_offloading(tiny_pipeline, "ref", "teacher"))
    assert f"{WHERE}: ref: trainer 'sft' holds no 'ref' snapshot with these settings (it holds: ema)" in message
    assert f"{WHERE}: teacher: trainer 'sft'" in message
    config = _offloading(tiny_pipeline, "ema")
    config["stages"]["sft"]["callbacks"] = {}
    assert "(it holds: none); remove it" in _refusal(config)


def test_an_fsdp2_stage_is_refused_its_snapshots_offload(tiny_pipeline) -> None:
    message = _refusal(_offloading(tiny_pipeline, "ema", launch={"backend": "fsdp2"}))
    assert f"{WHERE}: ema: FSDP2 shards snapshots" in message and "launch.backend ddp" in message


def test_a_vae_a_pixel_space_model_lacks_is_refused(tiny_pipeline) -> None:
    message = _refusal(_offloading(tiny_pipeline, "vae"))
    assert f"{WHERE}: vae: family 'tiny-sd3' samples in pixel space and has no VAE; remove it" in message


def test_the_vae_of_a_stage_that_encodes_every_batch_is_refused(tiny_pipeline, sd3_pipeline_dir) -> None:
    config = _offloading(tiny_pipeline, "vae")
    sd3 = {"family": "sd3", "pretrained": str(sd3_pipeline_dir)}
    config["stages"]["sft"]["model"] = sd3
    config["conditions"]["minilm"] = {"model": sd3, "datasets": ["digits"]}
    message = _refusal(config)
    assert f"{WHERE}: vae: the stage encodes every batch of its dataset with the VAE" in message
    assert "read a latent cache (data.latents)" in message


def test_rewards_of_a_stage_without_rewards_are_refused(tiny_pipeline) -> None:
    assert f"{WHERE}: rewards: the stage scores no rewards; remove it" in _refusal(
        _offloading(tiny_pipeline, "rewards")
    )


@pytest.mark.parametrize(
    ("offload", "said"),
    [
        (["ema", "ema"], "ema is listed more than once"),
        (["text_encoder"], "'ref', 'ema', 'teacher', 'old', 'anchor', 'vae' or 'rewards'"),
    ],
)
def test_a_name_twice_or_an_unknown_one_is_refused_naming_the_path(tiny_pipeline, offload, said) -> None:
    message = _refusal(_offloading(tiny_pipeline, *offload))
    assert "stages.sft.offload" in message and said in message
