"""Prompt files: a file or a folder of ``.txt`` / ``.jsonl`` / ``.csv`` / ``.parquet`` prompts.

``.txt`` holds one prompt per line (blank lines and lines starting with ``#`` are skipped); the
other formats hold a ``prompt`` field or column, and every other field becomes the record's
metadata (e.g. ``label`` for ``digit_adherence``). A folder contributes its files in name order,
subfolders included; a prompt seen twice keeps its first metadata.
"""

from __future__ import annotations

import csv
import hashlib
import json
from pathlib import Path
from typing import Any

from flowpost.core.io import sha256_file
from flowpost.data.records import PromptRecord
from flowpost.errors import FlowpostError

SUFFIXES = (".txt", ".jsonl", ".csv", ".parquet")


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
    root = Path(path)
    digest = hashlib.sha256()
    for file in prompt_files(root, where=where):
        name = file.name if root.is_file() else str(file.relative_to(root))
        digest.update(f"{name}\0{sha256_file(file)}\n".encode())
    return digest.hexdigest()


def read_prompt_files(path: str | Path, *, where: str) -> list[PromptRecord]:
    """Every prompt at ``path`` once, in file order."""
    records: dict[str, PromptRecord] = {}
    for file in prompt_files(path, where=where):
        for row in _rows(file):
            prompt = row.pop("prompt", None)
            if not isinstance(prompt, str) or not prompt.strip():
                raise FlowpostError(f"{file}: a row has no 'prompt' text: {row}", where=where)
            records.setdefault(prompt.strip(), PromptRecord(prompt.strip(), row))
    if not records:
        raise FlowpostError(f"{path}: no prompts found", where=where)
    return list(records.values())


def _rows(file: Path) -> list[dict[str, Any]]:
    suffix = file.suffix.lower()
    text = file.read_text(encoding="utf-8") if suffix != ".parquet" else ""
    if suffix == ".txt":
        lines = (line.strip() for line in text.splitlines())
        return [{"prompt": line} for line in lines if line and not line.startswith("#")]
    if suffix == ".jsonl":
        rows = []
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise FlowpostError(f"{file}:{number}: not JSON ({exc.msg})", where=str(file)) from None
            if not isinstance(row, dict):
                raise FlowpostError(f"{file}:{number}: expected an object with a 'prompt'", where=str(file))
            rows.append(row)
        return rows
    if suffix == ".csv":
        return [dict(row) for row in csv.DictReader(text.splitlines())]
    import pyarrow.parquet as pq

    return pq.read_table(file).to_pylist()
