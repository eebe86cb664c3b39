"""Load on the reward server over loopback: concurrent clients, latency percentiles, nothing lost.

    python bench/reward_server_load.py [--workspace bench-ws] [--clients 16] [--requests 25] [--batch 4] [--max-open 64]

Serves a reward that echoes each sample's ``metadata["id"]`` as its score, so every answer can be
matched to its request: a request lost, answered twice or answered with another's scores is
counted. Each client is a ``RemoteReward`` (its own pooled connection) sending ``--requests``
batches of ``--batch`` 64x64 RGB images; requests over the server's ``--max-open`` are answered 503
and retried with backoff by the client. Prints p50 / p99 latency, requests per second and the
error counts as one JSON line (also written to ``WORKSPACE/reward_server_load.json``); bounded by
``--clients * --requests`` requests and a per-request timeout.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from flowpost.core.io import write_json_atomic
from flowpost.core.rewards.remote import RemoteReward
from flowpost.core.rewards.server import Limits, serve_reward
from flowpost.errors import FlowpostError


class EchoIds:
    """Scores each sample with its ``metadata["id"]``."""

    name = "echo-ids"

    def __call__(self, media: Tensor, prompts: list[str], metadata: list[dict[str, Any]]) -> Tensor:
        return torch.tensor([float(m["id"]) for m in metadata])


def load(clients: int, requests: int, batch: int, max_open: int) -> dict[str, Any]:
    """Run the load and summarise it."""
    server = serve_reward(EchoIds(), limits=Limits(max_open_requests=max_open))
    latencies: list[float] = []
    wrong: list[int] = []
    failed: list[str] = []
    answered: dict[int, int] = {}
    guard = threading.Lock()
    media = torch.rand(batch, 3, 64, 64, generator=torch.Generator().manual_seed(0))

    def client(index: int) -> None:
        remote = RemoteReward(server.url, timeout=30.0, retries=8, backoff=0.05)  # a 503 is retried
        for request in range(requests):
            ids = [(index * requests + request) * batch + i for i in range(batch)]
            started = time.perf_counter()
            try:
                scores = remote(media, ["p"] * batch, [{"id": i} for i in ids]).tolist()
            except FlowpostError as exc:
                with guard:
                    failed.append(str(exc)[:120])
                continue
            with guard:
                latencies.append(time.perf_counter() - started)
                if scores != [float(i) for i in ids]:
                    wrong.append(ids[0])
                for i in ids:
                    answered[i] = answered.get(i, 0) + 1

    with server.running():
        started = time.perf_counter()
        threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        seconds = time.perf_counter() - started
    total = clients * requests
    latencies.sort()
    return {
        "clients": clients,
        "requests": total,
        "batch": batch,
        "ok": len(latencies),
        "failed": len(failed),
        "first_failure": failed[0] if failed else None,
        "wrong_answers": len(wrong),
        "answered_twice": sum(1 for count in answered.values() if count > 1),
        "lost": total * batch - len(answered) - len(failed) * batch,
        "p50_ms": round(1000 * statistics.median(latencies), 2) if latencies else None,
        "p99_ms": round(1000 * latencies[int(0.99 * (len(latencies) - 1))], 2) if latencies else None,
        "requests_per_s": round(len(latencies) / seconds, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workspace", type=Path, default=Path("bench-ws"))
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--requests", type=int, default=25)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--max-open", type=int, default=64)
    args = parser.parse_args(argv)
    summary = load(args.clients, args.requests, args.batch, args.max_open)
    print(json.dumps(summary))
    args.workspace.mkdir(parents=True, exist_ok=True)
    write_json_atomic(args.workspace / "reward_server_load.json", summary)
    clean = summary["failed"] == summary["wrong_answers"] == summary["answered_twice"] == summary["lost"] == 0
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())
