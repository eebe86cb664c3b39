"""Node ``train.<stage>``: run a training stage as its own process group and follow its events."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flowpost.core.config.schema.pipeline import PipelineConfig
from flowpost.core.events import DoneEvent, Event, read_events, read_typed_events
from flowpost.core.process_group import failed_ranks, rank_error, rank_failure, rank_log
from flowpost.core.trainers.spec import PARENT_PID_ENV, StageSpec
from flowpost.errors import FlowpostError
from flowpost.tasks.conditions import encoder_settings

EventHandler = Callable[[Event], None]
POLL_SECONDS = 0.5
_RUNNING: set[subprocess.Popen[bytes]] = set()  # the stage processes this process started and still follows


def stage_spec(
    pipeline: PipelineConfig,
    stage: str,
    out_dir: Path,
    *,
    dataset_dir: Path | None,
    conditions_dir: Path | None,
    prompts_dir: Path | None = None,
    latents_dir: Path | None = None,
    encoder_fingerprint: str | None,
    init_from: Path | None,
    resume: bool = True,
) -> StageSpec:
    """The spec every rank of ``stage`` reads; ``extra["encoder"]`` records the cache's encoder."""
    extra: dict[str, Any] = {}
    if conditions_dir is not None and (Path(conditions_dir) / "encoder.json").is_file():
        extra["encoder"] = encoder_settings(Path(conditions_dir))
    return StageSpec(
        stage=stage,
        pipeline=pipeline.name,
        seed=pipeline.seed,
        smoke=pipeline.smoke,
        config=pipeline.stages[stage].model_dump(mode="json"),
        output_dir=str(out_dir),
        dataset_dir=str(dataset_dir) if dataset_dir else None,
        prompts_dir=str(prompts_dir) if prompts_dir else None,
        conditions_dir=str(conditions_dir) if conditions_dir else None,
        latents_dir=str(latents_dir) if latents_dir else None,
        encoder_fingerprint=encoder_fingerprint,
        init_from=str(init_from) if init_from else None,
        resume=resume,
        extra=extra,
    )


def run_training(spec: StageSpec, *, on_event: EventHandler | None = None) -> DoneEvent:
    """Start ``python -m flowpost.stage`` in its own session; relay events until it exits.

    Rank ``N`` writes ``logs/rank-N.log`` (with several processes the launcher writes
    ``logs/launcher.log``). A failure raises naming the failed rank and its last log lines; an
    interrupt kills the stage's processes, and so does ``launch.hang_timeout`` seconds without a
    new event (the stage is then reported as hung).
    """
    out = Path(spec.output_dir)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    spec_path = out / "stage.json"
    spec.write(spec_path)
    events_path = out / "events.jsonl"
    attempt_start = seen = len(read_events(events_path))  # earlier attempts' events stay before this
    for stale in failed_ranks(out):
        rank_error(out, stale).unlink()
    multi = spec.num_processes > 1
    log_path = out / "logs" / "launcher.log" if multi else rank_log(out, 0)
    # No preexec_fn: forking with one is unsafe in a threaded parent (Prefect runs tasks in
    # threads). The stage process ties its life to ours itself (see flowpost.stage).
    env = {
        **os.environ,
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS") or str(threads_per_process(spec)),
        PARENT_PID_ENV: str(os.getpid()),
    }
    with log_path.open("a") as log_file:
        process = subprocess.Popen(
            [sys.executable, "-m", "flowpost.stage", str(spec_path)],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
        )
        _RUNNING.add(process)
        hang_timeout = spec.launch.get("hang_timeout")
        last_event = time.monotonic()
        try:
            while process.poll() is None:
                now_seen = _relay(events_path, seen, on_event)
                if now_seen != seen:
                    seen, last_event = now_seen, time.monotonic()
                elif hang_timeout is not None and time.monotonic() - last_event > hang_timeout:
                    raise FlowpostError(
                        f"stage {spec.stage!r} emitted no event for {hang_timeout:g} s and was killed as hung; "
                        f"raise launch.hang_timeout if its steps are this slow; last log lines:\n{_tail(log_path)}",
                        where=str(log_path),
                    )
                time.sleep(POLL_SECONDS)
        except BaseException:
            _kill_group(process)
            raise
        finally:
            _RUNNING.discard(process)
    _relay(events_path, seen, on_event)
    failed = failed_ranks(out) if process.returncode != 0 else []
    if failed:
        rank, error = failed[0], rank_failure(out, failed[0])
        later = f" (then rank(s) {', '.join(map(str, failed[1:]))})" if failed[1:] else ""
        raise type(error)(
            f"stage {spec.stage!r}: rank {rank} failed{later}: {error}; "
            f"last lines of its log:\n{_tail(rank_log(out, rank))}",
            where=str(rank_log(out, rank)),
        )
    if process.returncode != 0:
        raise FlowpostError(
            f"stage {spec.stage!r} exited with code {process.returncode}; last log lines:\n{_tail(log_path)}",
            where=str(log_path),
        )
    done = [e for e in read_typed_events(events_path, start=attempt_start) if isinstance(e, DoneEvent)]
    if not done:
        raise FlowpostError(f"stage {spec.stage!r} exited without a 'done' event", where=str(events_path))
    return done[-1]


def threads_per_process(spec: StageSpec) -> int:
    """The CPU cores available to this process divided among the stage's processes (at least 1)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, cores // spec.num_processes)


def _tail(log_path: Path, lines: int = 15) -> str:
    return "\n".join(log_path.read_text(errors="replace").splitlines()[-lines:])


def _relay(path: Path, seen: int, on_event: EventHandler | None) -> int:
    """Hand the events after the first ``seen`` to ``on_event``; return how many there are now."""
    events = read_typed_events(path, start=seen)
    if on_event is not None:
        for event in events:
            on_event(event)
    return seen + len(events)


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM the stage's process group, SIGKILL it after 10 s; return once no member is alive."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        _signal_group(process.pid, sig)
        deadline = time.monotonic() + 10
        while alive := _group_alive(process.pid):
            if time.monotonic() > deadline:
                break
            process.poll()  # reap the leader as soon as it exits
            time.sleep(0.02)
        if not alive:
            break
    process.wait()


def stop_stages() -> None:
    """Stop every stage this process runs, each with its whole process group (SIGTERM, then SIGKILL)."""
    for process in list(_RUNNING):
        _kill_group(process)


def _signal_group(group: int, sig: signal.Signals) -> None:
    try:
        os.killpg(group, sig)
    except ProcessLookupError:
        pass


def _group_alive(group: int) -> bool:
    """Whether a process of ``group`` is still running (zombies awaiting their reaper do not count)."""
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    proc = Path("/proc")
    if not proc.is_dir():  # no way to tell zombies apart: the group is alive
        return True
    for stat in proc.glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[2] == str(group) and fields[0] != "Z":  # after the command: state, ppid, pgrp
            return True
    return False
