"""What every dataset model shares: one ``source`` each, the registry of sources, and the check that names the
sources a misplaced field belongs to."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import SerializerFunctionWrapHandler, model_serializer, model_validator

from flowpost.core.config.base import StrictModel

SOURCES: dict[str, type[DatasetBase]] = {}  # source -> its model, filled as the models are defined
# the order of the keys in a dataset's dump, as params files written by one model for all sources hold them
DUMP_ORDER = (
    *("source", "path", "sample", "allow_outside", "chosen_column", "rejected_column", "source_column"),
    "more_source_columns",
    *("target_column", "image_size"),
    *("test_fraction", "split_seed", "caption_column", "image_column", "shards", "image_keys", "caption_keys"),
    *("hub", "frames", "preprocess", "split", "max_caption_chars", "max_bad_fraction", "trajectories"),
)


class DatasetBase(StrictModel):
    """One dataset source's fields. A concrete model fixes ``source`` to its name (and registers under it);
    ``READS_PATH`` says whether it reads ``path``, ``WRITES_ASSETS`` whether its acquisition writes the
    ``assets/`` a metric or reward taking ``assets_dir`` reads, and ``DEFAULT_METRICS`` what ``evaluate.metrics``
    is when unset and the pipeline evaluates on it."""

    READS_PATH: ClassVar[bool] = False
    WRITES_ASSETS: ClassVar[bool] = False
    DEFAULT_METRICS: ClassVar[tuple[str | dict[str, Any], ...]] = ()

    source: str

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        name = cls.model_fields["source"].default
        if isinstance(name, str):
            SOURCES[name] = cls

    def image_channels(self) -> int | None:
        """The channels of the images it acquires; None when it acquires none."""
        return None

    def holds_out(self) -> bool:
        """Whether its acquisition holds prompts (and their images) out for evaluation."""
        return False

    @model_serializer(mode="wrap")
    def _in_dump_order(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """The fields in ``DUMP_ORDER`` (fields it does not list after them), so params files keep their text."""
        data = handler(self)
        rank = {key: i for i, key in enumerate(DUMP_ORDER)}
        return {key: data[key] for key in sorted(data, key=lambda key: rank.get(key, len(rank)))}

    @model_validator(mode="before")
    @classmethod
    def _fields_of_its_source(cls, data: Any) -> Any:
        """A path where none is read (or none where one is), a field of other sources or a missing one: what to
        fix."""
        if isinstance(data, dict) and (problem := cls._path_problem(data) or cls._field_problem(data)):
            raise ValueError(problem)
        return data

    @classmethod
    def _path_problem(cls, data: dict[str, Any]) -> str | None:
        path = cls.model_fields.get("path")
        needed = path is not None and path.is_required()
        if (data.get("path") is not None and not cls.READS_PATH) or (needed and data.get("path") is None):
            fields = {name: model.model_fields.get("path") for name, model in SOURCES.items()}
            required = sorted(name for name, field in fields.items() if field is not None and field.is_required())
            return f"'path' is required for sources {', '.join(required)} (hf-dataset: path or hub), and only for them"
        return None

    @classmethod
    def _field_problem(cls, data: dict[str, Any]) -> str | None:
        source = data.get("source", cls.model_fields["source"].default)
        if foreign := [key for key in data if key not in cls.model_fields and readers(key)]:
            users = ", ".join(sorted({name for key in foreign for name in readers(key)}))
            return f"{', '.join(foreign)} do not apply to source {source!r} (they apply to {users})"
        required = [(name, field) for name, field in cls.model_fields.items() if field.is_required()]
        if missing := [f"{name!r}: {field.description}" for name, field in required if name not in data]:
            return f"source {source!r} reads " + "; ".join(missing)
        return None


class StoredDataset(DatasetBase):
    """A dataset read from files, shards, the hub or built in (not sampled from a stage): a ``path`` where its
    source reads one, and the seed of its held-out split."""

    path: str | None = None
    split_seed: int = 0


def readers(field: str) -> list[str]:
    """The sources whose models have ``field``."""
    return [name for name, model in SOURCES.items() if field in model.model_fields]
