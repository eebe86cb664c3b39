"""Open a stage's dataset and condition cache as the ``StageInputs`` its trainer reads."""

from __future__ import annotations

from functools import partial
from pathlib import Path

from flowpost.core.io import read_json
from flowpost.core.trainers.inputs import ConditionTable, StageInputs
from flowpost.core.trainers.spec import StageSpec
from flowpost.data.condition_cache import load_condition_table
from flowpost.data.loaders import DemonstrationDataset, FiniteLoader
from flowpost.data.shards import read_shards


def condition_table(cache_dir: str | Path, encoder_fingerprint: str) -> ConditionTable:
    prompts, batch = load_condition_table(Path(cache_dir), encoder_fingerprint)
    return ConditionTable(prompts=prompts, batch=batch, where=str(cache_dir))


def load_stage_inputs(spec: StageSpec) -> StageInputs:
    """Conditions, the training demonstrations, the prompt pool and assets named by ``spec``."""
    inputs = StageInputs()
    if spec.conditions_dir is not None:
        inputs.conditions = condition_table(spec.conditions_dir, spec.encoder_fingerprint or "")
    if spec.dataset_dir is not None:
        dataset_dir = Path(spec.dataset_dir)
        train_dir = dataset_dir / "train"
        records = read_shards(train_dir, read_json(train_dir / "manifest.json", what="dataset manifest"))
        inputs.demonstrations = partial(FiniteLoader, DemonstrationDataset(records))
        labels = {record.prompt: record.label for record in records}
        inputs.prompts = [(prompt, {"label": labels[prompt]}) for prompt in sorted(labels)]
        inputs.assets_dir = dataset_dir / "assets"
    return inputs
