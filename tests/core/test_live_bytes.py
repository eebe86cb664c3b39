"""LiveBytes: the peak of live tensor storage while code runs, on real and meta tensors."""

from __future__ import annotations

import pytest
import torch

from flowpost.core.live_bytes import FusedAttention, LiveBytes


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_the_peak_counts_what_is_alive_together_not_what_was_freed(device: str) -> None:
    x = torch.zeros(1024, device=device)  # made before: not counted
    with LiveBytes() as live:
        for _ in range(5):
            y = x + 1  # 4 KiB, the previous y freed when the name is rebound
            z = y * 2  # 4 KiB more while y lives
            del y, z
    assert live.peak == 2 * 4096


def test_views_share_their_storage() -> None:
    with LiveBytes() as live:
        a = torch.ones(256, 4)  # 4 KiB
        b = a.t()  # a view: no new storage
        c = b[0]
        assert c.untyped_storage()._cdata == a.untyped_storage()._cdata
    assert live.peak == 4096


def test_fused_attention_keeps_the_output_not_the_scores() -> None:
    q = torch.empty(2, 4, 256, 8, device="meta")
    v = torch.empty(2, 4, 256, 16, device="meta")
    with LiveBytes() as math:
        torch.nn.functional.scaled_dot_product_attention(q, q, v)
    with FusedAttention(), LiveBytes() as fused:
        out = torch.nn.functional.scaled_dot_product_attention(q, key=q, value=v)
    assert out.shape == (2, 4, 256, 16) and fused.peak == out.nbytes
    assert math.peak >= 2 * 4 * 256 * 256 * 4  # the score matrix, fp32
