"""The report's plotly figures, built from merged cases.

Every string that came from the data (implementation names, GPU names, error messages) is
HTML-escaped before it goes into a trace name or hover text: plotly.js renders those as
(restricted) markup, and the page must show data, never run or style it.
"""

from __future__ import annotations

import html
import json
from collections.abc import Callable
from dataclasses import dataclass

import plotly.graph_objects as go

from fa_bench.reports.axes import (
    add_legends,
    facet_key,
    facet_keys,
    log_y_per_panel,
    panel_cell,
    panel_grid,
    pow2_ticks,
)
from fa_bench.reports.build import Merged

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
FAILED = ("error", "timeout", "mismatch")
GIB = 2**30
FIGURES_ID = "fa-bench-figures"


@dataclass
class Figure:
    id: str
    title: str
    caption: str
    figure: go.Figure


def esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def seqlen(c: dict) -> int:
    """The x of the line plots: the key length (the context a query sees)."""
    return int(c["seqlen_k"])


def series_name(c: dict, merged: Merged, gqa: bool) -> str:
    """impl, plus the GPU when several were merged, plus KV heads when they vary."""
    name = esc(c["impl"])
    if len(merged.gpus) > 1:
        name += f" · {esc(c['gpu'])}"
    if gqa:
        name += f" · Hkv={c['heads_kv']}"
    return name


def _styles(merged: Merged) -> Callable[[dict], dict]:
    color = {impl: PALETTE[i % len(PALETTE)] for i, impl in enumerate(merged.impls)}
    symbol = {impl: SYMBOLS[i % len(SYMBOLS)] for i, impl in enumerate(merged.impls)}
    rank = {impl: min(i, 4) for i, impl in enumerate(merged.impls)}
    dash = {gpu: DASHES[i % len(DASHES)] for i, gpu in enumerate(merged.gpus)}
    return lambda c: {
        "color": color[c["impl"]],
        "symbol": symbol[c["impl"]],
        "size": 13 - 2 * rank[c["impl"]],
        "width": 3.5 - 0.5 * rank[c["impl"]],
        "dash": dash[c["gpu"]],
    }


def fmt_ms(v: float | None) -> str:
    return "–" if v is None else f"{v:.4g} ms"


def hover(c: dict) -> str:
    """Latency with its p20–p80 spread, TFLOP/s, GB/s, peak memory, accuracy, status."""
    lat = c.get("latency_ms") or {}
    acc = c.get("accuracy") or {}
    peak = c.get("peak_mem_bytes")
    lines = [
        f"<b>{esc(c['impl'])}</b> on {esc(c['gpu'])}: {esc(c['status'])}",
        f"B={c['batch']} Hq={c['heads_q']} Hkv={c['heads_kv']} Sq={c['seqlen_q']} "
        f"Sk={c['seqlen_k']} d={c['head_dim']}",
        f"latency {fmt_ms(lat.get('median'))} (p20–p80 {fmt_ms(lat.get('p20'))}–"
        f"{fmt_ms(lat.get('p80'))}, n={lat.get('n', '–')})",
        f"{_num(c.get('tflops'), 'TFLOP/s')} · {_num(c.get('gbps_model'), 'GB/s (model)')}",
        f"peak memory {'–' if peak is None else f'{peak / GIB:.3g} GiB'}",
    ]
    if acc:
        lines.append(
            f"max abs err {_num(acc.get('max_abs_err'), '')} · "
            f"{'passed' if acc.get('passed') else 'FAILED'} accuracy"
        )
    tel = c.get("telemetry") or {}
    if tel.get("gbps_nvml") is not None:
        lines.append(_num(tel["gbps_nvml"], "GB/s (NVML)"))
    if c.get("error"):
        lines.append(esc(_shorten(str(c["error"]), 160)))
    return "<br>".join(lines)


def _num(v: object, unit: str) -> str:
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return f"– {unit}".strip()
    return f"{v:.4g} {unit}".strip()


def _shorten(text: str, n: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"


def _series_lines(
    fig: go.Figure, merged: Merged, facets: list[tuple], y: Callable[[dict], float | None]
) -> None:
    """One line per implementation (and GPU) in each facet, over its ok cases."""
    style = _styles(merged)
    shown: set[str] = set()
    for i, key in enumerate(facets):
        cases = [c for c in merged.cases if facet_key(c) == key and c["status"] == "ok"]
        gqa = len({c["heads_q"] // c["heads_kv"] for c in cases}) > 1
        groups: dict[str, list[dict]] = {}
        for c in cases:
            if y(c) is not None:
                groups.setdefault(series_name(c, merged, gqa), []).append(c)
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
    statuses: tuple[str, ...],
    name: str,
    symbol: str,
    color: str,
    y: Callable[[dict], float],
) -> None:
    """Cases that did not produce a number are marked where they would be, not dropped."""
    shown = False
    for i, key in enumerate(facets):
        marked = [c for c in merged.cases if facet_key(c) == key and c["status"] in statuses]
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
    if not any(c.get("tflops") for c in merged.cases) and not any(
        c["status"] in ("oom", *FAILED) for c in merged.cases
    ):
        return None
    fig = panel_grid(facets, "TFLOP/s")
    _series_lines(fig, merged, facets, lambda c: c.get("tflops"))
    # Failed and OOM cases have no throughput: drawn at 0 with their message on hover.
    _status_markers(fig, merged, facets, ("oom",), "out of memory", "x", "#d62728", lambda c: 0.0)
    _status_markers(
        fig,
        merged,
        facets,
        FAILED,
        "failed (error/timeout/mismatch)",
        "triangle-up-open",
        "#ff7f0e",
        lambda c: c.get("tflops") or 0.0,
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
    has_peak = any(c.get("peak_mem_bytes") for c in merged.cases)
    has_oom = any(c["status"] == "oom" for c in merged.cases)
    if not (has_peak or has_oom):
        return None
    facets = facet_keys(merged.cases)
    fig = panel_grid(facets, "peak memory (GiB)")
    _series_lines(
        fig,
        merged,
        facets,
        lambda c: (c.get("peak_mem_bytes") or None) and c["peak_mem_bytes"] / GIB,
    )
    limit = _device_memory_gib(merged)
    top = max(
        (c["peak_mem_bytes"] / GIB for c in merged.cases if c.get("peak_mem_bytes")), default=1.0
    )
    # OOM cases needed more than the card had: drawn at the card's memory (or the top).
    _status_markers(
        fig,
        merged,
        facets,
        ("oom",),
        "out of memory",
        "x",
        "#d62728",
        lambda c: limit.get(c["gpu"], top),
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


def memory_sweep(cases: list[dict]) -> str:
    """Which of the two the data holds, per panel and head count: a fixed batch, or a
    fixed token count (batch = tokens ÷ N, as the standard suite does)."""
    sweeps: dict[tuple, set[tuple[int, int]]] = {}
    for c in cases:
        key = (*facet_key(c), c["heads_q"], c["heads_kv"], c["gpu"], c["impl"])
        sweeps.setdefault(key, set()).add((c["batch"], c["seqlen_q"]))
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
        gpus = (doc.get("env") or {}).get("gpus") or []
        if gpus and gpus[0].get("memory_bytes"):
            out[label] = gpus[0]["memory_bytes"] / GIB
    return out


def build_all(merged: Merged, baseline: str) -> list[Figure]:
    from fa_bench.reports import per_gpu, roofline, speedup

    built = [
        tflops_figure(merged),
        memory_figure(merged),
        speedup.speedup_figure(merged, baseline),
        roofline.roofline_figure(merged),
        roofline.bandwidth_figure(merged),
        roofline.telemetry_figure(merged),
        per_gpu.per_gpu_figure(merged),
    ]
    figs = [f for f in built if f is not None]
    for f in figs:
        # The page's <h2> titles each figure: plotly's default 100 px top margin, kept
        # for a title it never draws, would leave a blank band above the plot.
        if f.figure.layout.margin.t is None:
            f.figure.update_layout(margin_t=24)
    return figs


def figures_json(figs: list[Figure]) -> str:
    """The figures as a JSON data element (never script), escaped like the results."""
    import plotly.io

    specs = {f.id: json.loads(plotly.io.to_json(f.figure, validate=False)) for f in figs}
    text = json.dumps(specs, separators=(",", ":"), allow_nan=False)
    text = text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    return f'<script type="application/json" id="{FIGURES_ID}">{text}</script>'
