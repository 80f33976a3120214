"""The report's plotly figures, built from merged cases.

Every string that came from the data (implementation names, GPU names, error messages) is
escaped (`esc`) before it goes into a trace name, hover text or title: plotly.js renders
those as (restricted) markup, and the page must show data, never run or style it.
"""

from __future__ import annotations

import html
import json
from collections.abc import Callable
from dataclasses import dataclass

import plotly.graph_objects as go

from fa_bench.case import Status
from fa_bench.reports.axes import (
    add_legends,
    facet_key,
    facet_keys,
    heads_label,
    log_y_per_panel,
    panel_cell,
    panel_grid,
    pow2_ticks,
)
from fa_bench.reports.merge import Merged, MergedCase, group_by
from fa_bench.results.record import CaseRecord
from fa_bench.variant_cost import variant_words

PALETTE = (
    "#1f77b4",
    "#d62728",
    "#2ca02c",
    "#9467bd",
    "#ff7f0e",
    "#17becf",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
)
DASHES = ("solid", "dash", "dot", "dashdot", "longdash")
# One marker per implementation, open, and each a size smaller than the one before (the
# line a little thinner): lines lying on top of each other (fused kernels' memory) then
# show as nested marks and stripes, not as the last one drawn. Not "x" or
# "triangle-up-open": those mark out-of-memory and failed cases.
SYMBOLS = (
    "circle-open",
    "square-open",
    "diamond-open",
    "triangle-down-open",
    "star-open",
    "hexagon-open",
    "cross-open",
    "pentagon-open",
    "hourglass-open",
    "star-square-open",
)
FAILED = (Status.ERROR, Status.TIMEOUT, Status.MISMATCH)
GIB = 2**30
FIGURES_ID = "fa-bench-figures"


@dataclass
class Figure:
    id: str
    title: str
    caption: str
    figure: go.Figure


def esc(value: object) -> str:
    """`value` as literal text in plotly's markup (legend, hover, titles, tick labels).

    Only `&`, `<` and `>`: with no `<` left, the text holds no tag, so a quote means nothing
    there; and plotly.js decodes `&amp;`, `&lt;`, `&gt;` and numeric entities but not
    `&quot;`, which the legend would show as typed. Escaped once, for plotly only: the page's
    own text is escaped by the template, and the figures' JSON by `figures_json`."""
    return html.escape(str(value), quote=False)


def seqlen(c: MergedCase) -> int:
    """The x of the line plots: the key length (the context a query sees)."""
    return int(c.record.case.seqlen_k)


def series_name(c: MergedCase, merged: Merged, heads: str = "") -> str:
    """impl, plus the GPU (or run) when several were merged, plus the head counts (the
    sub-series, `heads_label`) where an implementation has several."""
    name = esc(c.record.impl)
    if len(merged.gpus) > 1:
        name += f" · {esc(c.gpu)}"
    return name + (f" · {heads}" if heads else "")


def impl_gpu_name(c: MergedCase, merged: Merged) -> str:
    """impl, plus the GPU when several were merged: the scatter figures' series."""
    return esc(c.record.impl) + (f" · {esc(c.gpu)}" if len(merged.gpus) > 1 else "")


def _styles(
    merged: Merged, sub: Callable[[MergedCase], str] | None = None
) -> Callable[[MergedCase], dict]:
    """Colour per implementation, dash per GPU (or run), marker per implementation and
    sub-series (`sub`, the head counts): every legend entry looks different."""
    n = len(merged.impls)
    index = {impl: i for i, impl in enumerate(merged.impls)}
    rank = {impl: min(i, 4) for i, impl in enumerate(merged.impls)}
    dash = {gpu: DASHES[i % len(DASHES)] for i, gpu in enumerate(merged.gpus)}
    subs: dict[str, int] = {}
    if sub is not None:
        for c in merged.cases:
            subs.setdefault(sub(c), len(subs))

    def style(c: MergedCase) -> dict:
        i = index[c.record.impl]
        j = subs.get(sub(c), 0) if sub is not None else 0
        return {
            "color": PALETTE[i % len(PALETTE)],
            "symbol": SYMBOLS[(i + j * n) % len(SYMBOLS)],
            "size": 13 - 2 * rank[c.record.impl],
            "width": 3.5 - 0.5 * rank[c.record.impl],
            "dash": dash[c.gpu],
        }

    return style


def fmt_ms(v: float | None) -> str:
    return "–" if v is None else f"{v:.4g} ms"


def hover(c: MergedCase) -> str:
    """Latency with its p20–p80 spread, TFLOP/s, GB/s, peak memory, accuracy, status."""
    r, k = c.record, c.record.case
    lat = r.latency_ms
    median, p20, p80 = (lat.median, lat.p20, lat.p80) if lat else (None, None, None)
    n = lat.n if lat else "–"
    acc = r.accuracy or {}
    peak = r.peak_mem_bytes
    lines = [
        f"<b>{esc(r.impl)}</b> on {esc(c.gpu)}: {esc(r.status.value)}",
        f"B={k.batch} Hq={k.heads_q} Hkv={k.heads_kv} Sq={k.seqlen_q} "
        f"Sk={k.seqlen_k} d={k.head_dim}" + (f" · {esc(variant_words(k))}" if k.is_variant else ""),
        f"latency {fmt_ms(median)} (p20–p80 {fmt_ms(p20)}–{fmt_ms(p80)}, n={n})",
        f"{_num(r.tflops, 'TFLOP/s')} · {_num(r.gbps_model, 'GB/s (model)')}",
        f"peak memory {'–' if peak is None else f'{peak / GIB:.3g} GiB'}",
    ]
    if acc:
        lines.append(
            f"max abs err {_num(acc.get('max_abs_err'), '')} · "
            f"{'passed' if acc.get('passed') else 'FAILED'} accuracy"
        )
    tel = r.telemetry or {}
    if tel.get("gbps_nvml") is not None:
        lines.append(_num(tel["gbps_nvml"], "GB/s (NVML)"))
    if r.noisy_at_limit:
        lines.append(f"<b>⚠ {esc(time_limit_note(r))}</b>")
    if r.error:
        lines.append(esc(_shorten(str(r.error), 160)))
    return "<br>".join(lines)


def time_limit_note(r: CaseRecord) -> str:
    """Why a case's median is less certain than asked (`CaseRecord.noisy_at_limit`)."""
    timing, lat = r.timing or {}, r.latency_ms
    noise = lat.noise if lat is not None and lat.noise is not None else float("nan")
    limit = timing.get("max_time_s")
    within = f" ({limit:g} s)" if isinstance(limit, (int, float)) else ""
    target = timing.get("target_noise", 0.01)
    return (f"stopped at the time limit{within} with noise {noise:.1%} "
            f"above the {target:.1%} target")  # fmt: skip


def _num(v: object, unit: str) -> str:
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return f"– {unit}".strip()
    return f"{v:.4g} {unit}".strip()


def _shorten(text: str, n: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"


def _series_lines(
    fig: go.Figure,
    merged: Merged,
    facets: list[tuple],
    y: Callable[[MergedCase], float | None],
) -> None:
    """One line per implementation (GPU, head counts) in each facet, over its ok cases."""
    ok = [c for c in merged.cases if c.record.status == Status.OK and y(c) is not None]
    heads = heads_label(ok)
    style = _styles(merged, heads)
    shown: set[str] = set()
    by_facet = group_by(ok, facet_key)
    for i, key in enumerate(facets):
        groups: dict[str, list[MergedCase]] = {}
        for c in by_facet.get(key, []):
            groups.setdefault(series_name(c, merged, heads(c)), []).append(c)
        row, col = panel_cell(i, len(facets))
        for name, group in groups.items():
            group.sort(key=seqlen)
            s = style(group[0])
            fig.add_trace(
                go.Scatter(
                    x=[seqlen(c) for c in group],
                    y=[y(c) for c in group],
                    name=name,
                    legendgroup=name,
                    showlegend=name not in shown,
                    mode="lines+markers",
                    line={"color": s["color"], "dash": s["dash"], "width": s["width"]},
                    marker={"symbol": s["symbol"], "size": s["size"], "line": {"width": 2}},
                    text=[hover(c) for c in group],
                    hovertemplate="%{text}<extra></extra>",
                ),
                row=row,
                col=col,
            )
            shown.add(name)


def _status_markers(
    fig: go.Figure,
    merged: Merged,
    facets: list[tuple],
    statuses: tuple[Status, ...],
    name: str,
    symbol: str,
    color: str,
    y: Callable[[MergedCase], float],
) -> None:
    """Cases that did not produce a number are marked where they would be, not dropped."""
    shown = False
    by_facet = group_by((c for c in merged.cases if c.record.status in statuses), facet_key)
    for i, key in enumerate(facets):
        marked = by_facet.get(key, [])
        if not marked:
            continue
        row, col = panel_cell(i, len(facets))
        fig.add_trace(
            go.Scatter(
                x=[seqlen(c) for c in marked],
                y=[y(c) for c in marked],
                name=name,
                legendgroup=name,
                showlegend=not shown,
                mode="markers",
                marker={"symbol": symbol, "size": 11, "color": color, "line": {"width": 2}},
                text=[hover(c) for c in marked],
                hovertemplate="%{text}<extra></extra>",
            ),
            row=row,
            col=col,
        )
        shown = True


def tflops_figure(merged: Merged) -> Figure | None:
    facets = facet_keys(merged.cases)
    if not any(c.record.tflops for c in merged.cases) and not any(
        c.record.status in (Status.OOM, *FAILED) for c in merged.cases
    ):
        return None
    fig = panel_grid(facets, "TFLOP/s")
    _series_lines(fig, merged, facets, lambda c: c.record.tflops)
    # Failed and OOM cases have no throughput: drawn at 0 with their message on hover.
    oom = (Status.OOM,)
    _status_markers(fig, merged, facets, oom, "out of memory", "x", "#d62728", lambda c: 0.0)
    _status_markers(
        fig,
        merged,
        facets,
        FAILED,
        "failed (error/timeout/mismatch)",
        "triangle-up-open",
        "#ff7f0e",
        lambda c: c.record.tflops or 0.0,
    )
    fig.update_xaxes(**pow2_ticks(seqlen(c) for c in merged.cases))
    fig.update_yaxes(rangemode="tozero")  # every panel from 0, not only those with a marker there
    add_legends(fig)
    return Figure(
        "tflops",
        "Throughput vs sequence length",
        "Achieved TFLOP/s (FlashAttention-3 FLOP count) of each implementation, one "
        "panel per mode, dtype, head dim and masking; log-2 x axis. Hover for latency "
        "with its p20–p80 spread, bandwidth, memory and accuracy.",
        fig,
    )


def memory_figure(merged: Merged) -> Figure | None:
    has_peak = any(c.record.peak_mem_bytes for c in merged.cases)
    has_oom = any(c.record.status == Status.OOM for c in merged.cases)
    if not (has_peak or has_oom):
        return None
    facets = facet_keys(merged.cases)
    fig = panel_grid(facets, "peak memory (GiB)")
    _series_lines(
        fig,
        merged,
        facets,
        lambda c: (c.record.peak_mem_bytes or None) and c.record.peak_mem_bytes / GIB,
    )
    limit = _device_memory_gib(merged)
    top = max(
        (c.record.peak_mem_bytes / GIB for c in merged.cases if c.record.peak_mem_bytes),
        default=1.0,
    )
    # OOM cases needed more than the card had: drawn at the card's memory (or the top).
    _status_markers(
        fig,
        merged,
        facets,
        (Status.OOM,),
        "out of memory",
        "x",
        "#d62728",
        lambda c: limit.get(c.gpu, top),
    )
    log_y_per_panel(fig)
    fig.update_xaxes(**pow2_ticks(seqlen(c) for c in merged.cases))
    add_legends(fig)
    note = "" if has_peak else " No case recorded its peak memory (CPU runs do not measure it)."
    naive = (
        "The naive implementation materialises the N×N score matrix for every (batch, "
        "head), B·H·N² elements: quadratic in N at a fixed batch, linear in N at a fixed "
        "token count B·N. "
        if "naive" in merged.impls
        else ""
    )
    return Figure(
        "memory",
        "Peak memory vs sequence length",
        "Extra device memory one call allocated, log scale. "
        + naive
        + "Fused kernels keep no score matrix: theirs is B·H·N·d, linear in N at a fixed "
        "batch and flat at a fixed token count. "
        + memory_sweep(merged.cases)
        + "Out-of-memory cases are marked at the device's memory."
        + note,
        fig,
    )


def memory_sweep(cases: list[MergedCase]) -> str:
    """Which of the two the data holds, per panel and head count: a fixed batch, or a
    fixed token count (batch = tokens ÷ N, as the standard suite does)."""
    sweeps: dict[tuple, set[tuple[int, int]]] = {}
    for c in cases:
        k = c.record.case
        key = (*facet_key(c), k.heads_q, k.heads_kv, c.gpu, k.impl)
        sweeps.setdefault(key, set()).add((k.batch, k.seqlen_q))
    sweeps = {k: v for k, v in sweeps.items() if len({n for _, n in v}) > 1}
    if not sweeps:
        return ""
    if all(len({b for b, _ in v}) == 1 for v in sweeps.values()):
        return "Here the batch is fixed as N grows. "
    if all(len({b * n for b, n in v}) == 1 for v in sweeps.values()):
        return (
            "Here the token count is fixed (batch = tokens ÷ N), so no line grows faster "
            "than linearly in N. "
        )
    return ""


def _device_memory_gib(merged: Merged) -> dict[str, float]:
    out: dict[str, float] = {}
    for doc, label in merged.labelled_docs():
        gpus = doc.env.get("gpus") or []
        if gpus and gpus[0].get("memory_bytes"):
            out[label] = gpus[0]["memory_bytes"] / GIB
    return out


def figures_json(figs: list[Figure]) -> str:
    """The figures as a JSON data element (never script), escaped like the results."""
    import plotly.io

    specs = {f.id: json.loads(plotly.io.to_json(f.figure, validate=False)) for f in figs}
    text = json.dumps(specs, separators=(",", ":"), allow_nan=False)
    text = text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    return f'<script type="application/json" id="{FIGURES_ID}">{text}</script>'
