"""Speedup of each implementation against a baseline, case by case on the same GPU."""

from __future__ import annotations

import math

import plotly.graph_objects as go

from fa_bench.reports.build import Merged
from fa_bench.reports.figures import Figure, esc


def shape_key(c: dict) -> tuple:
    return (
        c["mode"],
        c["dtype"],
        c["head_dim"],
        c["causal"],
        c["batch"],
        c["heads_q"],
        c["heads_kv"],
        c["seqlen_q"],
        c["seqlen_k"],
    )


def shape_label(key: tuple) -> str:
    mode, dtype, d, causal, b, hq, hkv, sq, sk = key
    seq = f"N={sq}" if sq == sk else f"Sq={sq},Sk={sk}"
    heads = f"H={hq}" + (f"/{hkv}" if hkv != hq else "")
    return f"{mode} {dtype} d{d} {'causal' if causal else 'full'} {seq} B={b} {heads}"


def speedups(merged: Merged, baseline: str) -> dict[str, list[tuple[tuple, float]]]:
    """(impl · GPU) → [(shape, baseline median / impl median)] over the shapes both ran ok
    on the same GPU: > 1 means faster than the baseline."""
    base = {
        (shape_key(c), c["gpu"]): c
        for c in merged.cases
        if c["impl"] == baseline and c["status"] == "ok" and c.get("latency_ms")
    }
    out: dict[str, list[tuple[tuple, float]]] = {}
    for c in merged.cases:
        if c["impl"] == baseline or c["status"] != "ok" or not c.get("latency_ms"):
            continue
        b = base.get((shape_key(c), c["gpu"]))
        if b is None or not c["latency_ms"]["median"]:
            continue
        row = c["impl"] + (f" · {c['gpu']}" if len(merged.gpus) > 1 else "")
        ratio = b["latency_ms"]["median"] / c["latency_ms"]["median"]
        out.setdefault(row, []).append((shape_key(c), ratio))
    return out


def speedup_figure(merged: Merged, baseline: str) -> Figure | None:
    rows = speedups(merged, baseline)
    if not rows:
        return None
    shapes = sorted({s for pairs in rows.values() for s, _ in pairs})
    col = {s: i for i, s in enumerate(shapes)}
    names = list(rows)
    z = [[None] * len(shapes) for _ in names]
    for r, name in enumerate(names):
        for s, ratio in rows[name]:
            z[r][col[s]] = math.log2(ratio)
    text = [[None if v is None else f"{2**v:.2f}×" for v in row] for row in z]
    ticks = [-3, -2, -1, 0, 1, 2, 3]
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=[shape_label(s) for s in shapes],
            y=[esc(n) for n in names],
            text=text,
            texttemplate="%{text}" if len(shapes) <= 40 else None,
            zmid=0,
            zmin=-3,
            zmax=3,
            colorscale="RdBu",
            name=f"speedup vs {esc(baseline)}",
            colorbar={
                "title": {"text": f"× {esc(baseline)}"},
                "tickvals": ticks,
                "ticktext": [f"{2.0**t:g}×" for t in ticks],
            },
            hovertemplate="%{y}<br>%{x}<br>%{text} the speed of "
            + esc(baseline)
            + "<extra></extra>",
        )
    )
    # The rotated case labels need ~200 px below the plot: the plot area must stay positive.
    fig.update_layout(height=360 + 40 * len(names), margin={"b": 200, "t": 40})
    fig.update_xaxes(title_text="case (mode, dtype, head dim, masking, shape)", tickangle=-45)
    fig.update_yaxes(title_text="implementation", automargin=True)
    return Figure(
        "speedup",
        f"Speedup vs {baseline}",
        f"Baseline median latency ÷ implementation median latency, for each case both "
        f"ran successfully on the same GPU: above 1× (blue) is faster than {baseline}, "
        f"below (red) slower. Colour is on a log-2 scale.",
        fig,
    )
