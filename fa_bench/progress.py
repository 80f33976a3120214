"""Progress of `fa-bench run`: a Rich live bar on a terminal, plain lines in a log.

A live bar in a CI log (stdout not a terminal, 80 columns) is redrawn into one line with
every field cut (`42… 0:… eta 0…`); there each finished case (or every n-th of a big run,
and every one that failed) gets one line that is never cut.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Sequence
from types import TracebackType

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Column
from rich.text import Text

from fa_bench import units
from fa_bench.case import Case, Status
from fa_bench.results.bandwidth import is_decode
from fa_bench.results.record import CaseRecord

STATUS_STYLE = {
    "ok": "green",
    "oom": "yellow",
    "unsupported": "dim",
    "error": "red",
    "timeout": "red",
    "mismatch": "bold red",
}
PLAIN_LINES = 50  # about this many progress lines for a big run in a log


def every_n(total: int) -> int:
    """How many finished cases one plain progress line stands for: every case up to 100,
    then about PLAIN_LINES lines for the whole run."""
    return 1 if total <= 100 else math.ceil(total / PLAIN_LINES)


def progress_line(
    done: int,
    total: int,
    status: str,
    case_id: str,
    *,
    median_ms: float | None = None,
    tflops: float | None = None,
    gbps: float | None = None,
    elapsed_s: float,
    eta_s: float | None,
    prefix: str = "",
) -> str:
    """One plain line for a finished case, e.g. `[12/42] ok  naive/fwd/...  81.2 µs
    1.20 GFLOP/s  (0:07 elapsed, eta 0:18)`; `prefix` names the GPU or rank. `gbps`, given
    for a decode case (memory-bound), comes before the FLOP/s."""
    width = len(str(total))
    parts = [f"{prefix} " if prefix else "", f"[{done:>{width}}/{total}] {status:<11} {case_id}"]
    if median_ms is not None:
        parts.append(f"  {units.latency(median_ms)}")
    if gbps is not None:
        parts.append(f"  {units.bandwidth(gbps)}")
    if tflops is not None:
        parts.append(f"  {units.flops(tflops)}")
    eta = "" if eta_s is None else f", eta {units.duration(eta_s)}"
    parts.append(f"  ({units.duration(elapsed_s)} elapsed{eta})")
    return "".join(parts)


def _problem_lines(case: Case, status: Status, error: str | None,
                   warnings: Sequence[str]) -> list[Text]:  # fmt: skip
    """Why a case failed, and its telemetry warnings (throttling, low clocks: its numbers
    may not be comparable)."""
    lines = []
    if status not in (Status.OK, Status.UNSUPPORTED):
        msg = error.splitlines()[0][:160] if error else ""
        lines.append(Text.assemble((status.value, STATUS_STYLE[status.value]),
                                   f" {case.label}: {msg}"))  # fmt: skip
    if warnings:
        what = f" {case.label}: {'; '.join(warnings)}"
        lines.append(Text.assemble(("telemetry", "yellow"), what))
    return lines


def _warnings(record: CaseRecord) -> list[str]:
    return list((record.telemetry or {}).get("warnings") or [])


class RunProgress:
    """A Rich progress bar with ETA, the current case and the status counts so far."""

    def __init__(self, console: Console, total: int, already_done: int = 0) -> None:
        self.counts: Counter[str] = Counter()
        # A narrow terminal gives up the bar, then the case label's tail, never a figure:
        # the label is the one column that shrinks (with an ellipsis), the others never wrap.
        bar = min(40, console.width - 100)
        fixed = Column(no_wrap=True)
        self.progress = Progress(
            SpinnerColumn(),
            # the description is a case label (impl names come from plugins): not markup
            TextColumn("{task.description}", style="progress.description", markup=False,
                       table_column=Column(ratio=1, min_width=8, no_wrap=True)),
            *([BarColumn(bar_width=bar)] if bar >= 10 else []),
            MofNCompleteColumn(table_column=fixed),
            TimeElapsedColumn(table_column=fixed),
            TextColumn("eta", table_column=fixed),
            TimeRemainingColumn(table_column=fixed),
            TextColumn("{task.fields[counts]}", table_column=fixed),
            console=console,
            transient=False,
            expand=True,
        )  # fmt: skip
        self.task = self.progress.add_task(
            "starting worker", total=total, completed=already_done, counts=""
        )

    def __enter__(self) -> RunProgress:
        self.progress.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.progress.__exit__(exc_type, exc, tb)

    def __call__(self, event: str, case: Case, record: CaseRecord | None) -> None:
        """The runner's progress callback (fa_bench.run.runner.ProgressFn)."""
        if event == "start" or record is None:
            self.start(case)
            return
        self.done(case, record.status, record.error, _warnings(record))

    def start(self, case: Case) -> None:
        self.progress.update(self.task, description=case.label)

    def done(
        self, case: Case, status: Status, error: str | None, warnings: Sequence[str] = ()
    ) -> None:
        """Count a finished case; print why when it failed or its telemetry warned."""
        self.counts[status.value] += 1
        counts = " ".join(f"[{STATUS_STYLE[s]}]{s} {n}[/]" for s, n in sorted(self.counts.items()))
        self.progress.update(self.task, advance=1, counts=counts)
        for line in _problem_lines(case, status, error, warnings):
            self.progress.console.print(line)


class PlainProgress:
    """Progress as plain lines (a log): the same callback as RunProgress."""

    def __init__(
        self, console: Console, total: int, already_done: int = 0, prefix: str = ""
    ) -> None:
        self.console, self.total, self.prefix = console, total, prefix
        self.done_count, self.first_done = already_done, already_done
        self.every = every_n(total)
        self.counts: Counter[str] = Counter()
        self.started = time.monotonic()

    def __enter__(self) -> PlainProgress:
        self.started = time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def __call__(self, event: str, case: Case, record: CaseRecord | None) -> None:
        """The runner's progress callback (fa_bench.run.runner.ProgressFn)."""
        if event == "start" or record is None:
            self.start(case)
            return
        self.done(case, record.status, record.error, _warnings(record), record=record)

    def start(self, case: Case) -> None:
        """Nothing: a log gets a line when a case ends, not one per start."""

    def done(
        self,
        case: Case,
        status: Status,
        error: str | None,
        warnings: Sequence[str] = (),
        record: CaseRecord | None = None,
    ) -> None:
        """Count a finished case; one line for it (or for every n-th), its problems below."""
        self.done_count += 1
        self.counts[status.value] += 1
        problems = _problem_lines(case, status, error, warnings)
        last = self.done_count >= self.total
        ran = self.done_count - self.first_done  # the first line says the run is alive
        if problems or last or ran == 1 or ran % self.every == 0:
            elapsed = time.monotonic() - self.started
            eta = elapsed / ran * (self.total - self.done_count) if ran else None
            line = progress_line(
                self.done_count, self.total, status.value, case.id,
                median_ms=record.median_ms if record else None,
                tflops=record.tflops if record else None,
                gbps=record.gbps_model if record and is_decode(case) else None,
                elapsed_s=elapsed, eta_s=eta, prefix=self.prefix,
            )  # fmt: skip
            self.console.print(line, markup=False, highlight=False, soft_wrap=True)
        for problem in problems:
            self.console.print(problem, soft_wrap=True)


def make_progress(
    console: Console, total: int, already_done: int = 0
) -> RunProgress | PlainProgress:
    """A live bar on a terminal; plain lines when the output is a log or a pipe."""
    if console.is_terminal:
        return RunProgress(console, total=total, already_done=already_done)
    return PlainProgress(console, total=total, already_done=already_done)
