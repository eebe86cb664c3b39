from __future__ import annotations

from typing import Any

import pytest
import torch

from flowpost.core.noise import address_seed, addressed_rand, addressed_randn

SHAPE = (1, 4, 4)
ADDRESS: dict[str, Any] = {"seed": 0, "stage": "sft", "step": 3}


def test_rows_depend_only_on_their_index() -> None:
    together = addressed_randn(SHAPE, indices=[3, 5, 7], **ADDRESS)
    reordered = addressed_randn(SHAPE, indices=[7, 3], **ADDRESS)
    assert together.shape == (3, *SHAPE)
    assert torch.equal(reordered[0], together[2])
    assert torch.equal(reordered[1], together[0])
    for row, index in enumerate([3, 5, 7]):
        single = addressed_randn(SHAPE, indices=[index], **ADDRESS)
        assert torch.equal(single[0], together[row])
    # distinct indices give distinct draws
    assert not torch.equal(together[0], together[1])


def test_rows_are_independent_of_batch_split() -> None:
    full = addressed_randn(SHAPE, indices=range(8), **ADDRESS)
    halves = torch.cat(
        [
            addressed_randn(SHAPE, indices=range(0, 4), **ADDRESS),
            addressed_randn(SHAPE, indices=range(4, 8), **ADDRESS),
        ]
    )
    assert torch.equal(full, halves)


@pytest.mark.parametrize(
    "change",
    [{"seed": 1}, {"stage": "dpo"}, {"step": 4}, {"purpose": "dropout"}],
)
def test_each_address_part_changes_the_draw(change: dict[str, Any]) -> None:
    base = addressed_randn(SHAPE, indices=[2], **ADDRESS)
    other = addressed_randn(SHAPE, indices=[2], **{**ADDRESS, **change})
    assert not torch.allclose(base, other)


def test_same_address_is_reproducible() -> None:
    first = addressed_randn(SHAPE, indices=[0, 9], **ADDRESS)
    second = addressed_randn(SHAPE, indices=[0, 9], **ADDRESS)
    assert torch.equal(first, second)


def test_global_rng_state_is_untouched() -> None:
    torch.manual_seed(123)
    state = torch.get_rng_state()
    addressed_randn(SHAPE, indices=[0, 1, 2], **ADDRESS)
    addressed_rand(SHAPE, indices=[0, 1], purpose="sigma", **ADDRESS)
    assert torch.equal(torch.get_rng_state(), state)
    # and the global stream continues as if nothing had been drawn
    expected = torch.Generator().manual_seed(123)
    assert torch.equal(torch.randn(5), torch.randn(5, generator=expected))


def test_uniform_draws_lie_in_unit_interval_and_are_addressed() -> None:
    draws = addressed_rand((1000,), indices=[4, 6], purpose="sigma", **ADDRESS)
    assert draws.shape == (2, 1000)
    assert float(draws.min()) >= 0.0 and float(draws.max()) < 1.0
    single = addressed_rand((1000,), indices=[6], purpose="sigma", **ADDRESS)
    assert torch.equal(single[0], draws[1])


def test_normal_draws_have_standard_moments() -> None:
    draws = addressed_randn((4096,), indices=range(4), **ADDRESS)
    assert abs(float(draws.mean())) < 0.05
    assert abs(float(draws.std()) - 1.0) < 0.05


def test_empty_indices_give_empty_tensor() -> None:
    assert addressed_randn(SHAPE, indices=[], **ADDRESS).shape == (0, *SHAPE)


def test_address_seed_is_a_63_bit_value() -> None:
    seeds = {address_seed(0, "sft", 0, i) for i in range(100)}
    assert len(seeds) == 100
    assert all(0 <= s < (1 << 63) for s in seeds)
    # stage names are not confused with neighbouring fields
    assert address_seed(1, "2", 3, 4) != address_seed(12, "", 3, 4)
