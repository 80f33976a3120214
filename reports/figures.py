"""The report's plotly figures, built from merged cases.

Every string that came from the data (implementation names, GPU names, error messages) is
HTML-escaped before it goes into a trace name or hover text: plotly.js renders those as
(restricted) markup, and the page must show data, never run or style it.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import plotly.graph_objects as go
from plotly.subplots import make_subplots

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


def facet_key(c: dict) -> tuple:
    return (c["mode"], c["dtype"], c["head_dim"], c["causal"])


def facet_title(key: tuple) -> str:
    mode, dtype, head_dim, causal = key
    return f"{mode} · {dtype} · d={head_dim} · {'causal' if causal else 'full'}"


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


def pow2_ticks(values: Iterable[float]) -> dict:
    """A log x axis with ticks at powers of two (1k, 16k, ...), as sequence lengths are."""
    vals = [v for v in values if v and v > 0]
    if not vals:
        return {"type": "log"}
    lo, hi = math.floor(math.log2(min(vals))), math.ceil(math.log2(max(vals)))
    ticks = [2**e for e in range(lo, hi + 1)]
    text = [f"{t // 1024}k" if t >= 1024 else str(t) for t in ticks]
    return {"type": "log", "tickvals": ticks, "ticktext": text}


def tick_label(value: float) -> str:
    """A tick value written in full (0.05, 200, 5000, 20k), never as a bare mantissa."""
    value = float(f"{value:.3g}")
    if value >= 1e6:
        return f"{value / 1e6:g}M"
    return f"{value / 1000:g}k" if value >= 10_000 else f"{value:g}"


def log_y_per_panel(fig: go.Figure) -> None:
    """Full-number log ticks on each subplot's y axis, from the values drawn in it."""
    panels: dict[str, list[float]] = {}
    for trace in fig.data:
        panels.setdefault(trace.yaxis or "y", []).extend(v for v in trace.y if v is not None)
    for axis, values in panels.items():
        fig.layout["yaxis" + axis[1:]].update(log_ticks(values))


def log_ticks(values: Iterable[float]) -> dict:
    """A log axis whose every label is a full number. Plotly's own log ticks label the
    in-between ones by their leading digit only ('2 … 9', so 600 reads '6'); these are
    1-2-3-5, 1-2-5 or powers of ten per decade, fewer as the data spans more decades."""
    vals = [v for v in values if v and v > 0 and math.isfinite(v)]
    if not vals:
        return {"type": "log"}
    lo, hi = min(vals), max(vals)
    decades = math.log10(hi / lo)
    mantissas = (1, 2, 3, 5) if decades <= 2 else (1, 2, 5) if decades <= 3.5 else (1,)
    every = 1 if decades <= 8 else math.ceil(decades / 8)  # powers of ten, ~9 at most
    exponents = range(math.floor(math.log10(lo)) - 1, math.ceil(math.log10(hi)) + 1)
    ticks = [m * 10.0**e for e in exponents if e % every == 0 for m in mantissas]
    # one tick past each end: plotly pads the range, and a tick off-range is not drawn
    ticks = [t for t in ticks if lo / 2 <= t <= hi * 2]
    return {"type": "log", "tickmode": "array", "tickvals": ticks,
            "ticktext": [tick_label(t) for t in ticks]}  # fmt: skip


def _facets(cases: list[dict]) -> list[tuple]:
    return sorted({facet_key(c) for c in cases}, key=lambda k: (k[0], k[1], k[2], k[3]))


def _columns(n_facets: int) -> int:
    """Panels per row: up to four, so a 16-panel suite is four rows, not eight."""
    return 1 if n_facets == 1 else 2 if n_facets <= 4 else 3 if n_facets <= 9 else 4


def _grid(facets: list[tuple], y_title: str, *, height_per_row: int = 270) -> go.Figure:
    cols = _columns(len(facets))
    rows = math.ceil(len(facets) / cols)
    fig = make_subplots(
        rows=rows,
        cols=cols,
        subplot_titles=[facet_title(k) for k in facets],
        horizontal_spacing=0.2 / cols,
        vertical_spacing=min(0.35 / rows, 0.12),
    )
    fig.update_annotations(font_size=13)  # the panel titles, which must fit a quarter width
    # Room for a legend above the panels and one below them (see _legends).
    fig.update_layout(
        height=150 + height_per_row * rows,
        hovermode="closest",
        margin={"t": 80, "b": 70, "r": 30},
    )
    for i in range(len(facets)):
        row, col = _cell(i, len(facets))
        if col == 1:
            fig.update_yaxes(title_text=y_title, row=row, col=col)
        if i + cols >= len(facets):  # the lowest panel of its column
            fig.update_xaxes(title_text="sequence length N (keys)", row=row, col=col)
    return fig


def _cell(i: int, n_facets: int) -> tuple[int, int]:
    cols = _columns(n_facets)
    return i // cols + 1, i % cols + 1


def _legends(fig: go.Figure) -> None:
    """A horizontal legend above the panels and, on a grid too tall to see whole, the
    same entries again below them, so one is in view whichever end the reader is at.
    The copies are empty traces in the same legend groups: a click on either toggles
    the implementation in every panel."""
    top = {"orientation": "h", "x": 0, "xanchor": "left", "yref": "container"}
    fig.update_layout(legend={**top, "y": 1, "yanchor": "top"})
    if fig.layout.height < 1000:
        return
    for t in [t for t in fig.data if t.showlegend is not False]:
        fig.add_trace(
            go.Scatter(
                x=[None], y=[None], name=t.name, legendgroup=t.legendgroup, legend="legend2",
                mode=t.mode, line=t.line, marker=t.marker, hoverinfo="skip",
            )
        )  # fmt: skip
    fig.update_layout(legend2={**top, "y": 0, "yanchor": "bottom", "itemdoubleclick": False})


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
        row, col = _cell(i, len(facets))
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
        row, col = _cell(i, len(facets))
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
    facets = _facets(merged.cases)
    if not any(c.get("tflops") for c in merged.cases) and not any(
        c["status"] in ("oom", *FAILED) for c in merged.cases
    ):
        return None
    fig = _grid(facets, "TFLOP/s")
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
    _legends(fig)
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
    facets = _facets(merged.cases)
    fig = _grid(facets, "peak memory (GiB)")
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
    _legends(fig)
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
