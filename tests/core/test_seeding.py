"""Seeded blocks over the global RNG do not interleave across threads."""

from __future__ import annotations

import threading
import time

import torch

from flowpost.core.seeding import seeded


def test_a_second_thread_cannot_reseed_the_global_rng_inside_a_seeded_block() -> None:
    with seeded(1):
        expected = torch.rand(4)
    inside = threading.Event()
    drawn: list[torch.Tensor] = []

    def first() -> None:
        with seeded(1):
            head = torch.rand(2)
            inside.set()
            time.sleep(0.3)  # the other thread tries to seed now
            drawn.append(torch.cat([head, torch.rand(2)]))

    def second() -> None:
        inside.wait()
        with seeded(2):
            torch.rand(100)

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    torch.testing.assert_close(drawn[0], expected)


def test_the_global_rng_state_is_restored() -> None:
    state = torch.get_rng_state()
    with seeded(5):
        torch.rand(3)
    assert torch.equal(torch.get_rng_state(), state)
