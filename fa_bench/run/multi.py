"""Runs split into parts: one per GPU (`--gpus`) or one per launched rank (torchrun, srun).

A part is an ordinary run folder with its own plan, journal and results. Parts of one
node run concurrently, one thread each driving its own worker pinned to its GPU; a
failure on one GPU never stops the others. `layout.json` in the top folder records the
parts so `--resume` can finish all of them.
"""

from __future__ import annotations

import copy
import json
import os
import signal
import threading
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol, runtime_checkable

from fa_bench.errors import UsageError
from fa_bench.results.files import JournalWriteError
from fa_bench.run.distributed import part_dir, shard
from fa_bench.run.plan import Plan, PlanError, load_plan, run_plan
from fa_bench.run.runner import ProgressFn

LAYOUT = "layout.json"
LAYOUT_SCHEMA = "fa-bench-layout/1"
# A test hook, not a feature: with `--device cpu` (or no GPU) and this variable set to N,
# `--gpus` runs N parts on the CPU as if they were GPUs 0..N-1, so the tests can drive the
# multi-GPU path (threads, per-GPU progress, signals, the merge) without GPUs. Nothing
# else reads it, and it has no effect on a CUDA run.
FAKE_GPUS_ENV = "FA_BENCH_TEST_FAKE_GPUS"


@dataclass
class Part:
    index: int  # GPU index (kind "gpu") or rank (kind "rank")
    plan: Plan
    out: Path


def parse_gpus(spec: str, visible: int) -> list[int]:
    """'all' or a comma-separated list of GPU indices among the visible ones."""
    if visible < 1:
        raise PlanError(f"--gpus {spec}: no CUDA device is visible")
    if spec.strip() == "all":
        return list(range(visible))
    try:
        indices = [int(s) for s in spec.split(",") if s.strip()]
    except ValueError:
        raise PlanError(f"--gpus {spec!r}: give 'all' or indices like 0,3,5") from None
    bad = [i for i in indices if not 0 <= i < visible]
    if not indices or bad or len(set(indices)) != len(indices):
        raise PlanError(
            f"--gpus {spec!r}: need distinct indices in 0..{visible - 1} ({visible} visible)"
        )
    return indices


def fake_gpus(device: str) -> int:
    """How many CPU "GPUs" the test hook FA_BENCH_TEST_FAKE_GPUS asks for (0: none)."""
    value = os.environ.get(FAKE_GPUS_ENV, "")
    if device != "cpu" or not value:
        return 0
    if not value.isdigit() or int(value) < 1:
        raise PlanError(f"{FAKE_GPUS_ENV}={value!r}: give a positive integer (a test hook)")
    return int(value)


def split(plan: Plan, out: Path, kind: str, indices: Sequence[int], spread: bool) -> list[Part]:
    """One part per index: all cases each (replicate) or a round-robin share (spread)."""
    parts = []
    for n, index in enumerate(indices):
        cases = shard(plan.cases, n, len(indices)) if spread else list(plan.cases)
        options = replace(plan.options, gpu=index) if kind == "gpu" else plan.options
        run = copy.deepcopy(plan.run)
        run["part"] = {"kind": kind, "index": index, "of": len(indices),
                       "mode": "spread" if spread else "replicate"}  # fmt: skip
        parts.append(
            Part(index, Plan(run=run, options=options, cases=cases), part_dir(out, kind, index))
        )
    return parts


def save_layout(out: Path, kind: str, parts: Sequence[Part], spread: bool) -> None:
    out.mkdir(parents=True, exist_ok=True)
    doc = {"schema": LAYOUT_SCHEMA, "kind": kind, "mode": "spread" if spread else "replicate",
           "parts": [p.index for p in parts]}  # fmt: skip
    (out / LAYOUT).write_text(json.dumps(doc, indent=1), encoding="utf-8")


def load_layout(out: Path) -> tuple[str, bool, list[Part]] | None:
    """(kind, spread, parts) of a multi-part run folder, or None for a single run."""
    path = out / LAYOUT
    if not path.exists():
        return None
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        kind, indices = doc["kind"], doc["parts"]
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as exc:
        raise PlanError(f"{path}: unreadable layout: {exc}") from None
    if not isinstance(indices, list) or not all(isinstance(i, int) for i in indices):
        raise PlanError(f"{path}: unreadable layout: 'parts' must be a list of integers")
    parts = [Part(i, load_plan(part_dir(out, kind, i)), part_dir(out, kind, i)) for i in indices]
    return kind, doc.get("mode") == "spread", parts


@runtime_checkable
class PartListener(Protocol):
    """Progress per part (fa_bench.part_progress.PartsProgress): each part's ProgressFn and
    word of a part that ended ("done", "stopped", "stopped by an error: ...")."""

    def for_part(self, n: int) -> ProgressFn: ...

    def ended(self, n: int, how: str) -> None: ...


def run_parts(
    parts: Sequence[Part], on_event: ProgressFn | PartListener | None
) -> list[tuple[dict | None, bool]]:
    """Run the parts concurrently; returns (worker env, interrupted) per part.

    A stop signal (Ctrl-C, SIGTERM, SIGHUP: fa_bench.run.interrupts) reaches only the main
    thread: it sets a stop event that every part's runner checks, so each part stops its
    worker and keeps its journal. A part that fails with a bug of ours is reported with
    its GPU and counted as interrupted (`--resume` finishes it); the others go on. A full
    disk or a plugin that cannot load (a UsageError) would fail every part the same way:
    it stops them all and is raised here.
    """
    listener = on_event if isinstance(on_event, PartListener) else None

    def events(n: int) -> ProgressFn | None:
        return listener.for_part(n) if listener is not None else on_event  # type: ignore[return-value]

    def ended(n: int, how: str) -> None:
        if listener is not None:
            listener.ended(n, how)

    if len(parts) == 1:
        outcome = run_plan(parts[0].plan, parts[0].out, events(0))
        ended(0, "stopped" if outcome[1] else "done")
        return [outcome]
    stop = threading.Event()
    outcomes: list[tuple[dict | None, bool]] = [(None, True)] * len(parts)
    finished = [threading.Event() for _ in parts]
    fatal: list[Exception] = []

    def work(n: int) -> None:
        _unblock_stop_signals()  # the worker this thread starts must not inherit the block
        try:
            outcomes[n] = run_plan(parts[n].plan, parts[n].out, events(n), stop=stop)
            ended(n, "stopped" if outcomes[n][1] else "done")
        except (JournalWriteError, UsageError) as exc:
            fatal.append(exc)
            stop.set()
            ended(n, f"stopped: {exc}")
        except Exception as exc:  # a bug: this part stops, the others go on
            ended(n, f"stopped by an error: {type(exc).__name__}: {exc}")
        finally:
            finished[n].set()

    threads = [threading.Thread(target=work, args=(n,), daemon=True) for n in range(len(parts))]
    # Waited for through `finished`, not Thread.join: a join cut short by a signal can leave
    # the thread marked ended while it still runs (CPython before 3.13), and the results
    # would then be written while a part is still stopping its worker.
    try:
        _start_all(threads)
        for done in finished:
            while not done.wait(0.5):
                pass
    except KeyboardInterrupt:  # interrupts.Interrupted too: SIGTERM, SIGHUP
        stop.set()
        for done in finished:
            done.wait()
    if fatal:
        raise fatal[0]
    return outcomes


_STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}


def _start_all(threads: Sequence[threading.Thread]) -> None:
    """Start every part's thread with the stop signals held back: a signal while one starts
    would leave it running unseen (its `finished` never waited for); held, the signal lands
    once all have started, and stops them all."""
    block = (
        hasattr(signal, "pthread_sigmask") and threading.current_thread() is threading.main_thread()
    )
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS) if block else None
    try:
        for t in threads:
            t.start()
    finally:
        if old is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _unblock_stop_signals() -> None:
    # A thread inherits the mask of the one that started it (blocked in _start_all).
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)
