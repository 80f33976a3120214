"""Speedup of each implementation against a baseline, case by case on the same GPU."""

from __future__ import annotations

import math

import plotly.graph_objects as go

from fa_bench.case import Status
from fa_bench.reports.figures import Figure, esc
from fa_bench.reports.merge import Merged, MergedCase
from fa_bench.variant_cost import variant_tag


def shape_key(c: MergedCase) -> tuple:
    k = c.record.case
    return (
        k.mode.value,
        k.dtype.value,
        k.head_dim,
        k.causal,
        k.batch,
        k.heads_q,
        k.heads_kv,
        k.seqlen_q,
        k.seqlen_k,
        # Decode cases of one shape differ by cache layout and spread: never one key.
        k.page_size,
        k.ctx_spread,
        # A variant (window, ALiBi, softcap, packed) matches only its own variant.
        variant_tag(k),
    )


def shape_label(key: tuple) -> str:
    mode, dtype, d, causal, b, hq, hkv, sq, sk, page, spread, variant = key
    heads = f"H={hq}" + (f"/{hkv}" if hkv != hq else "")
    if mode == "decode":  # always causal: the cache layout and the spread instead
        cache = "contig" if page == 0 else f"page{page}"
        cache += f" spread{spread:g}" if spread != 1.0 else ""
        return f"decode {dtype} d{d} Sq={sq},ctx={sk} B={b} {heads} {cache}"
    seq = f"N={sq}" if sq == sk else f"Sq={sq},Sk={sk}"
    label = f"{mode} {dtype} d{d} {'causal' if causal else 'full'} {seq} B={b} {heads}"
    return label + (f" {variant}" if variant else "")


def speedups(merged: Merged, baseline: str) -> dict[str, list[tuple[tuple, float]]]:
    """(impl · GPU) → [(shape, baseline median / impl median)] over the shapes both ran ok
    on the same GPU: > 1 means faster than the baseline."""

    def median(c: MergedCase) -> float | None:
        lat = c.record.latency_ms
        return lat.median if lat is not None and c.record.status == Status.OK else None

    base = {
        (shape_key(c), c.gpu): m
        for c in merged.cases
        if c.record.impl == baseline and (m := median(c)) is not None
    }
    out: dict[str, list[tuple[tuple, float]]] = {}
    for c in merged.cases:
        m = median(c)
        if c.record.impl == baseline or m is None:
            continue
        b = base.get((shape_key(c), c.gpu))
        if b is None or b <= 0 or m <= 0:  # a zero or (derived) negative median: no ratio
            continue
        row = c.record.impl + (f" · {c.gpu}" if len(merged.gpus) > 1 else "")
        out.setdefault(row, []).append((shape_key(c), b / m))
    return out


# The colour range follows the data's spread, symmetric in log around 1×: at least
# 0.8×–1.25×, so near-parity noise is not painted as a big difference, and at most
# 0.25×–4×, so one far-off row (naive, 30× slower) does not wash every other cell out to
# white. Cells beyond take the end colour; the number in each cell is exact.
RANGE_FLOOR = math.log2(1.25)
RANGE_CAP = 2.0
ROW_PX = 20  # one case per row: its label and in-cell text need this much height


def display_key(key: tuple) -> tuple:
    """Cases grouped by (mode, dtype, head dim, masking, variant), then by sequence length,
    as the throughput plot's x axis runs; batch and heads break ties."""
    mode, dtype, d, causal, b, hq, hkv, sq, sk, page, spread, variant = key
    return (mode, dtype, d, causal, variant, sq, sk, b, hq, hkv, page, spread)


def colour_range(log_ratios: list[float]) -> float:
    """Half-width of the colour scale in log2 units, from the data's largest deviation."""
    spread = max((abs(v) for v in log_ratios), default=0.0)
    return min(max(spread, RANGE_FLOOR), RANGE_CAP)


def colorbar_ticks(half: float, lo: float, hi: float) -> tuple[list[float], list[str]]:
    """Ticks at the ends of the scale and at even steps between; an end the data goes
    past is labelled ≤/≥, as those cells are clipped to its colour."""
    step = 1.0 if half >= 1.5 else 0.5 if half >= 0.75 else half / 2
    inner = [k * step for k in range(-int(half / step), int(half / step) + 1)]
    vals = [-half, *(v for v in inner if abs(v) < half - 0.2 * step), half]
    text = [f"{2.0**v:.2g}×" for v in vals]
    if lo < -half:
        text[0] = "≤" + text[0]
    if hi > half:
        text[-1] = "≥" + text[-1]
    return vals, text


def _log_grid(
    rows: dict[str, list[tuple[tuple, float]]],
) -> tuple[list[tuple], list[list[float | None]]]:
    """The shapes in display order, and log2(speedup) per (shape, row name); None where a
    row has no such case."""
    shapes = sorted({s for pairs in rows.values() for s, _ in pairs}, key=display_key)
    index = {s: i for i, s in enumerate(shapes)}
    z: list[list[float | None]] = [[None] * len(rows) for _ in shapes]
    for c, name in enumerate(rows):
        for s, ratio in rows[name]:
            z[index[s]][c] = math.log2(ratio)
    return shapes, z


def _group_lines(fig: go.Figure, shapes: list[tuple]) -> None:
    """A line between (mode, dtype, d, mask, variant) groups."""
    for i in range(1, len(shapes)):
        if display_key(shapes[i])[:5] != display_key(shapes[i - 1])[:5]:
            fig.add_shape(
                type="line", xref="paper", x0=0, x1=1, yref="y", y0=i - 0.5, y1=i - 0.5,
                line={"color": "rgba(128,128,128,0.9)", "width": 2},
            )  # fmt: skip


def speedup_figure(merged: Merged, baseline: str) -> Figure | None:
    rows = speedups(merged, baseline)
    if not rows:
        return None
    # Cases down, implementations across: a case label per row stays legible at any
    # number of cases, where 96 rotated labels along x had plotly drop every other one.
    shapes, z = _log_grid(rows)
    names = list(rows)
    logs = [v for row in z for v in row if v is not None]
    half = colour_range(logs)
    tickvals, ticktext = colorbar_ticks(half, min(logs), max(logs))
    labels = [shape_label(s) for s in shapes]
    plot_px = max(ROW_PX * len(shapes), 240)  # with few cases, taller rows, not a sliver
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=[esc(n) for n in names],
            y=labels,
            text=[["" if v is None else f"{2**v:.2f}×" for v in row] for row in z],
            texttemplate="%{text}",
            textfont={"size": 11},
            zmid=0,
            zmin=-half,
            zmax=half,
            colorscale="RdBu",
            name="speedup vs %{meta}",
            colorbar={
                "title": {"text": "× %{meta}"},
                "tickvals": tickvals,
                "ticktext": ticktext,
                "lenmode": "pixels",
                "len": min(320, plot_px),
                "y": 1,
                "yanchor": "top",
            },
            # The baseline's name only through meta: plotly reads `%{...}` in a hover
            # template, and in a trace name or colorbar title once the trace has a meta,
            # while the value it puts in is never read again.
            meta=esc(baseline),
            hovertemplate="%{x}<br>%{y}<br>%{text} the speed of %{meta}<extra></extra>",
        )
    )
    fig.update_layout(height=plot_px + 90, margin={"t": 70, "b": 20})
    fig.update_xaxes(side="top", title_text="implementation", automargin=True)
    # Every case labelled (tickmode array): plotly thins out auto ticks that would crowd.
    fig.update_yaxes(
        autorange="reversed",
        tickmode="array",
        tickvals=labels,
        ticktext=labels,
        tickfont={"size": 11},
        automargin=True,
    )
    _group_lines(fig, shapes)
    return Figure("speedup", f"Speedup vs {baseline}", _caption(baseline, half), fig)


def _caption(baseline: str, half: float) -> str:
    lo, hi = f"{2.0**-half:.2g}×", f"{2.0**half:.2g}×"
    return (
        f"Baseline median latency ÷ implementation median latency, for each case both "
        f"ran successfully on the same GPU: above 1× (blue) is faster than {baseline}, "
        f"below (red) slower. Cases are grouped by mode, dtype, head dim and masking, "
        f"then ordered by sequence length. Colour is on a log-2 scale fitted to this "
        f"data's spread ({lo}–{hi}, never narrower than 0.8×–1.25× nor wider than "
        f"0.25×–4×; a cell beyond takes the end colour, its number is exact)."
    )
