"""Hardware views: the roofline, NVML-measured bandwidth, and the telemetry panel.

The roofline needs the device's compute and bandwidth ceilings. A measured calibration
(`env.telemetry.calibration`, a device copy timed by the worker) is used when a run has one;
otherwise the best TFLOP/s and GB/s achieved in the data stand in, and the figure says so:
those are lower bounds of the real ceilings, not the ceilings.
"""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from fa_bench.case import Status
from fa_bench.reports.axes import log_ticks, pow2_ticks
from fa_bench.reports.figures import Figure, _styles, esc, hover, impl_gpu_name, seqlen
from fa_bench.reports.merge import Merged, MergedCase, group_by
from fa_bench.results.record import ResultsDoc

# Keys a calibration may use for its ceilings, most specific first.
_BW_KEYS = ("gbps_copy",)  # a device-to-device copy, read + write counted
_COMPUTE_KEYS = ("tflops_matmul",)  # not measured yet: the data's best stands in


def _telemetry(c: MergedCase) -> dict:
    tel = c.record.telemetry
    return tel if isinstance(tel, dict) and tel.get("available", True) is not False else {}


def _ok(c: MergedCase) -> bool:
    return c.record.status == Status.OK


def _calibration(doc: ResultsDoc) -> dict:
    """The run's measured calibration (`env.telemetry.calibration`, written by the worker
    before the first case), or {} when the run has none."""
    tel = doc.env.get("telemetry")
    cal = tel.get("calibration") if isinstance(tel, dict) else None
    return cal if isinstance(cal, dict) and cal.get("available") else {}


def _first_number(d: dict, keys: tuple[str, ...]) -> tuple[str, float] | None:
    for k in keys:
        v = d.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0:
            return k, float(v)
    return None


def ceilings(merged: Merged) -> dict[str, dict]:
    """Per GPU label: tflops, gbps, and where each came from (measured or best in data)."""
    out: dict[str, dict] = {}
    by_gpu = group_by(filter(_ok, merged.cases), lambda c: c.gpu)
    for doc, label in merged.labelled_docs():
        cal = _calibration(doc)
        cases = by_gpu.get(label, [])
        entry = out.setdefault(label, {})
        achieved = {
            # the model's bandwidth, and NVML's where telemetry measured it
            "gbps": [c.record.gbps_model for c in cases]
            + [_telemetry(c).get("gbps_nvml") for c in cases],
            "tflops": [c.record.tflops for c in cases],
        }
        for kind, keys in (("gbps", _BW_KEYS), ("tflops", _COMPUTE_KEYS)):
            found = _first_number(cal, keys)
            if found:
                entry[kind], entry[f"{kind}_source"] = found[1], f"measured ({found[0]})"
                continue
            best = [v for v in achieved[kind] if v]
            if best and max(best) > entry.get(kind, 0):
                entry[kind], entry[f"{kind}_source"] = max(best), "best achieved in this data"
    return {k: v for k, v in out.items() if "gbps" in v and "tflops" in v}


def _intensity(c: MergedCase) -> float:
    """FLOPs per model byte (the caller has checked both are set)."""
    return (c.record.flops or 0.0) / (c.record.bytes_model or 1.0)


def _ceiling_lines(fig: go.Figure, ceil: dict[str, dict], lo: float, hi: float) -> list[str]:
    """Each GPU's roof over intensities lo..hi; returns where each ceiling came from."""
    sources = []
    for gpu, ce in ceil.items():
        ridge = ce["tflops"] * 1000 / ce["gbps"]  # FLOP/byte where the two roofs meet
        grid = sorted({lo, hi, min(max(ridge, lo), hi)})
        fig.add_trace(
            go.Scatter(
                x=grid,
                y=[min(ce["tflops"], x * ce["gbps"] / 1000) for x in grid],
                name=f"ceiling · {esc(gpu)}",
                mode="lines",
                line={"color": "#888", "dash": "dash", "width": 2},
                hoverinfo="skip",
            )
        )
        sources.append(
            f"{gpu}: {ce['tflops']:.4g} TFLOP/s ({ce['tflops_source']}), "
            f"{ce['gbps']:.4g} GB/s ({ce['gbps_source']})"
        )
    return sources


def roofline_figure(merged: Merged) -> Figure | None:
    cases = [
        c
        for c in merged.cases
        if _ok(c) and c.record.tflops and c.record.flops and c.record.bytes_model
    ]
    if not cases:
        return None
    ceil = ceilings(merged)
    style = _styles(merged)
    fig = go.Figure()
    names: dict[str, list[MergedCase]] = {}
    for c in cases:
        names.setdefault(impl_gpu_name(c, merged), []).append(c)
    for name, group in names.items():
        fig.add_trace(
            go.Scatter(
                x=[_intensity(c) for c in group],
                y=[c.record.tflops for c in group],
                name=name,
                mode="markers",
                marker={"color": style(group[0])["color"], "size": 8},
                text=[hover(c) for c in group],
                hovertemplate="%{text}<br>intensity %{x:.3g} FLOP/byte<extra></extra>",
            )
        )
    xs = [_intensity(c) for c in cases]
    sources = _ceiling_lines(fig, ceil, min(xs) / 4, max(xs) * 4)
    drawn = [(x, y) for t in fig.data for x, y in zip(t.x, t.y, strict=True)]
    fig.update_xaxes(
        title_text="arithmetic intensity (FLOP / model byte)", **log_ticks(x for x, _ in drawn)
    )
    fig.update_yaxes(title_text="TFLOP/s", **log_ticks(y for _, y in drawn))
    fig.update_layout(height=480, hovermode="closest")
    return Figure(
        "roofline",
        "Roofline",
        "Each case placed by its arithmetic intensity (FLOPs ÷ the minimal bytes a "
        "kernel must move) against the ceilings: "
        + ("; ".join(sources) or "none known")
        + ". A ceiling taken from the data "
        "is the best seen here, a lower bound of what the device can do.",
        fig,
    )


def bandwidth_figure(merged: Merged) -> Figure | None:
    """NVML-measured DRAM bandwidth against the minimal-bytes model, when telemetry exists."""
    cases = [
        c for c in merged.cases if _ok(c) and c.record.gbps_model and _telemetry(c).get("gbps_nvml")
    ]
    if not cases:
        return None
    style = _styles(merged)
    fig = go.Figure()
    groups: dict[str, list[MergedCase]] = {}
    for c in cases:
        groups.setdefault(impl_gpu_name(c, merged), []).append(c)
    for name, group in groups.items():
        fig.add_trace(
            go.Scatter(
                x=[c.record.gbps_model for c in group],
                y=[_telemetry(c)["gbps_nvml"] for c in group],
                name=name,
                mode="markers",
                marker={"color": style(group[0])["color"], "size": 8},
                text=[hover(c) for c in group],
                hovertemplate="%{text}<extra></extra>",
            )
        )
    top = max(max(c.record.gbps_model or 0.0, _telemetry(c)["gbps_nvml"]) for c in cases) * 1.1
    fig.add_trace(
        go.Scatter(
            x=[0, top],
            y=[0, top],
            name="NVML = model",
            mode="lines",
            line={"color": "#888", "dash": "dot"},
            hoverinfo="skip",
        )
    )
    fig.update_xaxes(title_text="model bandwidth (GB/s, minimal bytes ÷ median latency)")
    fig.update_yaxes(title_text="NVML DRAM bandwidth (GB/s)")
    fig.update_layout(height=460)
    return Figure(
        "bandwidth",
        "Achieved bandwidth (NVML vs model)",
        "HBM traffic NVML measured (GPM DRAM bandwidth utilisation × theoretical "
        "bandwidth) against the minimal-bytes model. Points above the diagonal move "
        "more bytes than the least any kernel must.",
        fig,
    )


_TELEMETRY_PANELS = (
    ("sm_clock_mhz_mean", "SM clock (MHz)"),
    ("power_w_mean", "power (W)"),
    ("energy_j_per_call", "energy per call (J)"),
)


def telemetry_figure(merged: Merged) -> Figure | None:
    cases = [
        c
        for c in merged.cases
        if any(isinstance(_telemetry(c).get(k), (int, float)) for k, _ in _TELEMETRY_PANELS)
    ]
    if not cases:
        return None
    fig = make_subplots(
        rows=1, cols=3, subplot_titles=[t for _, t in _TELEMETRY_PANELS], horizontal_spacing=0.08
    )
    style = _styles(merged)
    shown: set[str] = set()
    for col, (key, unit) in enumerate(_TELEMETRY_PANELS, 1):
        groups: dict[str, list[MergedCase]] = {}
        for c in cases:
            if isinstance(_telemetry(c).get(key), (int, float)):
                groups.setdefault(impl_gpu_name(c, merged), []).append(c)
        for name, group in groups.items():
            group.sort(key=seqlen)
            fig.add_trace(
                go.Scatter(
                    x=[seqlen(c) for c in group],
                    y=[_telemetry(c)[key] for c in group],
                    name=name,
                    legendgroup=name,
                    showlegend=name not in shown,
                    mode="markers",
                    marker={"color": style(group[0])["color"], "size": 7},
                    text=[hover(c) for c in group],
                    hovertemplate="%{text}<extra></extra>",
                ),
                row=1,
                col=col,
            )
            shown.add(name)
        fig.update_yaxes(title_text=unit, row=1, col=col)
    fig.update_xaxes(title_text="sequence length N (keys)", **pow2_ticks(seqlen(c) for c in cases))
    fig.update_layout(height=420, hovermode="closest", margin_t=50)  # the panel titles
    return Figure(
        "telemetry",
        "Telemetry",
        "NVML readings over each case's timed loop: mean SM clock, mean power and "
        "energy per call. Cases whose clocks were held down are listed below.",
        fig,
    )
