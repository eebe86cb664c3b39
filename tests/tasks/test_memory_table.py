"""The memory table of ``docs/speed-and-memory.md`` is what ``docs/shapes/memory_table.py`` prints, and its shapes
are the published ones."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
SCRIPT = ROOT / "docs" / "shapes" / "memory_table.py"
PAGE = ROOT / "docs" / "speed-and-memory.md"
PUBLISHED_BILLIONS = {
    "SD3.5-Medium": "2.24 B",
    "FLUX.1-dev": "11.90 B",
    "FLUX.2-dev": "32.22 B",
    "FLUX.2-klein-base-4B": "3.88 B",
    "Qwen-Image": "20.43 B",
    "Z-Image-Turbo": "6.15 B",
    "Wan2.1": "1.42 B",
    "Wan2.2-T2V-A14B": "28.58 B",  # both experts
}


@pytest.mark.slow
def test_the_speed_and_memory_page_holds_the_table_the_preflight_computes() -> None:
    spec = importlib.util.spec_from_file_location("memory_table", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    table = module.table()
    assert table in PAGE.read_text()
    rows = table.splitlines()[2:]
    assert len(rows) == 32  # per family: LoRA r32; over an int8 base; with adamw8bit and checkpointing too; full
    for model, count in PUBLISHED_BILLIONS.items():
        assert all(f"| {count} |" in row for row in rows if row.startswith(f"| {model}"))
