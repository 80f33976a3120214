"""Terminal output for `fa-bench run`: the progress bar and the summary tables."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from statistics import median
from types import TracebackType
from typing import Literal

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
from rich.table import Table
from rich.text import Text

from fa_bench.case import Case, Status
from fa_bench.results.record import CaseRecord

STATUS_STYLE = {
    "ok": "green",
    "oom": "yellow",
    "unsupported": "dim",
    "error": "red",
    "timeout": "red",
    "mismatch": "bold red",
}
PER_CASE_LIMIT = 40


class RunProgress:
    """A Rich progress bar with ETA, the current case and the status counts so far."""

    def __init__(self, console: Console, total: int, already_done: int = 0) -> None:
        self.counts: Counter[str] = Counter()
        self.progress = Progress(
            SpinnerColumn(),
            # the description is a case label (impl names come from plugins): not markup
            TextColumn("{task.description}", style="progress.description", markup=False),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            TextColumn("{task.fields[counts]}"),
            console=console,
            transient=False,
        )
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
        warnings = (record.telemetry or {}).get("warnings") or []
        self.done(case, record.status, record.error, warnings)

    def start(self, case: Case) -> None:
        self.progress.update(self.task, description=case.label)

    def done(
        self, case: Case, status: Status, error: str | None, warnings: Sequence[str] = ()
    ) -> None:
        """Count a finished case; print why when it failed or its telemetry warned."""
        name = status.value
        self.counts[name] += 1
        counts = " ".join(f"[{STATUS_STYLE[s]}]{s} {n}[/]" for s, n in sorted(self.counts.items()))
        self.progress.update(self.task, advance=1, counts=counts)
        if status not in (Status.OK, Status.UNSUPPORTED):
            msg = error.splitlines()[0][:160] if error else ""
            self.progress.console.print(
                Text.assemble((name, STATUS_STYLE[name]), f" {case.label}: {msg}")
            )
        if warnings:  # throttling or low clocks: this case's numbers may not be comparable
            self.progress.console.print(
                Text.assemble(("telemetry", "yellow"), f" {case.label}: {'; '.join(warnings)}")
            )


def _fmt(value: float | None, spec: str) -> str:
    return "–" if value is None else format(value, spec)


def _shape(c: Case) -> str:
    seq = f"{c.seqlen_q}" if c.seqlen_q == c.seqlen_k else f"{c.seqlen_q}x{c.seqlen_k}"
    heads = f"{c.heads_q}" + (f"/{c.heads_kv}" if c.heads_kv != c.heads_q else "")
    return f"B{c.batch} H{heads} N{seq} D{c.head_dim}" + (" causal" if c.causal else "")


def summary_table(records: Sequence[CaseRecord]) -> Table:
    if len(records) <= PER_CASE_LIMIT:
        return _per_case_table(records)
    return _grouped_table(records)


def _per_case_table(records: Sequence[CaseRecord]) -> Table:
    t = Table(title="Results", show_lines=False)
    columns: list[tuple[str, Literal["left", "right"]]] = [
        ("impl", "left"), ("mode", "left"), ("dtype", "left"), ("shape", "left"),
        ("status", "left"), ("median ms", "right"), ("p20–p80 ms", "right"),
        ("TFLOP/s", "right"), ("GB/s", "right"), ("peak MiB", "right"), ("max err", "right"),
    ]  # fmt: skip
    for col, just in columns:
        t.add_column(col, justify=just)
    for r in records:
        lat, acc, peak, status = r.latency_ms, r.accuracy or {}, r.peak_mem_bytes, r.status.value
        t.add_row(
            Text(r.impl + (f" ({r.backend})" if r.backend and r.impl == "sdpa" else "")),
            r.case.mode.value,
            r.case.dtype.value,
            _shape(r.case),
            Text(status, STATUS_STYLE[status]),
            _fmt(r.median_ms, ".4g"),
            f"{lat.p20:.4g}–{lat.p80:.4g}" if lat is not None else "–",
            _fmt(r.tflops, ".4g"),
            _fmt(r.gbps_model, ".0f"),
            _fmt(peak / 2**20 if peak is not None else None, ".1f"),
            _fmt(acc.get("max_abs_err"), ".2g"),
        )
    return t


def _grouped_table(records: Sequence[CaseRecord]) -> Table:
    groups: dict[tuple, list[CaseRecord]] = defaultdict(list)
    for r in records:
        groups[(r.impl, r.case.mode.value, r.case.dtype.value)].append(r)
    t = Table(title="Results by implementation, mode and dtype")
    for col in ("impl", "mode", "dtype", "cases", "ok", "oom", "unsupp.", "failed",
                "median TFLOP/s", "best TFLOP/s"):  # fmt: skip
        t.add_column(col, justify="left" if col in ("impl", "mode", "dtype") else "right")
    for (impl, mode, dtype), rs in groups.items():
        c = Counter(r.status.value for r in rs)
        tf = [r.tflops for r in rs if r.status is Status.OK and r.tflops is not None]
        failed = sum(n for s, n in c.items() if Status(s).is_failure)
        t.add_row(
            Text(impl), mode, dtype, str(len(rs)), str(c["ok"]), str(c["oom"]),
            str(c["unsupported"]),
            f"[red]{failed}[/]" if failed else "0",
            _fmt(median(tf) if tf else None, ".4g"), _fmt(max(tf) if tf else None, ".4g"),
        )  # fmt: skip
    return t


def failures_table(records: Sequence[CaseRecord], limit: int = 25) -> Table | None:
    bad = [r for r in records if r.status not in (Status.OK, Status.UNSUPPORTED)]
    if not bad:
        return None
    t = Table(
        title=f"Cases not ok ({len(bad)}" + (f", first {limit})" if len(bad) > limit else ")")
    )
    t.add_column("status")
    t.add_column("case")
    t.add_column("message", overflow="fold")
    for r in bad[:limit]:
        msg = (r.error or "").strip().splitlines()
        status = r.status.value
        t.add_row(Text(status, STATUS_STYLE[status]), Text(r.id), Text(msg[0][:300] if msg else ""))
    return t
