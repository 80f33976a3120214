"""How `fa-bench compare` shows its verdicts: a Rich table for the terminal, Markdown for a
pull-request comment or $GITHUB_STEP_SUMMARY, and JSON for machines."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

from rich.console import Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from fa_bench import units
from fa_bench.compare.core import Comparison, Metric, Row, Verdict
from fa_bench.results.files import sanitize
from fa_bench.words import plural

COMPARE_SCHEMA = "fa-bench-compare/1"
VERDICT_STYLE = {
    Verdict.BROKEN: "bold red",
    Verdict.SLOWER: "red",
    Verdict.MISSING: "yellow",
    Verdict.AMBIGUOUS: "yellow",
    Verdict.FASTER: "green",
    Verdict.FIXED: "green",
    Verdict.CHANGED: "magenta",
    Verdict.NEW: "cyan",
    Verdict.UNMEASURED: "dim",
    Verdict.SAME: "dim",
}
TERMINAL_ROWS = 60  # beyond this, `same` rows are counted instead of listed
WIDE = 120  # columns from which the verdicts are one table row per case
MARKDOWN_ROWS = 50  # per section: a GitHub comment holds at most 65,536 characters


def headline(cmp: Comparison) -> str:
    failing = cmp.failing
    if failing:
        parts = [f"{sum(1 for r in failing if r.verdict is v)} {v.value}" for v in Verdict]
        return "FAIL: " + ", ".join(p for p in parts if not p.startswith("0 "))
    return f"PASS: no case failed the gate ({len(cmp.rows)} compared)"


def counts(cmp: Comparison) -> dict[str, int]:
    return {v.value: cmp.count(v) for v in Verdict if cmp.count(v)}


def _figure(metric: Metric, value: float | None) -> str:
    """A figure with a unit that scales (81.2 µs, 25.0 GFLOP/s), so a CPU run's tiny
    throughput is not 2.5e-05 and its bandwidth not 0."""
    if metric is Metric.LATENCY:
        return units.latency(value)
    if metric is Metric.TFLOPS:
        return units.flops(value)
    if metric is Metric.GBPS:
        return units.bandwidth(value)
    return units.mebibytes(None if value is None else value * 2**20)


def _change(row: Row) -> str:
    """The median's move in the metric's own direction: +12% latency, -11% TFLOP/s."""
    return "–" if row.ratio is None else f"{row.ratio - 1:+.1%}"


def _status(row: Row) -> str:
    if row.base_status == row.cur_status:
        return row.cur_status or "–"
    return f"{row.base_status or '–'} → {row.cur_status or '–'}"


def env_panel(cmp: Comparison) -> Panel | None:
    if not cmp.env_diffs:
        return None
    t = Table("", "baseline", "current", box=None)
    for d in cmp.env_diffs:  # versions and GPU names are data, not Rich markup
        t.add_row(Text(d.key), Text(d.base), Text(d.current))
    note = (
        "GPU models differ: compared anyway (--allow-env-mismatch); timings may not be comparable."
        if cmp.gpu_mismatch
        else "Versions differ: a change may come from the environment, not the code."
    )
    return Panel(Group(Text(note), t), title="environment differs",
                 style="bold red" if cmp.gpu_mismatch else "yellow")  # fmt: skip


def _shown(cmp: Comparison) -> tuple[Sequence[Row], int]:
    """The rows to list (past TERMINAL_ROWS, the `same` ones are only counted)."""
    rows: Sequence[Row] = cmp.rows
    if len(rows) <= TERMINAL_ROWS:
        return rows, 0
    shown = [r for r in rows if r.verdict is not Verdict.SAME]
    return shown, len(rows) - len(shown)


def _title(cmp: Comparison) -> str:
    return (f"fa-bench compare: {cmp.metric.value}, threshold "
            f"{cmp.thresholds.of(cmp.metric):.1%}, alpha {cmp.thresholds.alpha:g}")  # fmt: skip


def _not_listed(hidden: int) -> str:
    return f"{plural(hidden, 'case')} 'same' not listed"


def verdict_table(cmp: Comparison) -> Table:
    """All compared cases, gate failures and the largest changes first: one row each."""
    rows, hidden = _shown(cmp)
    t = Table(title=_title(cmp), caption=_not_listed(hidden) if hidden else None)
    for col, wrap in [("verdict", False), ("case", True), ("status", True), ("baseline", False),
                      ("current", False), ("change", False),
                      ("confidence / why", True)]:  # fmt: skip
        numeric = col in ("baseline", "current", "change")
        t.add_column(col, justify="right" if numeric else "left", no_wrap=not wrap,
                     overflow="fold")  # fmt: skip
    for r in rows:
        style = VERDICT_STYLE[r.verdict]
        t.add_row(Text(r.verdict.value, style), Text(r.key), Text(_status(r)),
                  _figure(cmp.metric, r.base_value), _figure(cmp.metric, r.cur_value),
                  _change(r), Text(r.reason))  # fmt: skip
    return t


def verdict_lines(cmp: Comparison) -> Group:
    """The same verdicts for a narrow console (a CI log is 80 columns): each case id on a
    line of its own, whole, and its verdict and figures on the next."""
    rows, hidden = _shown(cmp)
    parts: list = [Text(_title(cmp), style="bold")]
    for r in rows:
        parts.append(Text(r.key))  # data, not markup
        parts.append(Text.assemble(
            "  ", (r.verdict.value, VERDICT_STYLE[r.verdict]), f"  {_status(r)}  ",
            f"{_figure(cmp.metric, r.base_value)} → {_figure(cmp.metric, r.cur_value)}",
            f"  {_change(r)}", f"  {r.reason}" if r.reason else "",
        ))  # fmt: skip
    if hidden:
        parts.append(Text(_not_listed(hidden), style="dim"))
    return Group(*parts)


def terminal(cmp: Comparison, width: int = WIDE) -> Group:
    """The verdicts, as a table from WIDE columns, else one case per two lines."""
    parts: list = []
    panel = env_panel(cmp)
    if panel is not None:
        parts.append(panel)
    parts.append(verdict_table(cmp) if width >= WIDE else verdict_lines(cmp))
    summary = ", ".join(f"{n} {v}" for v, n in counts(cmp).items())  # verdicts: no plural
    style = "bold red" if cmp.failing else "bold green"
    parts.append(Text(f"{headline(cmp)}  [{summary}]", style=style))
    return Group(*parts)


# A cell is data (error messages, versions, case ids) inside a pull-request comment: HTML
# there would render (an <img onerror=...>, a </details> closing ours), Markdown would link,
# embed images or math, and a pipe would split the cell. Entities for HTML, a backslash for
# Markdown's punctuation; one line per cell.
_MD_ENTITIES = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}
_MD_PUNCTUATION = frozenset("\\`*_[]()!~|$#")


def _md_escape(text: str) -> str:
    """`text` as the literal content of a Markdown table cell."""
    out = []
    for ch in " ".join(str(text).splitlines()):
        if ch in _MD_ENTITIES:
            out.append(_MD_ENTITIES[ch])
        elif ch in _MD_PUNCTUATION:
            out.append("\\" + ch)
        else:
            out.append(ch)
    return "".join(out)


def _md_code(text: str, *, cell: bool = True) -> str:
    """`text` as a code span: HTML and Markdown inside one are shown as written, so only the
    fence (longer than any backtick run in it) and, in a table cell, pipes need care."""
    text = " ".join(str(text).splitlines())
    if cell:  # GFM splits the row at a pipe even inside a code span; `\|` is one
        text = text.replace("|", "\\|")
    longest = max((len(run) for run in re.findall("`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _md_rows(title: str, rows: Sequence[Row], metric: Metric) -> list[str]:
    if not rows:
        return []
    out = [f"#### {title} ({len(rows)})", "",
           "| case | status | baseline | current | change | confidence / why |",
           "|---|---|--:|--:|--:|---|"]  # fmt: skip
    for r in rows[:MARKDOWN_ROWS]:
        out.append(
            f"| {_md_code(r.key)} | {_md_escape(_status(r))} | {_figure(metric, r.base_value)} "
            f"| {_figure(metric, r.cur_value)} "
            f"| {_change(r)} | {_md_escape(r.reason)} |"
        )
    if len(rows) > MARKDOWN_ROWS:
        out.append(f"\n… and {len(rows) - MARKDOWN_ROWS} more (see the JSON output).")
    return [*out, ""]


def markdown(cmp: Comparison, *, baseline: str, current: str) -> str:
    """A summary for a pull-request comment: the headline verdict, the environment diff,
    then the cases that failed the gate, the faster ones and the ambiguous ones."""
    mark = "❌" if cmp.failing else "✅"
    th = cmp.thresholds
    lines = [
        f"### {mark} fa-bench compare: {headline(cmp)}",
        "",
        f"Baseline {_md_code(baseline, cell=False)} → current {_md_code(current, cell=False)}; "
        f"metric **{cmp.metric.value}**, "
        f"threshold {th.of(cmp.metric):.1%}, alpha {th.alpha:g}; gate fails on: "
        + ", ".join(sorted(f.value for f in cmp.fail_on))
        + ".",
        "",
        "Counts: " + ", ".join(f"{v} {n}" for v, n in counts(cmp).items()) + ".",
        "",
    ]
    if cmp.env_diffs:
        lines += ["#### ⚠️ Environment differs", "", "| | baseline | current |", "|---|---|---|"]
        lines += [f"| {_md_escape(d.key)} | {_md_escape(d.base)} | {_md_escape(d.current)} |"
                  for d in cmp.env_diffs]  # fmt: skip
        lines.append("")
    failing = cmp.failing
    by = {v: [r for r in cmp.rows if r.verdict is v] for v in Verdict}
    lines += _md_rows("Failing the gate", failing, cmp.metric)
    lines += _md_rows("Faster", by[Verdict.FASTER], cmp.metric)
    lines += _md_rows("Fixed", by[Verdict.FIXED], cmp.metric)
    other = [r for r in by[Verdict.AMBIGUOUS] + by[Verdict.CHANGED] + by[Verdict.MISSING]
             + by[Verdict.NEW] if r not in failing]  # fmt: skip
    if other:
        lines += ["<details><summary>Ambiguous, changed, missing or new (not gating)</summary>", ""]
        lines += _md_rows("Not gating", other, cmp.metric)
        lines += ["</details>", ""]
    lines.append(
        "A case is slower or faster only when its median moved past the threshold, a "
        "Mann-Whitney U test on the raw samples gives p < alpha, and the p20–p80 ranges of "
        "the two runs do not overlap; past the threshold otherwise, it is ambiguous."
    )
    return "\n".join(lines) + "\n"


def _row_json(r: Row) -> dict:
    return {
        "key": r.key, "verdict": r.verdict.value, "base_status": r.base_status,
        "current_status": r.cur_status, "base": r.base_value, "current": r.cur_value,
        "ratio": r.ratio, "worse": r.worse, "p_value": r.p_value, "ranges_overlap": r.overlap,
        "base_p20_p80": list(r.base_range) if r.base_range else None,
        "current_p20_p80": list(r.cur_range) if r.cur_range else None,
        "n": list(r.n) if r.n else None, "reason": r.reason,
        "sm_clock_mhz": list(r.sm_clock_mhz) if r.sm_clock_mhz else None,
    }  # fmt: skip


def to_json(cmp: Comparison, *, baseline: Sequence[str], current: Sequence[str]) -> str:
    th = cmp.thresholds
    doc = {
        "schema": COMPARE_SCHEMA,
        "exit_code": cmp.exit_code,
        "headline": headline(cmp),
        "metric": cmp.metric.value,
        "unit": cmp.metric.unit,
        "thresholds": {m.value: th.of(m) for m in Metric}
        | {"alpha": th.alpha, "min_samples": th.min_samples},
        "fail_on": sorted(f.value for f in cmp.fail_on),
        "baseline": list(baseline),
        "current": list(current),
        "keyed_by_gpu": cmp.keyed_by_gpu,
        "gpu_mismatch": cmp.gpu_mismatch,
        "environment": [
            {"key": d.key, "base": d.base, "current": d.current} for d in cmp.env_diffs
        ],
        "counts": counts(cmp),
        "cases": [_row_json(r) for r in cmp.rows],
    }
    # worse may be inf (peak memory from 0): JSON has no infinity, so sanitize writes null.
    return json.dumps(sanitize(doc), indent=1, allow_nan=False) + "\n"
