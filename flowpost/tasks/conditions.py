"""Node ``conditions.<name>``: encode every unique prompt once into a parquet cache (an edit prompt with its
source image, which its dataset keeps in ``assets/sources/``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flowpost.core.conditions import NULL_PROMPT
from flowpost.core.config.schema.models import ConditionsConfig
from flowpost.core.edit_prompts import source_count
from flowpost.core.io import read_json, write_json_atomic
from flowpost.core.models.pretrained import PretrainedSource
from flowpost.core.models.registry import adapter_class
from flowpost.core.models.text_encoders import ConditionEncoder, build_encoder
from flowpost.data.condition_cache import update_condition_cache
from flowpost.errors import FlowpostError


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
    encoder = condition_encoder(config)
    if hasattr(encoder, "source_dirs"):  # an edit family's: it reads the source images in the datasets' assets
        encoder.source_dirs = tuple(directory / "assets" for directory in dataset_dirs)
        try:  # as many per edit as the edit prompts name (the null prompt's black squares too)
            encoder.sources = source_count(prompts)
        except ValueError as error:
            raise FlowpostError(str(error), where="conditions") from error
    try:
        stats = update_condition_cache(out_dir, prompts, encoder_fingerprint=encoder.fingerprint, encode=encoder.encode)
    finally:
        encoder.release()
    summary: dict[str, Any] = {
        "encoder": config.model.family if config.model else config.encoder,
        "encoder_fingerprint": encoder.fingerprint,
        "max_length": config.max_length,
        "hits": stats.hits,
        "misses": stats.misses,
        "total": stats.total,
    }
    if config.model is not None:
        summary["pretrained"] = config.model.pretrained
    write_json_atomic(out_dir / "encoder.json", summary)
    return summary


def condition_encoder(config: ConditionsConfig) -> ConditionEncoder:
    """The registered ``encoder``, or the text encoders of the family's pipeline (``model``)."""
    if config.model is None:
        return build_encoder(config.encoder, max_length=config.max_length)
    model = config.model
    options = (model.revision, model.variant, model.torch_dtype, model.components or {})
    source = PretrainedSource(model.pretrained, *options)
    family = adapter_class(model.family, where="conditions.*.model.family")
    return family.prompt_encoder(source, max_length=config.max_length)


def encoder_settings(conditions_dir: Path) -> dict[str, Any]:
    """Name, fingerprint, ``max_length`` (and the pipeline, for a family's own) of a condition cache's encoder."""
    summary = read_json(conditions_dir / "encoder.json", what="condition cache summary")
    settings = {"name": summary["encoder"], "fingerprint": summary["encoder_fingerprint"]}
    if "max_length" in summary:
        settings["max_length"] = int(summary["max_length"])
    if "pretrained" in summary:
        settings["pretrained"] = summary["pretrained"]
    return settings


def encoder_fingerprint(conditions_dir: Path) -> str:
    """The fingerprint of the encoder that filled a condition cache."""
    return str(read_json(conditions_dir / "encoder.json", what="condition cache summary")["encoder_fingerprint"])
