"""Node ``conditions.<name>``: encode every unique prompt once into a parquet cache."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flowpost.core.conditions import NULL_PROMPT
from flowpost.core.config.schema import ConditionsConfig
from flowpost.core.io import read_json, write_json_atomic
from flowpost.core.models.text_encoders import build_encoder
from flowpost.data.condition_cache import update_condition_cache


def dataset_prompts(dataset_dir: Path) -> list[str]:
    """Training and held-out evaluation prompts named by an acquisition manifest."""
    manifest = read_json(dataset_dir / "manifest.json", what="dataset manifest")
    return [*manifest["train_prompts"], *(entry["prompt"] for entry in manifest["eval_prompts"])]


def cache_conditions(
    config: ConditionsConfig,
    dataset_dirs: list[Path],
    out_dir: Path,
    *,
    extra_prompts: list[str] = (),
) -> dict[str, Any]:
    """Encode the datasets' prompts, the null prompt and ``extra_prompts``; write ``out_dir``."""
    prompts = [NULL_PROMPT, *extra_prompts]
    for directory in dataset_dirs:
        prompts += dataset_prompts(directory)
    encoder = build_encoder(config.encoder, max_length=config.max_length)
    stats = update_condition_cache(out_dir, prompts, encoder_fingerprint=encoder.fingerprint, encode=encoder.encode)
    summary = {
        "encoder": config.encoder,
        "encoder_fingerprint": encoder.fingerprint,
        "max_length": config.max_length,
        "hits": stats.hits,
        "misses": stats.misses,
        "total": stats.total,
    }
    write_json_atomic(out_dir / "encoder.json", summary)
    return summary


def encoder_settings(conditions_dir: Path) -> dict[str, Any]:
    """Name, fingerprint and ``max_length`` of the encoder that filled a condition cache."""
    summary = read_json(conditions_dir / "encoder.json", what="condition cache summary")
    settings = {"name": summary["encoder"], "fingerprint": summary["encoder_fingerprint"]}
    if "max_length" in summary:
        settings["max_length"] = int(summary["max_length"])
    return settings


def encoder_fingerprint(conditions_dir: Path) -> str:
    """The fingerprint of the encoder that filled a condition cache."""
    return str(read_json(conditions_dir / "encoder.json", what="condition cache summary")["encoder_fingerprint"])
