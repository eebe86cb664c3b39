"""A stage's ranks: ``torchrun`` run inside the stage process, topology from the environment.

``launch.num_processes`` counts processes over all machines. Topology is never part of the pipeline
(nor of a fingerprint): ``flowpost run`` flags set the ``FLOWPOST_*`` variables below, which every
process of the stage reads.
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from flowpost.core.io import read_json, write_json_atomic
from flowpost.core.trainers.spec import PARENT_PID_ENV
from flowpost.errors import FlowpostError, TransientError

NUM_MACHINES_ENV = "FLOWPOST_NUM_MACHINES"
MACHINE_RANK_ENV = "FLOWPOST_MACHINE_RANK"
MAIN_PROCESS_IP_ENV = "FLOWPOST_MAIN_PROCESS_IP"
MAIN_PROCESS_PORT_ENV = "FLOWPOST_MAIN_PROCESS_PORT"


@dataclass(frozen=True)
class Topology:
    """Where this machine sits in a multi-machine stage (one machine by default)."""

    num_machines: int = 1
    machine_rank: int = 0
    main_process_ip: str = "127.0.0.1"
    main_process_port: int = 29500

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Topology:
        env = os.environ if environ is None else environ
        try:
            topology = cls(
                num_machines=int(env.get(NUM_MACHINES_ENV, 1)),
                machine_rank=int(env.get(MACHINE_RANK_ENV, 0)),
                main_process_ip=env.get(MAIN_PROCESS_IP_ENV, "127.0.0.1"),
                main_process_port=int(env.get(MAIN_PROCESS_PORT_ENV, 29500)),
            )
        except ValueError as exc:
            raise FlowpostError(f"bad topology variable: {exc}", where=NUM_MACHINES_ENV) from exc
        if topology.num_machines < 1:
            raise FlowpostError(f"{topology.num_machines} machines; give 1 or more", where="--num-machines")
        if not 0 <= topology.machine_rank < topology.num_machines:
            raise FlowpostError(
                f"machine rank {topology.machine_rank} is outside 0..{topology.num_machines - 1}",
                where="--machine-rank",
            )
        if not 0 < topology.main_process_port < 65536:
            raise FlowpostError(f"port {topology.main_process_port} is outside 1..65535", where="--main-process-port")
        return topology

    def to_env(self) -> dict[str, str]:
        return {
            NUM_MACHINES_ENV: str(self.num_machines),
            MACHINE_RANK_ENV: str(self.machine_rank),
            MAIN_PROCESS_IP_ENV: self.main_process_ip,
            MAIN_PROCESS_PORT_ENV: str(self.main_process_port),
        }


def export_topology(
    num_machines: int | None = None,
    machine_rank: int | None = None,
    main_process_ip: str | None = None,
    main_process_port: int | None = None,
) -> Topology:
    """Override the ``FLOWPOST_*`` topology variables every stage process reads with the values
    given, check the result, and return it."""
    given = {
        "num_machines": num_machines,
        "machine_rank": machine_rank,
        "main_process_ip": main_process_ip,
        "main_process_port": main_process_port,
    }
    topology = replace(Topology.from_env(), **{k: v for k, v in given.items() if v is not None})
    os.environ.update(Topology.from_env(topology.to_env()).to_env())  # validated
    return topology


def torchrun_arguments(entry: str, spec_path: str | Path, num_processes: int, topology: Topology) -> list[str]:
    """``torchrun`` arguments starting this machine's share of ``num_processes`` ranks of module ``entry``."""
    if num_processes % topology.num_machines:
        raise FlowpostError(
            f"{num_processes} processes do not split evenly over {topology.num_machines} machines",
            where="launch.num_processes",
        )
    per_machine = str(num_processes // topology.num_machines)
    if topology.num_machines == 1:
        rendezvous = ["--standalone"]
    else:
        rendezvous = [
            f"--nnodes={topology.num_machines}",
            f"--node-rank={topology.machine_rank}",
            f"--master-addr={topology.main_process_ip}",
            f"--master-port={topology.main_process_port}",
        ]
    return [*rendezvous, f"--nproc-per-node={per_machine}", "-m", entry, str(spec_path)]


def launch_ranks(entry: str, spec_path: str | Path, output_dir: str | Path, num_processes: int) -> int:
    """Run this machine's ranks of module ``entry`` to completion; 0 when all succeeded.

    A rank killed by a signal (a native abort, the OOM killer) records nothing itself: its failure
    is recorded here, so the orchestrator names it rather than the peers that lost their connection.
    """
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun

    os.environ[PARENT_PID_ENV] = str(os.getpid())  # ranks follow this process, as it follows its parent
    try:
        torchrun(torchrun_arguments(entry, spec_path, num_processes, Topology.from_env()))
    except ChildFailedError as failed:
        for rank, failure in failed.failures.items():
            name = failure.signal_name() if failure.exitcode < 0 else None
            # SIGTERM is torchrun's own: it ends the surviving ranks once one has failed
            if name not in (None, "SIGTERM") and not rank_error(output_dir, rank).exists():
                message = f"killed by {name} (no Python error: a native crash, the out-of-memory killer or a kill)"
                _write_rank_error(output_dir, rank, message, signal=name)
        return 1
    return 0


def rank_log(output_dir: str | Path, rank: int) -> Path:
    return Path(output_dir) / "logs" / f"rank-{rank}.log"


def rank_error(output_dir: str | Path, rank: int) -> Path:
    return Path(output_dir) / "logs" / f"rank-{rank}.error"


def record_rank_failure(output_dir: str | Path, rank: int, exc: BaseException) -> None:
    """Leave the rank's error where the orchestrator looks for it (JSON: message, transient)."""
    text = str(exc) if isinstance(exc, FlowpostError) else "".join(traceback.format_exception(exc))
    _write_rank_error(output_dir, rank, text, transient=isinstance(exc, TransientError))


def _write_rank_error(
    output_dir: str | Path, rank: int, message: str, *, transient: bool = False, signal: str | None = None
) -> None:
    record = {"message": message, "transient": transient, **({"signal": signal} if signal else {})}
    write_json_atomic(rank_error(output_dir, rank), record)


def rank_failure(output_dir: str | Path, rank: int) -> FlowpostError:
    """The error rank ``rank`` recorded, as ``TransientError`` when it may pass on retry."""
    try:
        recorded = read_json(rank_error(output_dir, rank), what="rank error")
        message, transient = str(recorded["message"]), bool(recorded.get("transient"))
    except (FlowpostError, KeyError, TypeError):
        message, transient = "its error record is unreadable", False
    last_line = message.strip().splitlines()[-1] if message.strip() else "no message"
    return (TransientError if transient else FlowpostError)(last_line)


def failed_ranks(output_dir: str | Path) -> list[int]:
    """Ranks that recorded a failure, the cause first: ranks killed by a signal, then by first failure
    (a rank's failure ends its peers' collectives, and they record their lost connections)."""
    found = []
    for path in Path(output_dir, "logs").glob("rank-*.error"):
        try:
            signalled = "signal" in read_json(path, what="rank error")
        except FlowpostError:
            signalled = False
        found.append((not signalled, path.stat().st_mtime_ns, int(path.stem.removeprefix("rank-"))))
    return [rank for *_, rank in sorted(found)]
