"""Terminal output for `fa-bench run`: the summary tables, the reasons cases did not run
and the time-limit footnote (the progress is in fa_bench/progress.py).

Nothing here is ever cut: a table gets only the columns that fit the console's width
at their full length (no_wrap, min widths), dropping the least needed first; when even
the essential ones do not fit (80 columns of a CI log), each record is a block of lines
printed with soft wrap, so an id or a figure is never ended by an ellipsis.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from statistics import median
from typing import Any

from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text

from fa_bench import units
from fa_bench.case import Case, Status
from fa_bench.console_decode import decode_summary
from fa_bench.fit_table import MARK, Col, fit_table
from fa_bench.fit_table import median_cell as _median
from fa_bench.fit_table import spread_cell as _spread
from fa_bench.progress import (  # noqa: F401  (re-exported: the progress's old home)
    STATUS_STYLE,
    PlainProgress,
    RunProgress,
    make_progress,
    progress_line,
)
from fa_bench.results.bandwidth import is_decode
from fa_bench.results.record import CaseRecord
from fa_bench.variant_cost import cost_lines, variant_costs, variant_tag
from fa_bench.words import plural

PER_CASE_LIMIT = 40
NOT_RUN = ("unsupported", "unavailable")  # statuses whose reason the summary groups


def _label(r: CaseRecord) -> str:
    return r.impl + (f" ({r.backend})" if r.backend and r.impl == "sdpa" else "")


def _shape(c: Case) -> str:
    seq = f"{c.seqlen_q}" if c.seqlen_q == c.seqlen_k else f"{c.seqlen_q}x{c.seqlen_k}"
    heads = f"{c.heads_q}" + (f"/{c.heads_kv}" if c.heads_kv != c.heads_q else "")
    shape = f"B{c.batch} H{heads} N{seq} D{c.head_dim}" + (" causal" if c.causal else "")
    return shape + (f" {variant_tag(c)}" if c.is_variant else "")  # apart from its dense case


def _err(r: CaseRecord) -> str:
    err = (r.accuracy or {}).get("max_abs_err")
    return "–" if err is None else f"{err:.2g}"


_CASE_COLS = (
    Col("impl"), Col("mode"), Col("dtype"), Col("shape"), Col("status"),
    Col("median", right=True), Col("p20–p80", right=True, drop=9),
    Col("FLOP/s", right=True, drop=4), Col("bandwidth", right=True, drop=6),
    Col("peak mem", right=True, drop=7), Col("max err", right=True, drop=8),
)  # fmt: skip


def summary(
    records: Sequence[CaseRecord], width: int, env: dict[str, Any] | None = None
) -> list[Table | Text]:
    """The results as a table that fits `width`, or one block of lines per record; decode
    cases in their own table, bandwidth first, measured against `env`'s ceilings."""
    decode = [r for r in records if is_decode(r.case)]
    if not decode:
        return _prefill_summary(records, width)
    prefill = [r for r in records if not is_decode(r.case)]
    out = _prefill_summary(prefill, width) if prefill else []
    return out + decode_summary(decode, width, env, PER_CASE_LIMIT)


def _prefill_summary(records: Sequence[CaseRecord], width: int) -> list[Table | Text]:
    if len(records) > PER_CASE_LIMIT:
        return _grouped(records, width)
    rows: list[list[str | Text]] = [
        [Text(_label(r)), r.case.mode.value, r.case.dtype.value, _shape(r.case),
         Text(r.status.value, STATUS_STYLE[r.status.value]), _median(r), _spread(r),
         units.flops(r.tflops), units.bandwidth(r.gbps_model),
         units.mebibytes(r.peak_mem_bytes), _err(r)]
        for r in records
    ]  # fmt: skip
    table = fit_table("Results", _CASE_COLS, rows, width)
    if table is not None:
        return [table]
    out: list[Table | Text] = [Text("Results (one case a block: status, median, p20–p80, "
                                    "FLOP/s, model bandwidth, peak memory, max abs error)",
                                    style="bold")]  # fmt: skip
    for r in records:
        out.append(Text(r.id))
        figures = (f"  {_median(r)}  ({_spread(r)})  {units.flops(r.tflops)}  "
                   f"{units.bandwidth(r.gbps_model)}  {units.mebibytes(r.peak_mem_bytes)}  "
                   f"err {_err(r)}")  # fmt: skip
        out.append(Text.assemble("    ", (r.status.value, STATUS_STYLE[r.status.value]), figures))
    return out


_GROUP_COLS = (
    Col("impl"), Col("mode"), Col("dtype"), Col("cases", right=True), Col("ok", right=True),
    Col("oom", right=True, drop=5), Col("unsupp.", right=True, drop=3),
    Col("failed", right=True), Col("median FLOP/s", right=True),
    Col("best FLOP/s", right=True, drop=4),
)  # fmt: skip


def _grouped(records: Sequence[CaseRecord], width: int) -> list[Table | Text]:
    groups: dict[tuple[str, str, str], list[CaseRecord]] = defaultdict(list)
    for r in records:
        # A variant's figures are not its implementation's dense ones: its own group.
        impl = r.impl + (f" {variant_tag(r.case)}" if r.case.is_variant else "")
        groups[(impl, r.case.mode.value, r.case.dtype.value)].append(r)
    rows: list[list[str | Text]] = []
    blocks: list[Table | Text] = []
    for (impl, mode, dtype), rs in groups.items():
        c = Counter(r.status.value for r in rs)
        tf = [r.tflops for r in rs if r.status is Status.OK and r.tflops is not None]
        failed = sum(n for s, n in c.items() if Status(s).is_failure)
        med, best = units.flops(median(tf) if tf else None), units.flops(max(tf) if tf else None)
        if any(r.noisy_at_limit for r in rs):  # the footnote's marker, as in the per-case table
            med += f" {MARK}"
        rows.append([Text(impl), mode, dtype, str(len(rs)), str(c["ok"]), str(c["oom"]),
                     str(c["unsupported"]), Text(str(failed), "red" if failed else ""),
                     med, best])  # fmt: skip
        counts = ", ".join(f"{n} {s}" for s, n in sorted(c.items()))
        blocks.append(Text(f"{impl} {mode} {dtype}: {plural(len(rs), 'case')} ({counts}); "
                           f"median {med}, best {best}"))  # fmt: skip
    title = "Results by implementation, mode and dtype"
    table = fit_table(title, _GROUP_COLS, rows, width)
    return [table] if table is not None else [Text(title, style="bold"), *blocks]


def failures(records: Sequence[CaseRecord], width: int, limit: int = 25) -> list[Table | Text]:
    """The cases that failed with the first line of their error; empty when none did."""
    bad = [r for r in records if r.status not in (Status.OK, Status.UNSUPPORTED)]
    if not bad:
        return []
    title = f"Cases not ok ({len(bad)}" + (f", first {limit})" if len(bad) > limit else ")")
    firsts = [((r.error or "").strip().splitlines() or [""])[0][:300] for r in bad[:limit]]
    ids = max(cell_len(r.id) for r in bad[:limit])
    if ids + 8 + 20 + 10 <= width:  # the message column keeps at least 20 cells to fold in
        t = Table(title=title)
        t.add_column("status", no_wrap=True, min_width=8)
        t.add_column("case", no_wrap=True, min_width=ids)
        t.add_column("message", overflow="fold")
        for r, msg in zip(bad, firsts, strict=False):
            t.add_row(Text(r.status.value, STATUS_STYLE[r.status.value]), Text(r.id), Text(msg))
        return [t]
    out: list[Table | Text] = [Text(title, style="bold")]
    for r, msg in zip(bad, firsts, strict=False):
        out.append(Text.assemble((r.status.value, STATUS_STYLE[r.status.value]), f" {r.id}"))
        out.append(Text(f"    {msg}"))
    return out


def reasons(records: Sequence[CaseRecord]) -> list[Text]:
    """One line per implementation and reason a case did not run here, with its count,
    e.g. `sdpa-cudnn: 5 unsupported: sdpa-cudnn runs on cuda, not cpu`."""
    groups: Counter[tuple[str, str, str]] = Counter(
        (r.impl, r.status.value, (r.error or "no reason recorded").strip().splitlines()[0])
        for r in records
        if r.status.value in NOT_RUN
    )
    return [Text.assemble((impl, "bold"), f": {n} {status}: {why}")
            for (impl, status, why), n in groups.items()]  # fmt: skip


def time_limit_note(records: Sequence[CaseRecord]) -> Text | None:
    """The footnote to the time-limit marker, or None when no case needs it."""
    hit = [r for r in records if r.noisy_at_limit]
    if not hit:
        return None
    target = float((hit[0].timing or {}).get("target_noise", 0.01))
    return Text(
        f"{MARK} {len(hit)} case{'s' if len(hit) != 1 else ''} stopped at the time limit with "
        f"noise above the target ({units.percent(target)}): their medians are less certain; "
        "raise the limit with --max-time (or loosen --target-noise)",
        style="yellow",
    )


def print_summary(
    console: Console, records: Sequence[CaseRecord], env: dict[str, Any] | None = None
) -> None:
    """The end of a run: results, failures, why cases did not run, the time-limit note.
    `env` (the run's, with its bandwidth ceilings) gives decode cases their fractions."""
    width = console.width
    for item in [*summary(records, width, env), *failures(records, width)]:
        console.print(item, soft_wrap=isinstance(item, Text))
    lines = reasons(records)
    if lines:
        console.print(Text("Not run here (implementation: count status: reason)", style="bold"))
        for line in lines:
            console.print(line, soft_wrap=True)
    for line in variant_lines(records):
        console.print(line, soft_wrap=True)
    note = time_limit_note(records)
    if note is not None:
        console.print(note, soft_wrap=True)


def variant_lines(records: Sequence[CaseRecord]) -> list[Text]:
    """Issue 19's cost of each variant: per implementation and variant, its median time
    against the dense case of the same shape; empty for a run without variant cases."""
    lines = cost_lines(variant_costs((r, "") for r in records))
    if not lines:
        return []
    title = Text("Cost of the variant (time ÷ the dense case of the same shape)", style="bold")
    return [title, *(Text("  " + line) for line in lines)]


# The old names (tests and tools use them): one table at a wide width.
def summary_table(records: Sequence[CaseRecord], width: int = 200) -> Table:
    items = summary(records, width)
    table = items[0]
    if not isinstance(table, Table):
        raise ValueError(f"{len(records)} records do not fit a table {width} cells wide")
    return table


def failures_table(records: Sequence[CaseRecord], width: int = 200) -> Table | None:
    items = failures(records, width)
    return items[0] if items and isinstance(items[0], Table) else None
