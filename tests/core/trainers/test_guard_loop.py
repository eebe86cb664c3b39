"""The loop with a guard: the baseline at the start, checks at its cadence, each passed check
checkpointed, a violation ending the stage with the last checkpoint that passed (which the export and
the report then describe), its checks resumed."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from flowpost.core.evaluation.guard import GUARD_FILE, Band, HeldOut, StageGuard
from flowpost.core.evaluation.image_metrics import Brightness
from flowpost.core.evaluation.plan import EvalPlan
from flowpost.core.events import read_events
from flowpost.core.io import read_json
from flowpost.data.stage_inputs import condition_table
from flowpost.errors import FlowpostError
from flowpost.tasks.export import export_stage
from flowpost.tasks.report import write_report

PROMPTS = ["digit 1", "digit 7"]
ENCODER = "test-encoder"  # the encoder fingerprint of the fixture's condition cache


@pytest.fixture
def make_guard(data_dirs: tuple[Path, Path]):  # noqa: ANN201
    """``make_guard(band, every=2)``: a guard on the brightness of 4 samples of two fixture prompts."""
    table = condition_table(data_dirs[1], ENCODER)

    def make(band: Band, *, every: int = 2) -> StageGuard:
        return StageGuard(
            judge=None,
            bounds={"brightness": (Brightness(), band)},
            every=every,
            plan=EvalPlan(prompts=PROMPTS, samples=4, steps=2, guidance=1.0, seed=0, batch_size=4),
            held_out=HeldOut(
                prompts=PROMPTS,
                metadata=[{}, {}],
                conditions=table.lookup(PROMPTS),
                negative=table.lookup([""]),
            ),
            weights="live",
        )

    return make


def _final_weights(out: Path) -> dict[str, torch.Tensor]:
    return load_file(out / "final" / "live" / "transformer" / "diffusion_pytorch_model.safetensors")


def _checkpoint_weights(out: Path, step: int) -> dict[str, torch.Tensor]:
    return load_file(out / "checkpoints" / f"step-{step}" / "model.safetensors")


def test_a_guard_that_passes_checks_at_its_cadence_and_checkpoints_each_check(make_trainer, make_guard, tmp_path):
    guard = make_guard(Band(max_change=1.0))
    progress = make_trainer(tmp_path, max_steps=5, guard=guard).start()
    assert progress.optimizer_step == 5
    assert [check.units for check in guard.checks] == [0, 2, 4, 5]  # the start, every 2, the budget's end
    assert sorted(int(p.name.removeprefix("step-")) for p in (tmp_path / "checkpoints").glob("step-*")) == [0, 2, 4, 5]
    record = read_json(tmp_path / "final" / GUARD_FILE)
    assert record["fired"] is None and record["start"] == guard.checks[0].values
    events = [e for e in read_events(tmp_path / "events.jsonl") if e["event"] == "guard"]
    assert [e["step"] for e in events] == [0, 2, 4, 5] and not any(e["violations"] for e in events)


def test_a_violation_ends_the_stage_with_the_last_checkpoint_that_passed(make_trainer, make_guard, tmp_path):
    guard = make_guard(Band(max_change=1e-7))  # any training moves the brightness this far
    progress = make_trainer(tmp_path, max_steps=6, guard=guard).start()
    assert progress.optimizer_step == 0  # back at the start, the only check that passed
    assert [(check.units, check.passed) for check in guard.checks] == [(0, True), (2, False)]
    final, start = _final_weights(tmp_path), _checkpoint_weights(tmp_path, 0)
    assert final.keys() == start.keys() and all(torch.equal(final[k], start[k]) for k in final)
    assert not (tmp_path / "checkpoints" / "step-2").exists()  # the weights that failed are never checkpointed
    record = read_json(tmp_path / "final" / GUARD_FILE)
    assert record["fired"]["units"] == 2 and record["last_good"]["units"] == 0
    assert "brightness" in record["fired"]["violations"][0]
    events = read_events(tmp_path / "events.jsonl")
    fired = next(e for e in events if e["event"] == "guard" and e["violations"])
    assert fired["last_good"] == 0
    assert events[-1]["event"] == "done" and events[-1]["step"] == 0


def test_the_export_and_the_report_say_the_guard_fired(make_trainer, make_guard, tmp_path):
    stage_dir = tmp_path / "stage"
    make_trainer(stage_dir, max_steps=4, guard=make_guard(Band(max_change=1e-7))).start()
    out = tmp_path / "export"
    manifest = export_stage(
        stage="sft", train_dir=stage_dir, out_dir=out, weights="live", resolved_config={}, fingerprints={}
    )
    assert manifest["step"] == 0 and manifest["guard"]["fired"] and manifest["guard"]["ended_with"] == 0
    card = (tmp_path / "export" / "README.md").read_text()
    assert "Guard: guard of stage 'sft' fired at step 2:" in card
    write_report(name="t", eval_dirs={}, export_dir=None, out_dirs=[tmp_path / "report"], guard_dirs={"sft": stage_dir})
    report = (tmp_path / "report" / "report.md").read_text()
    assert "## Guards" in report and "brightness" in report and "last good checkpoint, of step 0;" in report


def test_a_resumed_stage_keeps_its_baseline_and_checks(make_trainer, make_guard, tmp_path):
    first = make_guard(Band(max_change=1.0))
    make_trainer(tmp_path, max_steps=2, guard=first).start()
    second = make_guard(Band(max_change=1.0))
    make_trainer(tmp_path, max_steps=4, guard=second).start()
    assert second.start == first.start  # not measured again on the resumed weights
    assert [check.units for check in second.checks] == [0, 2, 4]


def test_a_start_outside_an_absolute_band_names_the_band(make_trainer, make_guard, tmp_path):
    guard = make_guard(Band(max=0.0))
    with pytest.raises(FlowpostError, match="starts outside the band of brightness") as caught:
        make_trainer(tmp_path, max_steps=2, guard=guard).start()
    assert caught.value.where == "guard.bounds.brightness"
