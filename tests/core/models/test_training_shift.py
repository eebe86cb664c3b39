"""Training sigmas of the diffusers families: the constant shift the stock scheduler's training table
carries, never a ``shift`` that dynamic shifting makes dead."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler
from tiny_flux1_pipeline import build_tiny_flux1_pipeline, load_flux1_adapter

from flowpost.core.models.flux1 import Flux1Adapter
from flowpost.core.models.qwen_image import QwenImageAdapter
from flowpost.core.models.sd3 import SD3Adapter
from flowpost.core.sampling.schedules import shift_sigmas


def _training_table(config: dict) -> torch.Tensor:
    """The sigma table diffusers' training scripts index (the scheduler's, before ``set_timesteps``)."""
    return FlowMatchEulerDiscreteScheduler(**config).sigmas


def _table(shift: float, steps: int = 1000) -> torch.Tensor:
    return shift_sigmas(torch.arange(steps, 0, -1, dtype=torch.float64) / steps, shift).float()


@pytest.mark.parametrize("family", [Flux1Adapter, QwenImageAdapter, SD3Adapter])
@pytest.mark.parametrize(
    "config",
    [
        {"shift": 3.0, "use_dynamic_shifting": True, "base_shift": 0.5, "max_shift": 1.15},
        {"shift": 3.0, "use_dynamic_shifting": False},
        {"shift": 1.0, "use_dynamic_shifting": True},
    ],
)
def test_the_training_shift_is_the_stock_training_tables(family: type, config: dict) -> None:
    scheduler = FlowMatchEulerDiscreteScheduler(**config)
    shift = family.scheduler_shift(scheduler.config)
    assert shift == (1.0 if config["use_dynamic_shifting"] else config["shift"])
    torch.testing.assert_close(_training_table(config), _table(shift), rtol=0, atol=1e-6)


def test_flux1_dev_trains_and_records_no_dead_shift(flux1_pipeline_dir: Path) -> None:
    adapter = load_flux1_adapter(flux1_pipeline_dir)
    assert adapter.scheduler.config.shift == 3.0 and adapter.scheduler.config.use_dynamic_shifting
    assert adapter.shift == 1.0
    schedule = adapter.describe()["schedule"]
    assert schedule["shift"] == 1.0
    assert schedule["dynamic_shift"] == {"base_shift": 0.5, "max_shift": 1.15, "base_seq_len": 256, "max_seq_len": 4096}


def test_flux1_schnell_records_no_dynamic_shift(tmp_path: Path) -> None:
    adapter = load_flux1_adapter(build_tiny_flux1_pipeline(tmp_path / "schnell", variant="schnell"))
    assert adapter.shift == 1.0 and "dynamic_shift" not in adapter.describe()["schedule"]


def test_the_model_card_names_the_dynamic_shift(flux1_pipeline_dir: Path) -> None:
    from flowpost.tasks.export import _shift_words

    words = _shift_words(load_flux1_adapter(flux1_pipeline_dir).describe()["schedule"])
    assert "shift 3.0" not in words and "mu from the image token count" in words and "max_shift 1.15" in words
    assert _shift_words({"shift": 3.0}) == "shift 3.0"
