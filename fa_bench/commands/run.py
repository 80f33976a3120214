"""The core of `fa-bench run`, behind the thin Typer command in cli.py."""

from __future__ import annotations

import contextlib
import sys
from contextvars import ContextVar
from pathlib import Path
from typing import TextIO

from rich.console import Console
from rich.panel import Panel
from rich.text import Text

from fa_bench.commands.run_plan import (  # cli.py, sweep.py and tests import these from here
    RunRequest,
    interleave_impls,  # noqa: F401
    plan_new,
    resolve_device,  # noqa: F401
    resume_plan,
    split_new,
    warn_cannot_run,
)
from fa_bench.commands.run_summary import summary_doc, write_summary
from fa_bench.console import make_progress, print_summary
from fa_bench.errors import UsageError, print_error
from fa_bench.part_progress import MergeWait, parts_progress
from fa_bench.results.files import (
    JOURNAL,
    WRITE_ERROR_EXIT,
    JournalWriteError,
    read_journal,
    scan_journal,
    write_results,
)
from fa_bench.run import plugin_files
from fa_bench.run.distributed import Merged, Rank, detect, part_dir, tie_to_launcher, wait_and_merge
from fa_bench.run.folder_lock import FolderLock
from fa_bench.run.interrupts import InterruptGuard
from fa_bench.run.limits import estimate_s, human_duration
from fa_bench.run.multi import Part, run_parts
from fa_bench.run.plan import exit_code, finish, ordered_records
from fa_bench.words import plural

# --json: the real stdout, while sys.stdout points at stderr (run_command)
_JSON_OUT: ContextVar[TextIO | None] = ContextVar("run_json_out", default=None)

# The planning steps' names before they moved to run_plan.py: tests import them from here.
_plan_new, _resume = plan_new, resume_plan


def _announce(
    parts: list[Part], kind: str, spread: bool, rank: Rank, out: Path, console: Console
) -> tuple[int, int]:
    """Say where the cases run and how many are left; returns (total, already done)."""
    if parts[0].plan.options.device == "cpu":
        # soft_wrap=False: wrapped inside its box, also on the soft-wrap stderr console
        console.print(Panel("Running on the CPU: these timings show that the cases run and are "
                            "correct; they say nothing about GPU performance.",
                            style="yellow", title="CPU run"), soft_wrap=False)  # fmt: skip
    total = sum(len(p.plan.cases) for p in parts)
    done = sum(
        len({r.id for r in read_journal(p.out)} & {c.id for c in p.plan.cases}) for p in parts
    )
    where = {"single": "", "gpu": f" on GPUs {', '.join(str(p.index) for p in parts)}",
             "rank": f" as rank {rank.rank} of {rank.world_size}"}[kind]  # fmt: skip
    mode = f" ({'spread' if spread else 'replicate'})" if kind != "single" else ""
    console.print(f"{plural(total, 'case')} ({done} already done){where}{mode} → {out}",
                  markup=False)  # fmt: skip
    opts, longest = parts[0].plan.options, max(len(p.plan.cases) for p in parts)  # in parallel
    guess = estimate_s(
        min(longest, total - done), opts.timing, opts.telemetry and opts.device == "cuda"
    )
    console.print(f"estimate: at most about {human_duration(guess)} (docs/suites.md)", markup=False)
    return total, done


def run_command(req: RunRequest, *, console: Console, err_console: Console) -> int:
    """Plan (or resume), execute with progress, write results; returns the exit code."""
    if not req.json:
        return _run(req, console=console, err_console=err_console)
    # stdout holds only the JSON summary: the human output, and anything a plugin prints
    # while it loads or is checked here, goes to stderr meanwhile.
    token = _JSON_OUT.set(sys.stdout)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            return _run(req, console=err_console, err_console=err_console)
    finally:
        _JSON_OUT.reset(token)


def _run(req: RunRequest, *, console: Console, err_console: Console) -> int:
    try:
        rank = detect()
        tie_to_launcher(rank)  # a rank stops (exit 143) when torchrun dies
        if req.resume:
            kind, spread, parts, out = resume_plan(req, rank, req.resume, console)
        else:
            plan, out = plan_new(req, console)
            warn_cannot_run(plan, err_console)
            kind, spread, parts = split_new(req, plan, out, rank)
        plugin_files.warn_broken(err_console)  # a broken package plugin: the rest runs
        # One writer per folder: a rank owns its part folder, the others the whole one.
        lock = FolderLock(parts[0].out if kind == "rank" else out,
                          "--resume" if req.resume else "--out")  # fmt: skip
        with lock, InterruptGuard() as guard:
            return _execute(req, kind, spread, parts, rank, out, guard,
                            console=console, err_console=err_console)  # fmt: skip
    except UsageError as exc:
        return print_error(err_console, exc)
    except JournalWriteError as exc:
        print_error(err_console, f"{exc.strerror}; every case journaled before it is kept; "
                    f"fix that, then finish with: fa-bench run --resume {out}")  # fmt: skip
        return WRITE_ERROR_EXIT


def _execute(
    req: RunRequest,
    kind: str,
    spread: bool,
    parts: list[Part],
    rank: Rank,
    out: Path,
    guard: InterruptGuard,
    *,
    console: Console,
    err_console: Console,
) -> int:
    """Run the parts, write the results (Ctrl-C held meanwhile) and the report."""
    for p in parts:
        warning = scan_journal(p.out).warning(p.out / JOURNAL)
        if warning:
            err_console.print(Text.assemble(("warning:", "yellow"), " ", warning))
    total, done = _announce(parts, kind, spread, rank, out, console)
    progress = (
        make_progress(console, total=total, already_done=done)
        if kind == "single"
        else parts_progress(console, parts, kind)
    )  # a row or line per GPU / rank
    with progress:
        outcomes = run_parts(parts, progress)
    guard.hold()  # from here a Ctrl-C cannot cut results.json or results.csv short
    written = [
        finish(p.plan, p.out, env, intr) for p, (env, intr) in zip(parts, outcomes, strict=True)
    ]
    interrupted = any(intr for _, intr in outcomes)
    missing: list[int] = []
    if kind == "single":
        json_path, csv_path = written[0]
        records = ordered_records(parts[0].plan, out)
        env = parts[0].plan.run.get("env")  # finish() put the worker's there
    elif kind == "rank" and rank.rank != 0:
        console.print(f"rank {rank.rank}: results in {parts[0].out}; rank 0 merges", markup=False)
        if interrupted:  # a stop signal: this rank's finished cases are kept, say how to go on
            err_console.print(Text(f"interrupted ({guard.reason}); {_resume_hint(kind, out)}",
                                   style="yellow"))  # fmt: skip
            return guard.exit_code
        return exit_code(ordered_records(parts[0].plan, parts[0].out))
    else:
        merged = _merge(req, kind, spread, parts, rank, out, guard, interrupted, console)
        if merged is None:
            err_console.print(Text(f"interrupted while merging; this part's results are in "
                                   f"{parts[0].out}", style="yellow"))  # fmt: skip
            return guard.exit_code
        missing = merged.missing
        json_path, csv_path = write_results(out, merged.doc)
        records = merged.doc.cases
        env = merged.doc.env  # each part's under env.parts, for its own records
    print_summary(console, records, env)
    console.print(f"results: {json_path}\n         {csv_path}", markup=False,  # paths: not markup
                  soft_wrap=True)  # fmt: skip
    if missing:
        err_console.print(f"[red]missing {kind}s[/]: {missing} did not finish in time")
    # A signal beyond the one that stopped the cases came while the results were written.
    extra = guard.count - (1 if interrupted else 0) > 0
    interrupted = interrupted or extra
    report = None
    if req.report:
        report = _report(json_path, guard, extra, console=console, err_console=err_console)
    if interrupted:
        kept = f": {len(records)} of {plural(total, 'case')} kept; {_resume_hint(kind, out)}"
        err_console.print(Text.assemble((guard.headline, "yellow"), kept))
        code = guard.exit_code  # 128 + the signal: 130 Ctrl-C, 143 SIGTERM, 129 SIGHUP
    else:
        code = 1 if missing else exit_code(records)
    if req.json:
        files = {"results_json": json_path, "results_csv": csv_path, "report_html": report}
        doc = summary_doc(records, out=out, total=total, written=files, exit_code=code,
                          interrupted=interrupted, missing=missing, env=env)  # fmt: skip
        write_summary(_JSON_OUT.get() or sys.stdout, doc)
    return code


def _resume_hint(kind: str, out: Path) -> str:
    if kind == "rank":  # every rank finishes its own part: relaunch them all
        return f"finish with the same launcher (torchrun/srun) running: fa-bench run --resume {out}"
    return f"finish with: fa-bench run --resume {out}"


def _merge(
    req: RunRequest, kind: str, spread: bool, parts: list[Part], rank: Rank, out: Path,
    guard: InterruptGuard, interrupted: bool, console: Console,
) -> Merged | None:  # fmt: skip
    """The parts merged, or None when a stop signal ended the wait for the other ranks
    (which can be long: unlike the writing of results, it may be interrupted). Rank 0
    says whom it waits for; once stopped itself, it merges what has ended, without waiting."""
    indices = [p.index for p in parts] if kind == "gpu" else range(rank.world_size)
    folders = [(i, part_dir(out, kind, i)) for i in indices]
    timeout = req.merge_timeout_s if kind == "rank" and not interrupted else 0.0
    on_wait = MergeWait(console, dict(folders), timeout)
    guard.allow()
    try:
        return wait_and_merge(out, folders, mode="spread" if spread else "replicate",
                              timeout_s=timeout, on_wait=on_wait)  # fmt: skip
    except KeyboardInterrupt:
        return None
    finally:
        guard.hold()


def _report(json_path: Path, guard: InterruptGuard, skip: bool, *, console: Console,
            err_console: Console) -> Path | None:  # fmt: skip
    """report.html (its path), unless Ctrl-C was pressed again meanwhile: the results are written,
    so the page is what gives way (`fa-bench report` writes it later)."""
    from fa_bench.commands.report import write_run_report

    skipped = Text(f"report skipped ({guard.reason}); write it with: fa-bench report {json_path}",
                   style="yellow")  # fmt: skip
    if skip:
        err_console.print(skipped)
        return None
    guard.allow()
    try:
        return write_run_report(json_path, console=console, err_console=err_console)
    except KeyboardInterrupt:
        err_console.print(skipped)
        return None
    finally:
        guard.hold()
