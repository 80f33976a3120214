"""The report's "cost of the variant" view (issue 19): each variant case against the dense
case of the same shape.

A sliding window, ALiBi, a logit softcap or a packed batch changes what a kernel does per
score; the question a reader has is what it costs against the same shape without it. The
pairing is `fa_bench.variant_cost` (shared with the terminal summary): the same GPU,
implementation, mode, dtype, batch, heads, lengths, head dim and masking. The figure
shows, per variant case, the time ratio (variant median ÷ dense median; below 1 the
variant is faster, as a window skips work) beside both TFLOP/s, which compare fairly as the
FLOP model counts attended pairs only. Cases without a ratio are listed in the table with
the reason (no dense control, or a case that did not run).
"""

from __future__ import annotations

import statistics

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from fa_bench.reports.axes import add_legends, log_ticks
from fa_bench.reports.figures import PALETTE, Figure, esc
from fa_bench.reports.merge import Merged
from fa_bench.variant_cost import (
    SAME_TOKENS,
    VariantCost,
    variant_costs,
    variant_tag,
    variant_words,
)

__all__ = ["cost_figure", "cost_rows", "costs", "summary_sentences"]

ROW_PX = 22


def costs(merged: Merged) -> list[VariantCost]:
    return variant_costs((c.record, c.gpu) for c in merged.cases)


def _shape(cost: VariantCost) -> str:
    k = cost.variant.case
    seq = f"N={k.seqlen_q}" if k.seqlen_q == k.seqlen_k else f"Sq={k.seqlen_q},Sk={k.seqlen_k}"
    heads = f"H={k.heads_q}" + (f"/{k.heads_kv}" if k.heads_kv != k.heads_q else "")
    return (f"{k.mode.value} {k.dtype.value} d{k.head_dim} {'causal' if k.causal else 'full'} "
            f"{seq} B={k.batch} {heads}")  # fmt: skip


def _row_label(cost: VariantCost) -> str:
    """One row of the figure: the variant, then the shape (the implementation is the
    trace, so several implementations of one variant case share a row)."""
    return f"{variant_tag(cost.variant.case)} · {_shape(cost)}"


def _ms(r) -> float | None:
    lat = r.latency_ms if r is not None else None
    return lat.median if lat is not None else None


def _hover(cost: VariantCost, name: str) -> str:
    v, d = cost.variant, cost.dense
    lines = [
        f"<b>{name}</b>: {esc(variant_words(v.case))}",
        esc(_shape(cost)),
        f"variant {_fmt(_ms(v), 'ms')}, {_fmt(v.tflops, 'TFLOP/s')}",
        f"dense ({cost.control}) {_fmt(_ms(d), 'ms')}, {_fmt(d.tflops if d else None, 'TFLOP/s')}",
        f"time ratio {_fmt(cost.ratio, '×', '.3g')}",
    ]
    return "<br>".join(lines)


def _add_series(fig: go.Figure, name: str, group: list[VariantCost], colour: str) -> None:
    """One implementation's points: its time ratios (left), then the variant's TFLOP/s
    (filled) and its dense control's (open) on the right, in one legend group."""
    common = {
        "name": name, "legendgroup": name, "mode": "markers",
        "y": [_row_label(c) for c in group], "text": [_hover(c, name) for c in group],
        "hovertemplate": "%{text}<extra></extra>",
    }  # fmt: skip
    filled = {"color": colour, "size": 10}
    fig.add_trace(go.Scatter(x=[c.ratio for c in group], marker=filled, **common), row=1, col=1)
    fig.add_trace(
        go.Scatter(x=[c.variant.tflops for c in group], marker=filled, showlegend=False, **common),
        row=1, col=2,
    )  # fmt: skip
    open_ = {**filled, "symbol": "circle-open", "line": {"width": 2}}
    dense = [c.dense.tflops if c.dense is not None else None for c in group]
    fig.add_trace(go.Scatter(x=dense, marker=open_, showlegend=False, **common), row=1, col=2)


def _series(cost: VariantCost, merged: Merged) -> str:
    """impl, plus the GPU when several were merged: the other figures' series names."""
    name = esc(cost.variant.impl)
    return name + (f" · {esc(cost.gpu)}" if len(merged.gpus) > 1 else "")


def _fmt(v: object, unit: str, spec: str = ".4g") -> str:
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return "–"
    return f"{v:{spec}}{'' if unit == '×' else ' '}{unit}"


def cost_figure(merged: Merged) -> Figure | None:
    """Rows: variant cases with a ratio; left panel the time ratio (log, 1 = the dense
    time), right panel TFLOP/s, the variant filled and its dense control open."""
    paired = [c for c in costs(merged) if c.ratio is not None and c.dense is not None]
    if not paired:
        return None
    rows = sorted({_row_label(c) for c in paired})
    fig = make_subplots(
        rows=1, cols=2, shared_yaxes=True, horizontal_spacing=0.04,
        subplot_titles=["time ÷ dense time", "TFLOP/s (attended pairs)"],
    )  # fmt: skip
    colour = {impl: PALETTE[i % len(PALETTE)] for i, impl in enumerate(merged.impls)}
    groups: dict[str, list[VariantCost]] = {}
    for c in paired:
        groups.setdefault(_series(c, merged), []).append(c)
    for name, group in groups.items():
        _add_series(fig, name, group, colour[group[0].variant.impl])
    fig.add_vline(x=1, line={"color": "rgba(128,128,128,0.9)", "dash": "dash"}, row=1, col=1)
    fig.update_xaxes(log_ticks([c.ratio for c in paired if c.ratio] + [1.0]), row=1, col=1)
    fig.update_xaxes(rangemode="tozero", row=1, col=2)
    plot_px = max(ROW_PX * len(rows), 200)
    fig.update_yaxes(categoryorder="array", categoryarray=rows, autorange="reversed",
                     automargin=True, tickfont={"size": 11})  # fmt: skip
    fig.update_layout(height=plot_px + 150, margin={"t": 80, "b": 40}, hovermode="closest")
    add_legends(fig)
    return Figure(
        "variant-cost",
        "Cost of the variant",
        "Each variant case (sliding window, ALiBi, softcap, packed batch) against the dense "
        "case of the same shape on the same GPU and implementation. Left: variant median "
        "time ÷ dense median time (log scale; below 1 the variant takes less time, as a "
        "window skips work). Right: TFLOP/s of the variant (filled) and of the dense case "
        "(open); the FLOP model counts attended (query, key) pairs only, so the two compare "
        "fairly. The table below lists every variant case, those without a ratio with why.",
        fig,
    )


def cost_rows(merged: Merged) -> list[dict]:
    """The table under the figure: every variant case, its control and the figures; plain
    strings, escaped by the template."""
    rows = []
    for c in costs(merged):
        v, d = c.variant, c.dense
        rows.append({
            "gpu": c.gpu, "impl": v.impl, "variant": variant_words(v.case),
            "shape": _shape(c), "control": c.control or "–",
            "variant_ms": _fmt(_ms(v), "ms"), "dense_ms": _fmt(_ms(d), "ms"),
            "ratio": _fmt(c.ratio, "×", ".3g"),
            "variant_tflops": _fmt(v.tflops if _ms(v) is not None else None, ""),
            "dense_tflops": _fmt(d.tflops if d is not None and _ms(d) is not None else None, ""),
            "note": c.note or _tokens_note(c),
        })  # fmt: skip
    return rows


def _tokens_note(cost: VariantCost) -> str:
    """A packed batch against equal lengths: the control's id and both token counts."""
    d = cost.dense
    if cost.control != SAME_TOKENS or d is None:
        return ""
    tokens = d.case.batch * d.case.seqlen_q
    return f"control {d.id}: {tokens} tokens, the packed batch {cost.variant.case.total_tokens}"


def summary_sentences(merged: Merged) -> list[str]:
    """Per variant (all implementations), the median time ratio to the dense cases: one
    sentence, or none on a page without variant cases."""
    by_tag: dict[str, list[float]] = {}
    missing = 0
    all_costs = costs(merged)
    for c in all_costs:
        if c.ratio is None:
            missing += 1
        else:
            by_tag.setdefault(variant_tag(c.variant.case), []).append(c.ratio)
    if not all_costs:
        return []
    parts = [f"{tag} {statistics.median(r):.2f}× ({len(r)})" for tag, r in sorted(by_tag.items())]
    text = f"{len(all_costs)} variant {'case' if len(all_costs) == 1 else 'cases'}"
    if parts:
        text += (": median time ÷ the dense case of the same shape, per variant (cases): "
                 + ", ".join(parts))  # fmt: skip
    if missing:
        text += f"; {missing} without a ratio (see Cost of the variant)"
    return [text + "."]
