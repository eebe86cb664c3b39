"""The prompt of an edit: its instruction and the digests of its source images (one, or several for a family that
reads several), one string that keys the edit's condition row (text states and source latents, cached together)
like any prompt. Data types, no flowpost imports."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

SOURCES_DIR = "sources"  # in a dataset's assets: its source images, ``<digest>.png``
DIGEST_LENGTH = 16
_SOURCE = rf" \[source (?P<digest>[0-9a-f]{{{DIGEST_LENGTH}}})\]"
_EDIT_PROMPT = re.compile(rf"(?P<instruction>.*?)(?P<sources>(?:{_SOURCE})+)", re.DOTALL)


def source_digest(data: bytes) -> str:
    """The first 16 hex digits of the SHA-256 of a source image file's bytes."""
    return hashlib.sha256(data).hexdigest()[:DIGEST_LENGTH]


def edit_prompt(instruction: str, digest: str, *more: str) -> str:
    """``instruction [source DIGEST]``: the instruction applied to the source image of that digest; with ``more``
    digests, ``instruction [source D1] [source D2] ...``, the sources in order (Picture 1, Picture 2, ...)."""
    for value in (digest, *more):
        if not re.fullmatch(rf"[0-9a-f]{{{DIGEST_LENGTH}}}", value):
            raise ValueError(f"source digest {value!r} is not {DIGEST_LENGTH} lowercase hex digits")
    return instruction + "".join(f" [source {value}]" for value in (digest, *more))


def parse_edit_sources(prompt: str) -> tuple[str, tuple[str, ...]] | None:
    """``(instruction, digests)`` of an edit prompt, its sources in order; None for a plain prompt."""
    match = _EDIT_PROMPT.fullmatch(prompt)
    if match is None:
        return None
    return match["instruction"], tuple(re.findall(_SOURCE, match["sources"]))


def parse_edit_prompt(prompt: str) -> tuple[str, str] | None:
    """``(instruction, digest)`` of an edit prompt, its first source's digest; None for a plain prompt."""
    parsed = parse_edit_sources(prompt)
    return None if parsed is None else (parsed[0], parsed[1][0])


def source_count(prompts: list[str]) -> int:
    """The number of sources every edit prompt of ``prompts`` names (1 when none is an edit prompt); a
    ``ValueError`` when they differ (one condition cache holds rows of one width)."""
    counts = {len(parsed[1]) for prompt in prompts if (parsed := parse_edit_sources(prompt)) is not None}
    if len(counts) > 1:
        raise ValueError(
            f"edit prompts name different numbers of source images ({sorted(counts)}); one condition "
            "cache holds edits of one number of sources"
        )
    return counts.pop() if counts else 1


def source_file(assets_dir: Path, digest: str) -> Path:
    """Where a dataset's ``assets/`` keeps the source image of ``digest``."""
    return assets_dir / SOURCES_DIR / f"{digest}.png"
