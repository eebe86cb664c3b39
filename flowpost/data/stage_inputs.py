"""Open a stage's dataset and condition cache as the ``StageInputs`` its trainer reads."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path
from typing import Any

from flowpost.core.io import read_json, sha256_file
from flowpost.core.trainers.inputs import ConditionTable, StageInputs
from flowpost.core.trainers.spec import StageSpec
from flowpost.data.condition_cache import load_condition_table
from flowpost.data.latent_cache import latent_cache_manifest, read_latent_cache
from flowpost.data.loaders import CachedLatents, DemonstrationDataset, FiniteLoader, PreferencePairDataset
from flowpost.data.shards import PAIR_ARMS, is_pair_manifest, read_pair_shards, read_shards
from flowpost.errors import FlowpostError

PROMPTS_FILE = "prompts.jsonl"  # what a prompt-files acquisition writes


def condition_table(cache_dir: str | Path, encoder_fingerprint: str) -> ConditionTable:
    prompts, batch = load_condition_table(Path(cache_dir), encoder_fingerprint)
    return ConditionTable(prompts=prompts, batch=batch, where=str(cache_dir))


def _demonstration_loader(train_dir: Path, manifest: dict[str, Any], **layout: Any) -> FiniteLoader:
    """The finite loader over the dataset's records, read (and hash-checked) when a trainer asks."""
    return FiniteLoader(DemonstrationDataset(read_shards(train_dir, manifest)), **layout)


def _preference_loader(train_dir: Path, manifest: dict[str, Any], **layout: Any) -> FiniteLoader:
    """The finite loader over the dataset's preference pairs, read (and hash-checked) when a trainer asks."""
    return FiniteLoader(PreferencePairDataset(read_pair_shards(train_dir, manifest)), **layout)


def _latent_loader(latents_dir: Path, train_dir: Path, **layout: Any) -> FiniteLoader:
    """The finite loader over a latent cache of the dataset (checked against it), batches of ``<arm>_latents``."""
    manifest, records = read_latent_cache(latents_dir, train_dir)
    if is_pair_manifest(manifest):
        return FiniteLoader(CachedLatents(PreferencePairDataset(records), PAIR_ARMS), **layout)
    return FiniteLoader(CachedLatents(DemonstrationDataset(records), ("image",)), **layout)


def load_stage_inputs(spec: StageSpec) -> StageInputs:
    """Conditions, the training demonstrations or preference pairs, the prompt pool and assets named by ``spec``."""
    inputs = StageInputs()
    if spec.conditions_dir is not None:
        inputs.conditions = condition_table(spec.conditions_dir, spec.encoder_fingerprint or "")
    if spec.dataset_dir is not None:
        dataset_dir = Path(spec.dataset_dir)
        train_dir = dataset_dir / "train"
        if (dataset_dir / PROMPTS_FILE).is_file():
            inputs.prompts = read_prompt_set(dataset_dir)
        else:
            manifest = read_json(train_dir / "manifest.json", what="dataset manifest")
            if spec.latents_dir is not None:
                loader = partial(_latent_loader, Path(spec.latents_dir), train_dir)
                inputs.latent_codec = latent_cache_manifest(Path(spec.latents_dir))["codec_fingerprint"]
            else:
                media = _preference_loader if is_pair_manifest(manifest) else _demonstration_loader
                loader = partial(media, train_dir, manifest)
            if is_pair_manifest(manifest):
                inputs.preferences = loader
            else:
                inputs.demonstrations = loader
            inputs.prompts = _labelled_prompts(train_dir, manifest)
            inputs.assets_dir = dataset_dir / "assets"
            trajectory = manifest.get("trajectory") if isinstance(manifest, dict) else None
            if isinstance(trajectory, dict):
                inputs.trajectory_sigmas = [float(s) for s in trajectory["sigmas"]]
    if spec.prompts_dir is not None:
        inputs.prompts = read_prompt_set(Path(spec.prompts_dir))
    return inputs


def prompt_pool(dataset_dir: Path) -> list[tuple[str, dict[str, Any]]]:
    """The (prompt, metadata) pairs a dataset offers for sampling: a prompt set's prompts, or the training
    prompts of a dataset of images with their labels."""
    if (dataset_dir / PROMPTS_FILE).is_file():
        return read_prompt_set(dataset_dir)
    train_dir = dataset_dir / "train"
    return _labelled_prompts(train_dir, read_json(train_dir / "manifest.json", what="dataset manifest"))


def _labelled_prompts(train_dir: Path, manifest: Any) -> list[tuple[str, dict[str, Any]]]:
    labels = manifest.get("labels") if isinstance(manifest, dict) else None
    if not isinstance(labels, dict):  # written before manifests listed labels
        labels = {record.prompt: record.label for record in read_shards(train_dir, manifest)}
    return [(prompt, {"label": labels[prompt]}) for prompt in sorted(labels)]


def read_prompt_set(dataset_dir: Path) -> list[tuple[str, dict[str, Any]]]:
    """The (prompt, metadata) pairs a prompt-files acquisition wrote, hash-checked against its manifest."""
    manifest = read_json(dataset_dir / "manifest.json", what="dataset manifest")
    path = dataset_dir / PROMPTS_FILE
    if sha256_file(path) != manifest.get("sha256"):
        raise FlowpostError(f"{path} does not match its manifest; re-run acquisition", where=str(path))
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]
    return [(row["prompt"], row["metadata"]) for row in rows]
