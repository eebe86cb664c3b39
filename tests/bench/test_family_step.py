"""The bare diffusers loops of the family-step benchmark take flowpost's SFT step: the same first loss."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from bare_family_loops import BareFamilyStep  # noqa: E402
from family_step import LOSS_TOLERANCE, first_losses, prepare, settings, stage_spec  # noqa: E402

FAMILIES = [
    "sd3",
    pytest.param("flux1", marks=pytest.mark.slow),
    pytest.param("qwen-image", marks=pytest.mark.slow),
    pytest.param("wan2", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("family", FAMILIES)
def test_both_arms_compute_the_same_first_step(tmp_path: Path, family: str) -> None:
    root = tmp_path / family
    prepare(root, family, records=4)
    flowpost, bare = first_losses(root, family, batch=4)
    assert math.isfinite(flowpost) and flowpost > 0
    assert abs(flowpost - bare) <= LOSS_TOLERANCE
    spec = stage_spec(root, family, tmp_path / "other-noise", steps=1, batch=4)
    other = BareFamilyStep(family, root / "pipeline", spec, settings(spec)).step()  # its own seeded noise
    assert abs(other - flowpost) > LOSS_TOLERANCE  # the check tells different steps apart
