"""The teacher-trajectories acquisition: the teacher's ODE states at the student's sigmas, cached as
shards that a kd stage trains on (and resumes on exactly)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from flowpost.core.config.schema import TrajectoriesConfig
from flowpost.core.models.tiny_sd3 import TinySD3Adapter
from flowpost.core.noise import addressed_randn
from flowpost.core.sampling.ode import euler_step
from flowpost.core.trainers.distill.kd import KDTrainer, split_trajectory
from flowpost.data.condition_cache import load_conditions
from flowpost.tasks.trajectories import acquire_trajectories

TINY = {"num_layers": 1, "num_attention_heads": 2, "attention_head_dim": 8, "caption_projection_dim": 16}
FINGERPRINT = "test-encoder"  # what this folder's conftest encodes the test conditions under


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("teacher") / "ema"
    TinySD3Adapter.from_scratch(seed=3, overrides=TINY).save_pretrained(path)
    return path


def _acquire(out: Path, teacher_dir: Path, data_dirs: tuple[Path, Path], **options) -> dict:
    config = TrajectoriesConfig.model_validate(
        {"stage": "sft", "prompts": "digits", "conditions": "minilm", "samples": 6, "batch_size": 4, **options}
    )
    return acquire_trajectories(
        config,
        out,
        dataset="kd-data",
        weights_dir=teacher_dir,
        prompts_dir=data_dirs[0],
        conditions_dir=data_dirs[1],
        encoder_fingerprint=FINGERPRINT,
        seed=0,
    )


def test_trajectories_are_the_teachers_fine_euler_states_at_the_students_sigmas(tmp_path, teacher_dir, data_dirs):
    from flowpost.core.io import read_json
    from flowpost.data.shards import read_shards

    manifest = _acquire(tmp_path, teacher_dir, data_dirs, steps=2, substeps=2)
    assert manifest["counts"] == {"train": 6}
    assert manifest["trajectory"]["sigmas"] == [1.0, 0.5, 0.0]
    records = read_shards(tmp_path / "train", read_json(tmp_path / "train" / "manifest.json"))
    teacher = TinySD3Adapter.from_pretrained(teacher_dir)
    record = records[5]
    conditions = load_conditions(data_dirs[1], [record.prompt], encoder_fingerprint=FINGERPRINT)
    state = teacher.prepare_condition_state(conditions)
    x = addressed_randn(teacher.latent_shape, seed=0, stage="trajectories-kd-data", step=0, indices=[5])
    expected = [x]
    with torch.no_grad():
        for sigma in (1.0, 0.75, 0.5, 0.25):  # 2 student steps of 2 teacher steps each
            x = euler_step(teacher.forward(x, torch.tensor(sigma), state), x, sigma, sigma - 0.25)
            if sigma in (0.75, 0.25):
                expected.append(x)
    states = split_trajectory(torch.from_numpy(record.image)[None], teacher.latent_shape, 3)[0]
    torch.testing.assert_close(states, torch.cat(expected), rtol=1e-5, atol=1e-5)


def test_a_kd_stage_trains_on_the_trajectories_and_resumes_exactly(make_trainer, tmp_path, teacher_dir, data_dirs):
    dataset = tmp_path / "trajectories"
    _acquire(dataset, teacher_dir, data_dirs, steps=2, substeps=2, samples=8)
    dirs = (dataset, data_dirs[1])
    straight = make_trainer(tmp_path / "straight", cls=KDTrainer, dirs=dirs, resume=False, max_steps=4)
    before = {k: v.clone() for k, v in straight.adapter.module().state_dict().items()}
    straight.start()
    after = straight.adapter.module().state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in after)
    make_trainer(tmp_path / "resumed", cls=KDTrainer, dirs=dirs, max_steps=2, checkpoint_every=1).start()
    resumed = make_trainer(tmp_path / "resumed", cls=KDTrainer, dirs=dirs, max_steps=4, checkpoint_every=1)
    resumed.start()
    assert resumed.progress == straight.progress and resumed.progress.data_epoch == 2
    b = resumed.adapter.module().state_dict()
    assert all(torch.equal(after[k], b[k]) for k in after)


def test_kd_on_a_dataset_of_images_names_the_dataset(make_trainer, tmp_path):
    from flowpost.errors import FlowpostError

    with pytest.raises(FlowpostError, match=r"stages\.sft\.data\.dataset: kd trains on cached teacher ODE"):
        make_trainer(tmp_path, cls=KDTrainer)
