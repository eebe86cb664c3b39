"""Distillation stages and teacher-trajectories datasets: what the pipeline file may say, and the
dotted path of every mistake."""

from __future__ import annotations

from pathlib import Path

import pytest

from flowpost.core.config.loading import load_pipeline, pipeline_to_dict
from flowpost.errors import FlowpostError
from flowpost.tasks.graph import build_nodes

REPO = Path(__file__).resolve().parents[3]
KD = REPO / "examples" / "digits-kd.yaml"
OPD = REPO / "examples" / "digits-opd.yaml"
TRAJECTORIES = "{stage: sft, prompts: digits, conditions: minilm}"


def _error(path: Path, overrides: list[str]) -> str:
    with pytest.raises(FlowpostError) as info:
        load_pipeline(path, overrides)
    return str(info.value)


@pytest.mark.parametrize(
    "path, override, where",
    [
        (KD, "datasets.teacher-odes.trajectories.stage=kdd", "datasets.teacher-odes.trajectories.stage: unknown stage"),
        (KD, "datasets.teacher-odes.trajectories.prompts=teacher-odes", "trajectories.prompts: unknown prompt dataset"),
        (KD, "datasets.teacher-odes.trajectories.conditions=clip", "trajectories.conditions: unknown conditions"),
        (KD, "datasets.teacher-odes.trajectories.steps=0", "datasets.teacher-odes.trajectories.steps"),
        (KD, "datasets.teacher-odes.image_size=32", "image_size do not apply to source 'teacher-trajectories'"),
        (KD, "datasets.teacher-odes.path=x.txt", "'path' is required for sources edit-pairs, image-folder"),
        (KD, f"datasets.digits.trajectories={TRAJECTORIES}", "trajectories do not apply to source 'builtin-digits'"),
        (KD, "conditions.minilm.datasets=[digits, teacher-odes]", "conditions.minilm.datasets.1: 'teacher-odes' is"),
        (KD, "stages.kd.data.dataset=digits", "stages.kd.data.dataset: trainer 'kd' trains on a 'teacher-traj"),
        (KD, "stages.kd.trainer=sft", "stages.kd.data.dataset: 'teacher-odes' holds teacher trajectories"),
        (KD, "datasets.teacher-odes.trajectories.stage=kd", "stages.kd.data.dataset: 'teacher-odes' is sampled from"),
        (OPD, "stages.opd.model.init=scratch", "stages.opd.model.init: trainer 'diffusion-opd' distils"),
        (OPD, "stages.opd.train.target=eps", "stages.opd.train.target"),
        (OPD, "stages.opd.train.teacher_substeps=0", "stages.opd.train.teacher_substeps"),
    ],
)
def test_a_distillation_mistake_names_its_path(path: Path, override: str, where: str) -> None:
    assert where in _error(path, [override])


def test_a_trajectory_dataset_is_acquired_after_its_teacher_stage_and_before_its_student() -> None:
    pipeline = load_pipeline(KD)
    order = [node.id for node in build_nodes(pipeline)]
    assert order.index("train.sft") < order.index("acquire.teacher-odes") < order.index("train.kd")
    nodes = {node.id: node for node in build_nodes(pipeline)}
    assert set(nodes["acquire.teacher-odes"].deps) == {"train.sft", "conditions.minilm"}
    assert "acquire.teacher-odes" in nodes["train.kd"].deps
    assert pipeline_to_dict(pipeline)["datasets"]["teacher-odes"].keys() == {"source", "trajectories"}


def test_the_default_pipeline_keeps_its_node_order() -> None:
    order = [node.id for node in build_nodes(load_pipeline(None))]
    assert order[:3] == ["acquire.digits", "conditions.minilm", "train.sft"]
    assert order[-1] == "report"
