"""Terminal output for `fa-bench run`: the progress bar and the summary tables."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from statistics import median

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

from fa_bench.case import Case, Status

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
            TextColumn("[progress.description]{task.description}"),
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

    def __exit__(self, *exc: object) -> None:
        self.progress.__exit__(*exc)

    def __call__(self, event: str, case: Case, record: dict | None) -> None:
        if event == "start":
            self.progress.update(self.task, description=case.label)
            return
        status = record["status"]
        self.counts[status] += 1
        counts = " ".join(f"[{STATUS_STYLE[s]}]{s} {n}[/]" for s, n in sorted(self.counts.items()))
        self.progress.update(self.task, advance=1, counts=counts)
        if status != Status.OK.value and status != Status.UNSUPPORTED.value:
            msg = (record.get("error") or "").splitlines()[0][:160] if record.get("error") else ""
            self.progress.console.print(
                f"[{STATUS_STYLE[status]}]{status}[/] {case.label}: {msg}", highlight=False
            )
        warnings = (record.get("telemetry") or {}).get("warnings") or []
        if warnings:  # throttling or low clocks: this case's numbers may not be comparable
            self.progress.console.print(
                f"[yellow]telemetry[/] {case.label}: {'; '.join(warnings)}", highlight=False
            )


def _fmt(value: float | None, spec: str) -> str:
    return "–" if value is None else format(value, spec)


def _shape(r: dict) -> str:
    seq = (
        f"{r['seqlen_q']}" if r["seqlen_q"] == r["seqlen_k"] else f"{r['seqlen_q']}x{r['seqlen_k']}"
    )
    heads = f"{r['heads_q']}" + (f"/{r['heads_kv']}" if r["heads_kv"] != r["heads_q"] else "")
    return f"B{r['batch']} H{heads} N{seq} D{r['head_dim']}" + (" causal" if r["causal"] else "")


def summary_table(records: Sequence[dict]) -> Table:
    if len(records) <= PER_CASE_LIMIT:
        return _per_case_table(records)
    return _grouped_table(records)


def _per_case_table(records: Sequence[dict]) -> Table:
    t = Table(title="Results", show_lines=False)
    for col, just in [
        ("impl", "left"), ("mode", "left"), ("dtype", "left"), ("shape", "left"),
        ("status", "left"), ("median ms", "right"), ("p20–p80 ms", "right"),
        ("TFLOP/s", "right"), ("GB/s", "right"), ("peak MiB", "right"), ("max err", "right"),
    ]:  # fmt: skip
        t.add_column(col, justify=just)
    for r in records:
        lat = r.get("latency_ms") or {}
        acc = r.get("accuracy") or {}
        peak = r.get("peak_mem_bytes")
        t.add_row(
            r["impl"] + (f" ({r['backend']})" if r.get("backend") and r["impl"] == "sdpa" else ""),
            r["mode"],
            r["dtype"],
            _shape(r),
            f"[{STATUS_STYLE[r['status']]}]{r['status']}[/]",
            _fmt(lat.get("median"), ".4g"),
            f"{lat['p20']:.4g}–{lat['p80']:.4g}" if lat else "–",
            _fmt(r.get("tflops"), ".4g"),
            _fmt(r.get("gbps_model"), ".0f"),
            _fmt(peak / 2**20 if peak is not None else None, ".1f"),
            _fmt(acc.get("max_abs_err"), ".2g"),
        )
    return t


def _grouped_table(records: Sequence[dict]) -> Table:
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in records:
        groups[(r["impl"], r["mode"], r["dtype"])].append(r)
    t = Table(title="Results by implementation, mode and dtype")
    for col in ("impl", "mode", "dtype", "cases", "ok", "oom", "unsupp.", "failed",
                "median TFLOP/s", "best TFLOP/s"):  # fmt: skip
        t.add_column(col, justify="left" if col in ("impl", "mode", "dtype") else "right")
    for (impl, mode, dtype), rs in groups.items():
        c = Counter(r["status"] for r in rs)
        tf = [r["tflops"] for r in rs if r["status"] == "ok" and r.get("tflops") is not None]
        failed = sum(n for s, n in c.items() if Status(s).is_failure)
        t.add_row(
            impl, mode, dtype, str(len(rs)), str(c["ok"]), str(c["oom"]), str(c["unsupported"]),
            f"[red]{failed}[/]" if failed else "0",
            _fmt(median(tf) if tf else None, ".4g"), _fmt(max(tf) if tf else None, ".4g"),
        )  # fmt: skip
    return t


def failures_table(records: Sequence[dict], limit: int = 25) -> Table | None:
    bad = [r for r in records if r["status"] not in ("ok", "unsupported")]
    if not bad:
        return None
    t = Table(
        title=f"Cases not ok ({len(bad)}" + (f", first {limit})" if len(bad) > limit else ")")
    )
    t.add_column("status")
    t.add_column("case")
    t.add_column("message", overflow="fold")
    for r in bad[:limit]:
        msg = (r.get("error") or "").strip().splitlines()
        t.add_row(
            f"[{STATUS_STYLE[r['status']]}]{r['status']}[/]", r["id"], msg[0][:300] if msg else ""
        )
    return t
