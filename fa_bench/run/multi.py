"""Runs split into parts: one per GPU (`--gpus`) or one per launched rank (torchrun, srun).

A part is an ordinary run folder with its own plan, journal and results. Parts of one
node run concurrently, one thread each driving its own worker pinned to its GPU; a
failure on one GPU never stops the others. `layout.json` in the top folder records the
parts so `--resume` can finish all of them.
"""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from fa_bench.results.files import JournalWriteError
from fa_bench.run.distributed import part_dir, shard
from fa_bench.run.plan import Plan, PlanError, load_plan, run_plan
from fa_bench.run.runner import ProgressFn, WorkerPluginError

LAYOUT = "layout.json"
LAYOUT_SCHEMA = "fa-bench-layout/1"


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


def run_parts(parts: Sequence[Part], on_event: ProgressFn | None) -> list[tuple[dict | None, bool]]:
    """Run the parts concurrently; returns (worker env, interrupted) per part.

    Ctrl-C reaches only the main thread: it sets a stop event that every part's runner
    checks, so each part stops cleanly and keeps its journal.
    """
    if len(parts) == 1:
        return [run_plan(parts[0].plan, parts[0].out, on_event)]
    stop = threading.Event()
    outcomes: list[tuple[dict | None, bool]] = [(None, True)] * len(parts)
    write_errors: list[JournalWriteError | WorkerPluginError] = []

    def work(n: int) -> None:
        try:
            outcomes[n] = run_plan(parts[n].plan, parts[n].out, on_event, stop=stop)
        except (JournalWriteError, WorkerPluginError) as exc:
            # A full disk or a plugin the worker cannot import stops every part; reported after.
            write_errors.append(exc)
            stop.set()

    threads = [threading.Thread(target=work, args=(n,), daemon=True) for n in range(len(parts))]
    for t in threads:
        t.start()
    try:
        for t in threads:
            while t.is_alive():
                t.join(timeout=0.5)
    except KeyboardInterrupt:
        stop.set()
        for t in threads:
            t.join()
    if write_errors:
        raise write_errors[0]
    return outcomes
