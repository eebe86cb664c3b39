"""The prompt of an edit: its instruction and the digest of its source image, one string that keys the edit's
condition row (text states and source latents, cached together) like any prompt. Data types, no flowpost imports."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

SOURCES_DIR = "sources"  # in a dataset's assets: its source images, ``<digest>.png``
DIGEST_LENGTH = 16
_EDIT_PROMPT = re.compile(rf"(?P<instruction>.*) \[source (?P<digest>[0-9a-f]{{{DIGEST_LENGTH}}})\]", re.DOTALL)


def source_digest(data: bytes) -> str:
    """The first 16 hex digits of the SHA-256 of a source image file's bytes."""
    return hashlib.sha256(data).hexdigest()[:DIGEST_LENGTH]


def edit_prompt(instruction: str, digest: str) -> str:
    """``instruction [source DIGEST]``: the instruction applied to the source image of that digest."""
    if not re.fullmatch(rf"[0-9a-f]{{{DIGEST_LENGTH}}}", digest):
        raise ValueError(f"source digest {digest!r} is not {DIGEST_LENGTH} lowercase hex digits")
    return f"{instruction} [source {digest}]"


def parse_edit_prompt(prompt: str) -> tuple[str, str] | None:
    """``(instruction, digest)`` of an edit prompt; None for a plain prompt."""
    match = _EDIT_PROMPT.fullmatch(prompt)
    return None if match is None else (match["instruction"], match["digest"])


def source_file(assets_dir: Path, digest: str) -> Path:
    """Where a dataset's ``assets/`` keeps the source image of ``digest``."""
    return assets_dir / SOURCES_DIR / f"{digest}.png"
