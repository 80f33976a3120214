"""Axes, panel grids and legends shared by the report's figures.

The line figures draw one panel per facet (mode, dtype, head dim, masking, variant) on a grid of
up to four columns; their log axes get ticks labelled with full numbers.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from fa_bench.reports.merge import MergedCase, group_by
from fa_bench.variant_cost import variant_tag


def facet_key(c: MergedCase) -> tuple[str, str, int, bool, str]:
    """A panel: mode, dtype, head dim, masking and the variant (issue 19; '' when dense),
    so a windowed case is never drawn on the line of the dense case of its shape."""
    case = c.record.case
    return (case.mode.value, case.dtype.value, case.head_dim, case.causal, variant_tag(case))


def heads_label(cases: list[MergedCase]) -> Callable[[MergedCase], str]:
    """The sub-series of an implementation's line: its head counts, when some panel holds
    one implementation at more than one (a GQA case beside MHA ones), else ''. Decided
    for the whole figure, not per panel: one name then means one series in every panel,
    so the legend lists it once (per panel, the same line was `naive` in one panel and
    `naive · Hkv=2` in the next, three entries in one colour and marker)."""
    per_panel = group_by(cases, lambda c: (facet_key(c), c.gpu, c.record.impl))
    pairs = {(c.record.case.heads_q, c.record.case.heads_kv) for c in cases}
    if all(len({(c.record.case.heads_q, c.record.case.heads_kv) for c in group}) == 1
           for group in per_panel.values()):  # fmt: skip
        return lambda c: ""
    if len({hq for hq, _ in pairs}) == 1:
        return lambda c: f"Hkv={c.record.case.heads_kv}"
    return lambda c: f"Hq={c.record.case.heads_q} Hkv={c.record.case.heads_kv}"


def facet_title(key: tuple) -> str:
    mode, dtype, head_dim, causal, variant = key
    title = f"{mode} · {dtype} · d={head_dim} · {'causal' if causal else 'full'}"
    return title + (f" · {variant}" if variant else "")


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


def facet_keys(cases: list[MergedCase]) -> list[tuple]:
    return sorted({facet_key(c) for c in cases}, key=lambda k: (k[0], k[1], k[2], k[3], k[4]))


def _columns(n_facets: int) -> int:
    """Panels per row: up to four, so a 16-panel suite is four rows, not eight."""
    return 1 if n_facets == 1 else 2 if n_facets <= 4 else 3 if n_facets <= 9 else 4


def panel_grid(
    facets: list[tuple],
    y_title: str,
    *,
    height_per_row: int = 270,
    titles: list[str] | None = None,
    x_title: str = "sequence length N (keys)",
) -> go.Figure:
    """A grid of panels, one per facet, titled `titles` (default: `facet_title`)."""
    cols = _columns(len(facets))
    rows = math.ceil(len(facets) / cols)
    fig = make_subplots(
        rows=rows,
        cols=cols,
        subplot_titles=titles if titles is not None else [facet_title(k) for k in facets],
        horizontal_spacing=0.3 / cols,  # room for each panel's own y title
        vertical_spacing=min(0.35 / rows, 0.12),
    )
    fig.update_annotations(font_size=13)  # the panel titles, which must fit a quarter width
    # Room for a legend above the panels and one below them (see add_legends).
    fig.update_layout(
        height=150 + height_per_row * rows,
        hovermode="closest",
        margin={"t": 80, "b": 70, "r": 30},
    )
    for i in range(len(facets)):
        row, col = panel_cell(i, len(facets))
        # Every panel, not only the first column's: each has its own scale (the memory
        # figure's log axes), and a panel read alone must say what it plots.
        fig.update_yaxes(title_text=y_title, title_font_size=11, row=row, col=col)
        if i + cols >= len(facets):  # the lowest panel of its column
            fig.update_xaxes(title_text=x_title, row=row, col=col)
    return fig


def panel_cell(i: int, n_facets: int) -> tuple[int, int]:
    cols = _columns(n_facets)
    return i // cols + 1, i % cols + 1


def add_legends(fig: go.Figure) -> None:
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
