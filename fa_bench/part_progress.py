"""Progress of a run split into parts (`--gpus`, torchrun or srun ranks), part by part.

A user must be able to tell progress from a hang. Each part (a GPU, a rank) shows its
cases done / total and the case it is running, and once some parts have finished, which
ones are still working. On a terminal: a live display with one row per part. In a log
(stdout not a terminal, where a live display prints nothing until it ends): one line per
finished case (or every n-th of a big run, every failed one), prefixed with its GPU or
rank, a line when a part ends, and a status line whenever nothing was printed for
HEARTBEAT_S seconds, so that a long case or a slow worker start still shows life.

The events come from the parts' threads (`for_part(n)` is each part's ProgressFn, from
fa_bench.run.runner); one lock guards the state and the printing.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
)
from rich.text import Text

from fa_bench import units
from fa_bench.case import Case, Status
from fa_bench.progress import STATUS_STYLE, every_n, progress_line
from fa_bench.results.bandwidth import is_decode
from fa_bench.results.files import read_journal
from fa_bench.results.record import CaseRecord
from fa_bench.run.distributed import journal_progress
from fa_bench.run.multi import Part
from fa_bench.run.runner import ProgressFn

HEARTBEAT_S = 20.0  # a log gets a status line after this long without one


@dataclass
class PartState:
    label: str  # "gpu 1", "rank 3"
    total: int
    done: int
    first_done: int = 0
    counts: Counter[str] = field(default_factory=Counter)
    current: Case | None = None
    since: float = 0.0  # clock() when `current` started
    ended: str | None = None  # "done", "stopped", "stopped by an error: ..."
    started: bool = False  # a case has started (so its worker is up)

    def describe(self, now: float) -> str:
        """`gpu 1: 40/42, running triton/bwd/... for 0:12`, or `gpu 0: done, 42/42`."""
        head = f"{self.label}: "
        if self.ended is not None:
            return f"{head}{self.ended}, {self.done}/{self.total}"
        if self.current is None:  # before its first case, between two, or after its last
            where = "finishing" if self.done >= self.total else "between cases"
            if not self.started and self.done < self.total:  # CUDA, NVML and torch start up
                where = f"starting its worker for {units.duration(now - self.since)}"
            return f"{head}{self.done}/{self.total}, {where}"
        running = f"running {self.current.id} for {units.duration(now - self.since)}"
        return f"{head}{self.done}/{self.total}, {running}"


class PartsProgress:
    """The progress callback of every part of a run, and what the user sees of them."""

    def __init__(
        self,
        console: Console,
        parts: Sequence[tuple[str, int, int]],
        *,
        live: bool | None = None,
        heartbeat_s: float = HEARTBEAT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`parts`: (label, cases in the part, cases already done) per part."""
        self.console, self.clock, self.heartbeat_s = console, clock, heartbeat_s
        self.live = console.is_terminal if live is None else live
        self.parts = [PartState(label, total, done, done) for label, total, done in parts]
        self.every = [every_n(p.total) for p in self.parts]
        self.lock = threading.RLock()
        self.started = self.last_print = clock()
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None
        self.progress: Progress | None = None
        self.tasks: list = []

    # ------------------------------------------------------------------ context manager

    def __enter__(self) -> PartsProgress:
        self.started = self.last_print = self.clock()
        for part in self.parts:
            part.since = self.started  # the workers start now
        if self.live:
            self.progress = Progress(
                TextColumn("{task.description}", markup=False),
                BarColumn(bar_width=20),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                _StateColumn(self),
                console=self.console,
                refresh_per_second=2,
            )
            self.tasks = [self.progress.add_task(p.label, total=p.total, completed=p.done, n=n)
                          for n, p in enumerate(self.parts)]  # fmt: skip
            self.progress.__enter__()
        else:
            self._beat = threading.Thread(target=self._heartbeats, daemon=True)
            self._beat.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._beat is not None:
            self._beat.join(timeout=5)
        if self.progress is not None:
            self.progress.__exit__(exc_type, exc, tb)

    # ------------------------------------------------------------------ events

    def for_part(self, n: int) -> ProgressFn:
        """Part n's progress callback (fa_bench.run.runner.ProgressFn)."""

        def on_event(event: str, case: Case, record: CaseRecord | None) -> None:
            if event == "start" or record is None:
                self.start(n, case)
            else:
                self.done(n, case, record)

        return on_event

    def start(self, n: int, case: Case) -> None:
        with self.lock:
            part = self.parts[n]
            part.current, part.since, part.started = case, self.clock(), True

    def done(self, n: int, case: Case, record: CaseRecord) -> None:
        """Count a finished case; in a log, its line (every n-th, and every failed one)."""
        with self.lock:
            part = self.parts[n]
            part.done += 1
            part.current = None
            part.counts[record.status.value] += 1
            failed = record.status not in (Status.OK, Status.UNSUPPORTED)
            if self.progress is not None:
                self.progress.update(self.tasks[n], completed=part.done)
                if failed:
                    self._print(self._problem(part, case, record))
                return
            ran = part.done - part.first_done
            if failed or part.done >= part.total or ran % self.every[n] == 0:
                elapsed = self.clock() - self.started
                eta = elapsed / ran * (part.total - part.done) if ran else None
                self._print(progress_line(
                    part.done, part.total, record.status.value, case.id,
                    median_ms=record.median_ms, tflops=record.tflops,
                    gbps=record.gbps_model if is_decode(case) else None,
                    elapsed_s=elapsed, eta_s=eta, prefix=part.label,
                ))  # fmt: skip
            if failed:
                self._print(self._problem(part, case, record))

    def ended(self, n: int, how: str) -> None:
        """Part n stopped: "done", "stopped" (a stop signal) or "stopped by an error: ...".
        Says which parts are still working, so a log shows who the run waits for."""
        with self.lock:
            part = self.parts[n]
            part.ended, part.current = how, None
            if self.progress is not None:
                self.progress.update(self.tasks[n], completed=part.done)
            counts = ", ".join(f"{s} {c}" for s, c in sorted(part.counts.items()))
            line = f"{part.label}: {how}, {part.done}/{part.total}" + (
                f" ({counts})" if counts else ""
            )
            working = [p for p in self.parts if p.ended is None]
            if working and how == "done":
                line += "; still working: " + ", ".join(
                    f"{p.label} ({p.done}/{p.total}{', finishing' if p.done >= p.total else ''})"
                    for p in working
                )
            elif working and how != "stopped":  # an error stopped this part only
                line += "; the others go on"
            self._print(line)

    # ------------------------------------------------------------------ status

    def status_line(self) -> str:
        """Every part's state: `[1:20] gpu 0: done, 21/21; gpu 1: 18/21, running ... for 0:40`."""
        with self.lock:
            now = self.clock()
            return f"[{units.duration(now - self.started)}] " + "; ".join(
                p.describe(now) for p in self.parts
            )

    def heartbeat(self) -> bool:
        """Print the status line if nothing was printed for heartbeat_s; True if printed."""
        with self.lock:
            if self.clock() - self.last_print < self.heartbeat_s:
                return False
            if all(p.ended is not None for p in self.parts):
                return False
            self._print(self.status_line())
            return True

    def _heartbeats(self) -> None:
        while not self._stop.wait(min(1.0, self.heartbeat_s)):
            self.heartbeat()

    def state_text(self, n: int) -> str:
        """The live display's last column for part n."""
        with self.lock:
            part = self.parts[n]
            text = part.describe(self.clock())
            return text[len(part.label) + 2 :]

    def _problem(self, part: PartState, case: Case, record: CaseRecord) -> Text:
        msg = (record.error or "").strip().splitlines()
        status = record.status.value
        return Text.assemble(f"{part.label} ", (status, STATUS_STYLE[status]),
                             f" {case.id}: {msg[0][:160] if msg else ''}")  # fmt: skip

    def _print(self, line: str | Text) -> None:
        # soft_wrap: a case id or a path is never cut or folded mid-name in a log
        console = self.progress.console if self.progress is not None else self.console
        if isinstance(line, Text):
            console.print(line, soft_wrap=True)
        else:
            console.print(line, markup=False, highlight=False, soft_wrap=True)
        self.last_print = self.clock()


class _StateColumn(ProgressColumn):
    """`running naive/fwd/... for 0:12`, `done`: read from the owner at each refresh, so
    the time on the current case keeps counting between events."""

    def __init__(self, owner: PartsProgress) -> None:
        super().__init__()
        self.owner = owner

    def render(self, task: Task) -> Text:
        return Text(self.owner.state_text(task.fields["n"]), overflow="ellipsis", no_wrap=True)


class MergeWait:
    """Rank 0's wait for the other ranks (`wait_and_merge`'s on_wait): every heartbeat_s,
    which ranks it waits for, how far each has got (from their journals in the shared
    folder) and how long it will wait at most."""

    def __init__(
        self,
        console: Console,
        folders: dict[int, Path],
        timeout_s: float,
        *,
        label: str = "rank",
        heartbeat_s: float = HEARTBEAT_S,
    ) -> None:
        self.console, self.folders, self.timeout_s = console, folders, timeout_s
        self.label, self.heartbeat_s = label, heartbeat_s
        self.next_s = 0.0  # the first call says at once that rank 0 waits

    def __call__(self, pending: list[int], waited_s: float) -> None:
        if waited_s < self.next_s:
            return
        self.next_s = waited_s + self.heartbeat_s
        states = []
        for index in pending:
            done, total = journal_progress(self.folders[index])
            states.append(f"{self.label} {index} ({done}/{total if total is not None else '?'})")
        limit = units.duration(self.timeout_s)
        self.console.print(
            f"waiting for {', '.join(states)} to finish: {units.duration(waited_s)} so far, "
            f"at most {limit} (--merge-timeout)",
            markup=False, highlight=False, soft_wrap=True,
        )  # fmt: skip


def parts_progress(console: Console, parts: Sequence[Part], kind: str) -> PartsProgress:
    """The progress of `fa-bench run`'s parts: one per GPU ("gpu 3") or this rank ("rank 1").
    Ranks always print lines: the ranks of a node share their launcher's terminal, where
    several live displays would overwrite each other."""
    rows = []
    for p in parts:
        planned = {c.id for c in p.plan.cases}
        done = len({r.id for r in read_journal(p.out)} & planned)
        rows.append((f"{kind} {p.index}", len(p.plan.cases), done))
    return PartsProgress(console, rows, live=False if kind == "rank" else None)
