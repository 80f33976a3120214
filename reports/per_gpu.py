"""The per-GPU view: the same case's TFLOP/s on every GPU of a multi-GPU run or merge.

Each point is one GPU's TFLOP/s for one case divided by the median of the other GPUs'
for that case, so a slow or throttled card stands out as a line of points below 1.
A GPU more than OUTLIER_FRACTION slower than its peers' median on a case is flagged.
"""

from __future__ import annotations

import statistics
from collections import defaultdict

import plotly.graph_objects as go

from fa_bench.case import Status
from fa_bench.reports.figures import Figure, esc
from fa_bench.reports.merge import Merged, MergedCase

OUTLIER_FRACTION = 0.05


def peer_ratios(merged: Merged) -> list[dict]:
    """One row per (case, GPU) measured ok on at least two GPUs: TFLOP/s over the median
    of the other GPUs' TFLOP/s for that case."""
    by_id: dict[str, dict[str, MergedCase]] = defaultdict(dict)
    for c in merged.cases:
        if c.record.status == Status.OK and c.record.tflops:
            by_id[c.record.id][c.gpu] = c
    rows = []
    for case_id, per_gpu in by_id.items():
        if len(per_gpu) < 2:
            continue
        tflops = {g: o.record.tflops or 0.0 for g, o in per_gpu.items()}  # all set: see above
        for gpu, c in per_gpu.items():
            peers = statistics.median(t for g, t in tflops.items() if g != gpu)
            if peers <= 0:  # (derived) negative figures: no ratio to draw
                continue
            tel = c.record.telemetry if isinstance(c.record.telemetry, dict) else {}
            rows.append({
                "id": case_id,
                "gpu": gpu,
                "tflops": c.record.tflops,
                "ratio": tflops[gpu] / peers,
                "outlier": tflops[gpu] < (1 - OUTLIER_FRACTION) * peers,
                "sm_clock_mhz_mean": tel.get("sm_clock_mhz_mean"),
                "throttle": ", ".join(tel.get("warnings") or []) or None,
            })  # fmt: skip
    return rows


def _hover(r: dict) -> str:
    text = f"{esc(r['id'])}<br>{r['tflops']:.1f} TFLOP/s, {r['ratio']:.3f}× peers"
    if r["sm_clock_mhz_mean"]:
        text += f"<br>SM clock {r['sm_clock_mhz_mean']:.0f} MHz"
    return text + (f"<br>{esc(r['throttle'])}" if r["throttle"] else "")


def per_gpu_figure(merged: Merged) -> Figure | None:
    rows = peer_ratios(merged)
    if not rows:
        return None
    order = {cid: n for n, cid in enumerate(dict.fromkeys(r["id"] for r in rows))}
    fig = go.Figure()
    rows_of: dict[str, list[dict]] = defaultdict(list)  # one pass, not one per GPU
    for r in rows:
        rows_of[r["gpu"]].append(r)
    for gpu in merged.gpus:
        mine = rows_of.get(gpu, [])
        if not mine:
            continue
        fig.add_trace(go.Scatter(
            x=[order[r["id"]] for r in mine],
            y=[r["ratio"] for r in mine],
            mode="markers",
            name=esc(gpu),
            marker={"symbol": ["x" if r["outlier"] else "circle" for r in mine], "size": 7},
            hovertext=[_hover(r) for r in mine],
            hoverinfo="text",
        ))  # fmt: skip
    fig.add_hline(y=1 - OUTLIER_FRACTION, line_dash="dot", annotation_text="outlier line")
    fig.update_layout(
        xaxis_title="case (in run order)",
        yaxis_title="TFLOP/s ÷ median of the other GPUs",
        legend_title="GPU",
    )
    flagged = sorted({(r["gpu"], r["id"]) for r in rows if r["outlier"]})
    by_gpu: dict[str, int] = defaultdict(int)
    for gpu, _ in flagged:
        by_gpu[gpu] += 1
    summary = (
        "; ".join(f"{gpu}: {n} case{'s' if n != 1 else ''}" for gpu, n in by_gpu.items())
        if flagged
        else "none"
    )
    caption = (
        f"Each GPU's TFLOP/s on a case over the median of its peers on the same case; "
        f"crosses mark a GPU more than {OUTLIER_FRACTION:.0%} below its peers "
        f"(flagged: {summary}). Hover for SM clock and throttling."
    )
    return Figure("per-gpu", "Per-GPU consistency", caption, fig)
