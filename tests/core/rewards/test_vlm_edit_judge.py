"""``vlm_edit_judge`` on a tiny random LLaVA built here, in this process: the judge sees each edit's source image,
read from the edit dataset's assets by the digest its prompt names, then the edited image."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from PIL import Image
from tiny_vlm import build_tiny_vlm

from flowpost.core.edit_prompts import edit_prompt, source_digest, source_file
from flowpost.core.rewards.registry import build_reward
from flowpost.core.rewards.remote import encode_images
from flowpost.core.rewards.vlm_questions import EDIT
from flowpost.errors import FlowpostError


@pytest.fixture(scope="module")
def vlm(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(build_tiny_vlm(tmp_path_factory.mktemp("vlm")))


def _sources(assets: Path) -> list[str]:
    """Two different 28 px sources stored as an edit dataset stores them; their digests."""
    digests = []
    for colour in ((250, 10, 10), (10, 10, 250)):
        image = Image.new("RGB", (28, 28), colour)
        path = assets / "sources" / "tmp.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        image.save(path)
        digest = source_digest(path.read_bytes())
        path.rename(source_file(assets, digest))
        digests.append(digest)
    return digests


def test_the_judge_sees_the_source_then_the_edit(vlm: str, tmp_path: Path) -> None:
    digests = _sources(tmp_path)
    judge = build_reward("vlm_edit_judge", options={"model": vlm, "assets_dir": tmp_path}, where="rewards.0")
    media = torch.rand(1, 3, 28, 28, generator=torch.Generator().manual_seed(0)).expand(2, -1, -1, -1)
    prompts = [edit_prompt("make it red", digest) for digest in digests]
    scores = judge(media, prompts, [{}, {}])
    assert scores.shape == (2,) and bool(((scores >= 0) & (scores <= 1)).all())
    assert float(scores[0]) != float(scores[1])  # one edited image, two sources: two answers
    (edited,) = encode_images(media[:1])
    source = judge._source(prompts[0])
    assert source[0] == "make it red"
    direct = judge.values([([source[1], edited], EDIT["yes_prob"].format(prompt="make it red"))], media.device)
    assert float(scores[0]) == pytest.approx(direct[0], abs=1e-6)


def test_edits_need_their_sources_and_prompts_naming_them(vlm: str, tmp_path: Path) -> None:
    with pytest.raises(FlowpostError, match="edit-pairs dataset keeps in its assets/") as info:
        build_reward("vlm_edit_judge", options={"model": vlm}, where="rewards.0")
    assert "options.assets_dir" in str(info.value)
    judge = build_reward("vlm_edit_judge", options={"model": vlm, "assets_dir": tmp_path}, where="rewards.0")
    media = torch.rand(1, 3, 28, 28)
    with pytest.raises(FlowpostError, match="'a red cat' names no source image"):
        judge(media, ["a red cat"], [{}])
    with pytest.raises(FlowpostError, match="source image of .* is missing; re-run the acquisition"):
        judge(media, [edit_prompt("x", "0" * 16)], [{}])
