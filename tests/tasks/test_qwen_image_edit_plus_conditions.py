"""The conditions node on edits of two sources for the tiny Qwen-Image-Edit-Plus folder: each row holds the
instruction read with both sources and both sources' latents, as the family encodes them; edits naming another
number of sources are refused before anything is encoded."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from tiny_qwen_image_edit_pipeline import MAX_LENGTH, PLUS_SOURCES, SOURCE_TOKENS, load_qwen_image_edit_plus_adapter

from flowpost.core.config.schema import EditPairsDataset
from flowpost.core.config.schema.models import ConditionsConfig
from flowpost.core.edit_prompts import parse_edit_sources, source_file
from flowpost.data.condition_cache import load_condition_table
from flowpost.errors import FlowpostError
from flowpost.tasks.acquire import acquire_dataset
from flowpost.tasks.conditions import cache_conditions


def _acquired(root: Path, rows: list[dict[str, str]], columns: list[str]) -> Path:
    rng = np.random.default_rng(0)
    root.mkdir(parents=True)
    for name in {value for row in rows for key, value in row.items() if key != "instruction"}:
        Image.fromarray(rng.integers(0, 256, (40, 40, 3), dtype=np.uint8)).save(root / name)
    (root / "pairs.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    dataset = EditPairsDataset(
        path=str(root / "pairs.jsonl"),
        preprocess={"mode": "rgb", "resolution": 32},
        split={"eval": 0.0},
        more_source_columns=columns,
    )
    acquire_dataset(dataset, root / "out", where="datasets.edits")
    return root / "out"


def _conditions(folder: Path) -> ConditionsConfig:
    return ConditionsConfig.model_validate(
        {"model": {"family": "qwen-image-edit-plus", "pretrained": str(folder)}, "datasets": ["edits"]}
        | {"max_length": MAX_LENGTH}
    )


@pytest.mark.slow  # two 1024 px sources through the tiny VAE: seconds each
def test_each_row_holds_the_instruction_read_with_both_sources_and_their_latents(
    qwen_image_edit_plus_pipeline_dir: Path, tmp_path: Path
) -> None:
    rows = [{"instruction": "put the cat on the car", "source": "a.png", "second": "b.png", "target": "t.png"}]
    dataset = _acquired(tmp_path / "edits", rows, ["second"])
    cache_conditions(_conditions(qwen_image_edit_plus_pipeline_dir), [dataset], tmp_path / "conditions")
    fingerprint = json.loads((tmp_path / "conditions" / "encoder.json").read_text())["encoder_fingerprint"]
    prompts, batch = load_condition_table(tmp_path / "conditions", fingerprint)
    assert batch.pooled.shape[1] == PLUS_SOURCES * SOURCE_TOKENS * 64  # the null row as wide: one cache width
    [edit] = [prompt for prompt in prompts if parse_edit_sources(prompt) is not None]
    instruction, digests = parse_edit_sources(edit)
    adapter = load_qwen_image_edit_plus_adapter(qwen_image_edit_plus_pipeline_dir)
    images = [Image.open(source_file(dataset / "assets", digest)).convert("RGB") for digest in digests]
    expected = adapter.encode_edits([instruction], [images])
    row = batch.index(torch.tensor([prompts.index(edit)]))
    torch.testing.assert_close(row.pooled, expected.pooled, rtol=0, atol=1e-6)
    length = expected.token_states.shape[1]
    torch.testing.assert_close(row.token_states[:, :length], expected.token_states, rtol=0, atol=1e-6)


def test_edits_naming_different_numbers_of_sources_are_refused(
    qwen_image_edit_plus_pipeline_dir: Path, tmp_path: Path
) -> None:
    one = _acquired(tmp_path / "one", [{"instruction": "x", "source": "a.png", "target": "t.png"}], [])
    two = _acquired(
        tmp_path / "two", [{"instruction": "y", "source": "a.png", "second": "b.png", "target": "t.png"}], ["second"]
    )
    with pytest.raises(FlowpostError, match=r"different numbers of source images \(\[1, 2\]\)") as info:
        cache_conditions(_conditions(qwen_image_edit_plus_pipeline_dir), [one, two], tmp_path / "conditions")
    assert info.value.where == "conditions"
