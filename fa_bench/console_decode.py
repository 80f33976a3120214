"""The terminal summary of decode cases: bandwidth first.

Decoding is memory-bound: what a reader wants first is how many bytes per second a kernel
moved and how near that is to the GPU's ceiling, the run's measured copy bandwidth
(fa_bench.results.bandwidth); TFLOP/s comes after. fa_bench.console prints these tables
after the prefill ones, with the same fitting rules (columns dropped, never cut).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from statistics import median
from typing import Any

from rich.table import Table
from rich.text import Text

from fa_bench import units
from fa_bench.case import Case, Status
from fa_bench.fit_table import Col, fit_table, median_cell, spread_cell
from fa_bench.progress import STATUS_STYLE
from fa_bench.results.bandwidth import fractions
from fa_bench.results.record import CaseRecord
from fa_bench.words import plural


def cache_label(c: Case) -> str:
    """The cache layout and the spread of lengths: 'contig', 'page64 spread0.25'."""
    cache = "contig" if c.page_size == 0 else f"page{c.page_size}"
    return cache + (f" spread{c.ctx_spread:g}" if c.ctx_spread != 1.0 else "")


def decode_shape(c: Case) -> str:
    heads = f"{c.heads_q}" + (f"/{c.heads_kv}" if c.heads_kv != c.heads_q else "")
    return f"B{c.batch} H{heads} Sq{c.seqlen_q} ctx{c.seqlen_k} D{c.head_dim} {cache_label(c)}"


def pct(fraction: float | None) -> str:
    """One decimal at every size (units.percent rounds above 10%): 89.6% of the copy
    bandwidth is not 90%, the issue's bar for a long context."""
    return units.NONE if fraction is None else f"{fraction:.1%}"


def _fraction_cells(r: CaseRecord, env: dict[str, Any]) -> tuple[str, str]:
    hbm, copy = fractions(r, env)
    return pct(copy), pct(hbm)


def decode_summary(
    records: Sequence[CaseRecord], width: int, env: dict[str, Any] | None, limit: int
) -> list[Table | Text]:
    """Decode records as a table: GB/s and its fraction of the copy bandwidth and of the
    HBM peak before TFLOP/s; grouped per implementation and dtype beyond `limit` cases."""
    env = env or {}
    if len(records) > limit:
        return _grouped(records, width, env)
    cols = (
        Col("impl"), Col("dtype"), Col("shape"), Col("status"), Col("median", right=True),
        Col("bandwidth", right=True), Col("% copy", right=True, drop=3),
        Col("% HBM", right=True, drop=5), Col("FLOP/s", right=True, drop=7),
        Col("p20–p80", right=True, drop=9),
    )  # fmt: skip
    rows: list[list[str | Text]] = []
    for r in records:
        copy, hbm = _fraction_cells(r, env)
        rows.append([Text(r.impl), r.case.dtype.value, decode_shape(r.case),
                     Text(r.status.value, STATUS_STYLE[r.status.value]), median_cell(r),
                     units.bandwidth(r.gbps_model), copy, hbm, units.flops(r.tflops),
                     spread_cell(r)])  # fmt: skip
    title = "Decode results (bandwidth first; % of the run's copy bandwidth and HBM peak)"
    table = fit_table(title, cols, rows, width)
    if table is not None:
        return [table]
    out: list[Table | Text] = [Text(title + ": one case a block: status, median, bandwidth, "
                                    "% copy, % HBM, FLOP/s", style="bold")]  # fmt: skip
    for r, row in zip(records, rows, strict=True):
        out.append(Text(r.id))
        shares = f"  {row[6]} of copy  {row[7]} of HBM" if fractions(r, env) != (None, None) else ""
        figures = f"  {row[4]}  {row[5]}{shares}  {row[8]}"
        out.append(Text.assemble("    ", (r.status.value, STATUS_STYLE[r.status.value]), figures))
    return out


def _grouped(records: Sequence[CaseRecord], width: int, env: dict[str, Any]) -> list[Table | Text]:
    cols = (
        Col("impl"), Col("dtype"), Col("cases", right=True), Col("ok", right=True),
        Col("unsupp.", right=True, drop=3), Col("failed", right=True),
        Col("median bandwidth", right=True), Col("best bandwidth", right=True, drop=4),
        Col("best % copy", right=True, drop=2),
    )  # fmt: skip
    groups: dict[tuple[str, str], list[CaseRecord]] = defaultdict(list)
    for r in records:
        groups[(r.impl, r.case.dtype.value)].append(r)
    rows: list[list[str | Text]] = []
    blocks: list[Table | Text] = []
    for (impl, dtype), rs in groups.items():
        c = Counter(r.status.value for r in rs)
        ok = [r for r in rs if r.status is Status.OK and r.gbps_model is not None]
        bw = [r.gbps_model for r in ok if r.gbps_model is not None]
        copies = [f for r in ok if (f := fractions(r, env)[1]) is not None]
        med = units.bandwidth(median(bw) if bw else None)
        best = units.bandwidth(max(bw) if bw else None)
        best_copy = pct(max(copies) if copies else None)
        failed = sum(n for s, n in c.items() if Status(s).is_failure)
        rows.append([Text(impl), dtype, str(len(rs)), str(c["ok"]), str(c["unsupported"]),
                     Text(str(failed), "red" if failed else ""), med, best, best_copy])  # fmt: skip
        counts = ", ".join(f"{n} {s}" for s, n in sorted(c.items()))
        blocks.append(Text(f"{impl} decode {dtype}: {plural(len(rs), 'case')} ({counts}); "
                           f"median {med}, best {best} ({best_copy} of copy)"))  # fmt: skip
    title = "Decode results by implementation and dtype (bandwidth first)"
    table = fit_table(title, cols, rows, width)
    return [table] if table is not None else [Text(title, style="bold"), *blocks]
