"""Prompt files: a file or a folder of ``.txt`` / ``.jsonl`` / ``.csv`` / ``.parquet`` prompts.

``.txt`` holds one prompt per line (blank lines are skipped; there is no comment syntax: every other line is a
prompt, ``#`` included); the other formats hold a ``prompt`` field or column, and every other field becomes the
record's metadata. Files are read line by line as UTF-8 (a byte-order mark is dropped); control characters other
than tab and line breaks are removed from prompts and counted. A ``label`` is an integer class label, as a scorer
reading labels (e.g. ``digit_adherence``) takes it (decimal text in a CSV cell is read as its integer); anything
else is refused. A row with ``include`` (or ``exclude``) holds GenEval's checks, read as ``geneval`` reads them
(``tag``, ``include``, ``exclude``): a malformed one is refused. A CSV in DrawBench's published layout (columns
``Prompts`` and ``Category``, no ``prompt``) gives each row's ``Prompts`` as its prompt and ``Category`` as its
``category``. A folder contributes its files in name order,
subfolders included; a prompt seen twice must carry the same metadata both times.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, NamedTuple

from flowpost.core.labels import integer_label
from flowpost.core.rewards.geneval_metadata import parse_geneval
from flowpost.data.file_hashes import files_fingerprint
from flowpost.data.prompt_rows import PromptRow, read_prompt_rows
from flowpost.data.records import PromptRecord
from flowpost.errors import FlowpostError

SUFFIXES = (".txt", ".jsonl", ".csv", ".parquet")
DRAWBENCH_PROMPT, DRAWBENCH_CATEGORY = "Prompts", "Category"  # DrawBench's published CSV columns
CATEGORY = "category"  # the metadata field a DrawBench row's category becomes
CONTROL_CHARACTERS = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")  # C0 and C1 but tab, \n and \r


def prompt_files(path: str | Path, *, where: str) -> list[Path]:
    """The prompt files at ``path`` (a file or a folder), in a stable order."""
    root = Path(path)
    if root.is_file():
        files = [root]
    elif root.is_dir():
        files = sorted(p for p in root.rglob("*") if p.is_file() and not p.name.startswith("."))
    else:
        raise FlowpostError(f"prompt path {str(root)!r} does not exist; create it or fix the path", where=where)
    unknown = [p for p in files if p.suffix.lower() not in SUFFIXES]
    if unknown:
        raise FlowpostError(
            f"{unknown[0]}: not a prompt file (expected one of {', '.join(SUFFIXES)}); move it out of {root}",
            where=where,
        )
    if not files:
        raise FlowpostError(f"no prompt files in {root}", where=where)
    return files


def prompt_files_fingerprint(path: str | Path, *, where: str) -> str:
    """Hash of the files' names (relative to ``path``) and contents: changes when a prompt does."""
    return files_fingerprint(Path(path), prompt_files(path, where=where))


class PromptSet(NamedTuple):
    """The prompts read, each once in file order, how many control characters were removed from them, and where
    each record was first read (``FILE:LINE``, in the order of ``records``)."""

    records: list[PromptRecord]
    control_characters_removed: int
    places: list[str]


def read_prompt_files(path: str | Path, *, where: str) -> PromptSet:
    """Every prompt at ``path`` once, in file order."""
    records: dict[str, PromptRecord] = {}
    seen_at: dict[str, str] = {}
    removed = 0
    for file in prompt_files(path, where=where):
        for row in read_prompt_rows(file):
            record, dropped = _record(row)
            removed += dropped
            first = records.setdefault(record.prompt, record)
            seen_at.setdefault(record.prompt, row.where)
            if first.metadata != record.metadata:
                raise FlowpostError(
                    f"prompt {record.prompt!r} has metadata {record.metadata} here and {first.metadata} at "
                    f"{seen_at[record.prompt]}; keep one of them",
                    where=row.where,
                )
    if not records:
        raise FlowpostError(f"{path}: no prompts found", where=where)
    return PromptSet(list(records.values()), removed, [seen_at[prompt] for prompt in records])


def _record(row: PromptRow) -> tuple[PromptRecord, int]:
    """The row as a record (a non-empty prompt without control characters, a ``label``, when given, read as an
    integer, and GenEval checks, when given, well formed) and the count of control characters removed."""
    metadata = dict(row.fields)
    if "prompt" not in metadata and DRAWBENCH_PROMPT in metadata:
        metadata = _drawbench(metadata, where=row.where)
    if "prompt" not in metadata:
        fields = ", ".join(map(str, metadata)) or "none"
        raise FlowpostError(f"this row has no 'prompt' field (its fields: {fields}); add one", where=row.where)
    raw = metadata.pop("prompt")
    if not isinstance(raw, str):
        raise FlowpostError(
            f"'prompt' is {raw!r} ({type(raw).__name__}), not text; write the prompt as a string", where=row.where
        )
    prompt, removed = CONTROL_CHARACTERS.subn("", raw)
    if not prompt.strip():
        raise FlowpostError("'prompt' is blank; remove the row or write its prompt", where=row.where)
    if "label" in metadata:
        try:
            metadata["label"] = integer_label(metadata["label"])
        except ValueError as exc:
            raise FlowpostError(
                f"{exc}; 'label' is the class label a scorer reads: fix it, or rename the field if it means "
                "something else",
                where=row.where,
            ) from None
    if "include" in metadata or "exclude" in metadata:
        try:
            parse_geneval(metadata)
        except ValueError as exc:
            raise FlowpostError(
                f"{exc}; 'include' and 'exclude' hold GenEval's checks (its evaluation_metadata.jsonl rows): fix "
                "them, or rename the fields if they mean something else",
                where=row.where,
            ) from None
    return PromptRecord(prompt.strip(), metadata), removed


def _drawbench(fields: dict[str, Any], *, where: str) -> dict[str, Any]:
    """A DrawBench row (``Prompts``, ``Category``, any other columns) with ``prompt`` and ``category`` fields."""
    fields = dict(fields)
    prompt = fields.pop(DRAWBENCH_PROMPT)
    if DRAWBENCH_CATEGORY in fields:
        category = fields.pop(DRAWBENCH_CATEGORY)
        if not isinstance(category, str) or not category.strip():
            raise FlowpostError(
                f"'{DRAWBENCH_CATEGORY}' is blank; DrawBench rows give each prompt's category: write it, or drop "
                "the column",
                where=where,
            )
        fields[CATEGORY] = category.strip()
    return {"prompt": prompt, **fields}
