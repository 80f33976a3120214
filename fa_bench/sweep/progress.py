"""The sweep's progress: the run's live bar on a terminal, plain lines in a log.

A live display in a file or a CI log is either nothing (it only draws at the end) or
escape codes. When stdout is not a terminal, each finished config is one plain line:
done/total, elapsed, eta, the config and its outcome, and the best config of its case
so far, e.g.

    sweep 3/12 0:00:04 eta 0:00:12 <case> bm16-bn32-w4-s1 ok 182 µs · best bm32-bn32-w4-s1 151 µs
"""

from __future__ import annotations

import time
from types import TracebackType

from rich.console import Console
from rich.table import Table
from rich.text import Text

from fa_bench.case import Status
from fa_bench.progress import RunProgress
from fa_bench.sweep.space import Point
from fa_bench.units import flops, latency


def clock(seconds: float) -> str:
    s = int(max(0.0, seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def show_best(doc: dict, console: Console) -> None:
    """Each case's best config: a table on a terminal, one plain line per case in a log
    (a table at 80 columns cuts case ids and figures short)."""
    rows = []
    for c in doc["cases"]:
        n = c["counts"]
        failed = sum(v for k, v in n.items() if k not in ("ok", "pruned"))
        gain = c["gain_over_default"]
        rows.append((c["case_id"], c["best"] or "–", flops(c["best_tflops"]), c["default"] or "–",
                     flops(c["default_tflops"]), "–" if gain is None else f"{gain:+.1%}",
                     f"{n.get('ok', 0)}/{failed}/{n.get('pruned', 0)}"))  # fmt: skip
    if not console.is_terminal:
        for r in rows:
            line = (f"best {r[0]}: {r[1]} {r[2]}; default {r[3]} {r[4]}; gain {r[5]}; "
                    f"ok/failed/pruned {r[6]}")  # fmt: skip
            console.print(Text(line), soft_wrap=True, highlight=False)
        return
    t = Table(title="Best config per case")
    for col in ("case", "best", "speed", "default", "speed", "gain", "ok/failed/pruned"):
        t.add_column(col)
    for r in rows:
        t.add_row(*(Text(x) for x in r))
    console.print(t)


def _median_ms(row: dict) -> float | None:
    lat = row.get("latency_ms")
    return lat.get("median") if isinstance(lat, dict) else None


class SweepProgress:
    """`on_event` for `execute_points`; a context manager like RunProgress."""

    def __init__(self, console: Console, total: int, already_done: int = 0,
                 live: bool | None = None) -> None:  # fmt: skip
        self.console, self.total, self.done = console, total, already_done
        self.live = console.is_terminal if live is None else live
        self.bar = (
            RunProgress(console, total=total, already_done=already_done) if self.live else None
        )
        self.started = time.monotonic()
        self.first_done = already_done
        self.best: dict[str, tuple[float, str]] = {}  # case id → (median ms, label)

    def __enter__(self) -> SweepProgress:
        if self.bar is not None:
            self.bar.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.bar is not None:
            self.bar.__exit__(exc_type, exc, tb)

    def seen(self, row: dict) -> None:
        """A row already measured (a resumed sweep's journal): it counts for the best."""
        median = _median_ms(row)
        if row.get("status") == "ok" and median is not None:
            best = self.best.get(row["case_id"])
            if best is None or median < best[0]:
                self.best[row["case_id"]] = (median, row["label"])

    def __call__(self, event: str, point: Point, row: dict | None) -> None:
        if row is not None:
            self.seen(row)
        if self.bar is not None:
            if row is None:
                self.bar.start(point.case)
                desc = f"{point.case.label} {point.label}"
                self.bar.progress.update(self.bar.task, description=desc)
            else:  # a measured row: its status and error are the case record's
                self.bar.done(point.case, Status(row["status"]), row["error"])
            return
        if row is not None:
            self.done += 1
            self.console.print(self.line(point, row), soft_wrap=True, highlight=False)

    def line(self, point: Point, row: dict) -> Text:
        elapsed = time.monotonic() - self.started
        run_here = self.done - self.first_done
        eta = elapsed / run_here * (self.total - self.done) if run_here else 0.0
        status = row["status"]
        if status == "ok":
            outcome = latency(_median_ms(row))
        else:  # why it failed or was pruned, first line only: one line per config
            outcome = (row.get("error") or "").split("\n")[0][:120]
        head = f"sweep {self.done}/{self.total} {clock(elapsed)} eta {clock(eta)}"
        text = Text(f"{head} {point.case.label} {point.label} {status} {outcome}".rstrip())
        best = self.best.get(point.case.id)
        if best is not None:
            text.append(f" · best {best[1]} {latency(best[0])}")
        return text
