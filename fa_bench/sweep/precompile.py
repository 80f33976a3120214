"""Compile a sweep's configs in parallel before any of them is timed.

On the H200 (2026-11-29) compilation took 264 s of a 507 s sweep: the timing worker
builds one config at a time while 15 of 16 cores idle. Here a pool of processes builds
every point first, each through the same builder as the timing worker (the `triton`
implementation's prepare: one call on the case's own inputs, so the specialisation
matches). Triton keeps what it compiles in its on-disk cache, where the timing worker
then finds it, so the worker's build becomes a cache load.

Nothing here is timed and nothing here is trusted: a build that fails is simply left for
the timing worker, which records the error as before; a pool that breaks (or a deadline
that passes) ends the phase with a warning, and the sweep goes on unchanged.

Points that differ only in sequence length share most kernels, so they go to the same
process, one group per (mode, dtype, head_dim, causal, heads, config): its first build
compiles, the rest mostly hit the process's own cache.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from multiprocessing import active_children, get_context
from typing import TYPE_CHECKING

from fa_bench.run.lifeline import set_death_signal
from fa_bench.sweep.space import Point
from fa_bench.words import plural

if TYPE_CHECKING:
    from rich.console import Console

    from fa_bench.run.runner import RunOptions

Progress = Callable[[int, int], None]  # (groups done, groups total)


def default_jobs(device: str) -> int:
    """Processes for the compile phase: none on a CPU (the interpreter compiles nothing)."""
    if device != "cuda":
        return 0
    return max(1, min(8, (os.cpu_count() or 2) - 1))


def compile_groups(points: Sequence[Point]) -> list[list[Point]]:
    """The points to build, grouped so that each group's kernels are shared."""
    groups: dict[tuple, list[Point]] = {}
    for p in points:
        if p.pruned:
            continue
        c = p.case
        key = (c.mode.value, c.dtype.value, c.head_dim, c.causal, c.heads_q, c.heads_kv,
               tuple(sorted(p.fields.items())))  # fmt: skip
        groups.setdefault(key, []).append(p)
    return list(groups.values())


def _init(gpu: int | None) -> None:
    # A builder dies with the sweep (fa_bench.run.lifeline), and leaves a terminal's
    # Ctrl-C to it: the sweep stops the builds (terminate) and reports the stop once.
    set_death_signal()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Before torch is imported in this process, as the timing worker pins its GPU.
    if gpu is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = str(gpu)


def _build_group(device: str, items: list[tuple[str, dict, dict]]) -> list[tuple[str, float, str]]:
    """Build each (point id, case dict, fields); returns (id, seconds, error or "")."""
    import torch

    from fa_bench import registry
    from fa_bench.case import Case
    from fa_bench.run.execute import make_inputs
    from fa_bench.run.fp8_inputs import case_inputs

    registry.load()
    impl = registry.get("triton")
    dev = torch.device(device)
    out = []
    for point_id, case_dict, fields in items:
        case = Case.from_dict(case_dict)
        t0 = time.perf_counter()
        try:
            q, k, v, _ = make_inputs(case, dev)
            q, k, v, options, _ = case_inputs(case, q, k, v, {"config": fields})  # fp8: quantised
            impl.prepare(case, q, k, v, options)
            error = ""
        except Exception as exc:  # the timing worker meets it again and records it
            error = f"{type(exc).__name__}: {exc}"[:300]
        out.append((point_id, round(time.perf_counter() - t0, 4), error))
    return out


def precompile(
    groups: Sequence[Sequence[Point]],
    *,
    device: str,
    gpu: int | None,
    jobs: int,
    deadline_s: float | None = None,
    on_progress: Progress | None = None,
) -> tuple[dict[str, dict], dict]:
    """Build the points of `groups` (from `compile_groups`) with `jobs` processes, a group
    to a task.

    Returns ({point id: {"compile_s", "error"}}, a summary for sweep.json's `run`)."""
    summary: dict[str, object]
    summary = {"jobs": jobs, "groups": len(groups), "wall_s": 0.0, "stopped": None}
    if jobs < 1 or not groups:
        return {}, summary
    dev = "cuda" if device == "cuda" else "cpu"
    built: dict[str, dict] = {}
    start = time.monotonic()
    before = set(active_children())
    pool = ProcessPoolExecutor(jobs, mp_context=get_context("spawn"), initializer=_init,
                               initargs=(gpu,))  # fmt: skip
    try:
        pending = {
            pool.submit(_build_group, dev, [(p.id, p.case.to_dict(), dict(p.fields)) for p in g])
            for g in groups
        }
        deadline_at = None if deadline_s is None else start + deadline_s
        summary["stopped"] = _collect(pending, built, deadline_at, len(groups), on_progress)
    except Exception as exc:  # a broken pool must not cost the sweep its measurements
        summary["stopped"] = f"{type(exc).__name__}: {exc}"[:300]
    except KeyboardInterrupt:  # a stop signal: the builds stop now, not when they finish
        summary["stopped"] = "interrupted"
        raise
    finally:
        if summary["stopped"]:
            # Builds still running would compete with the timing for CPU and GPU. The pool
            # has no public way to stop them before Python 3.14 (terminate_workers), but
            # its workers are this process's new multiprocessing children.
            for proc in set(active_children()) - before:
                proc.terminate()
        pool.shutdown(wait=True, cancel_futures=True)
    summary["wall_s"] = round(time.monotonic() - start, 2)
    summary["built"] = len(built)
    summary["failed"] = sum(1 for b in built.values() if b["error"])
    return built, summary


def _collect(
    pending: set[Future],
    built: dict[str, dict],
    deadline_at: float | None,
    total: int,
    on_progress: Progress | None,
) -> str | None:
    """Record each finished group's builds in `built` until every group is done (None) or
    the monotonic clock passes `deadline_at` ("deadline")."""
    done_groups = 0
    while pending:
        left = None if deadline_at is None else deadline_at - time.monotonic()
        if left is not None and left <= 0:
            return "deadline"
        done, pending = wait(pending, timeout=left, return_when=FIRST_COMPLETED)
        for fut in done:
            for point_id, seconds, error in fut.result():
                built[point_id] = {"compile_s": seconds, "error": error or None}
            done_groups += 1
        if on_progress:
            on_progress(done_groups, total)
    return None


def compile_phase(
    jobs: int,
    points: list[Point],
    options: RunOptions,
    budget_s: float | None,
    console: Console,
    err_console: Console,
) -> tuple[dict, dict]:
    """Build every config in parallel first (`precompile`, with a bar); ({}, summary) when
    there is nothing to do. Never fatal: the timing worker builds whatever is missing."""
    from rich import progress as rp
    from rich.text import Text

    groups = compile_groups(points)
    n = len(groups)
    if jobs < 1 or n == 0:
        return {}, {"jobs": 0, "groups": n, "wall_s": 0.0, "stopped": None}
    # A live bar only on a terminal: in a log it is escape codes, so there a plain line
    # every tenth of the groups (a GPU's phase can take minutes: a log shows it is alive).
    live = console.is_terminal
    columns = (rp.BarColumn(), rp.MofNCompleteColumn(), rp.TimeElapsedColumn())
    bar = rp.Progress("compiling", *columns, console=console, disable=not live)
    step, t0, shown = max(1, n // 10), time.monotonic(), [0]

    def on_progress(done: int, total: int) -> None:
        bar.update(task, completed=done)
        if not live and done > shown[0] and (done % step == 0 or done == total):
            shown[0] = done
            console.print(f"compiling {done}/{total} groups, {time.monotonic() - t0:.0f} s",
                          highlight=False)  # fmt: skip

    with bar:
        task = bar.add_task("compile", total=n)
        built, summary = precompile(
            groups, device=options.device, gpu=options.gpu, jobs=jobs,
            deadline_s=compile_deadline(budget_s, options.timeout_s, n, jobs),
            on_progress=on_progress,
        )  # fmt: skip
    procs = plural(jobs, "process", "processes")
    console.print(f"compiled {plural(summary.get('built', 0), 'config')} "
                  f"({plural(n, 'group')}) with {procs} in {summary['wall_s']:.0f} s; "
                  f"{summary.get('failed', 0)} failed and are left to the timing "
                  "worker")  # fmt: skip
    if summary["stopped"]:
        err_console.print(Text.assemble(("warning:", "yellow"), " compile phase stopped early "
                                        f"({summary['stopped']}); the timing worker builds "
                                        "the rest"))  # fmt: skip
    return built, summary


def compile_deadline(budget_s: float | None, timeout_s: float, groups: int, jobs: int) -> float:
    """At most half the budget, so that the timing keeps the rest; without one, a generous
    20 s per group per process (H200 builds took 1-3 s), so one hung build cannot stall the
    sweep. What is not built by then is built by the timing worker, under its timeout."""
    if budget_s is not None:
        return budget_s / 2
    return max(timeout_s, 20.0 * groups / jobs)
