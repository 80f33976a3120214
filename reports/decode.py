"""The report's bandwidth-first view of decode cases (Mode.DECODE).

Decoding reads the whole KV cache for a handful of query tokens: memory-bound, so the
figure is GB/s (bytes model ÷ median) against the context length, one line per
implementation and batch, with each GPU's measured copy bandwidth drawn as the ceiling
and its theoretical HBM peak above it (fa_bench.results.bandwidth: both from the run's
env, the fractions derived, not stored). Panels split what changes the bytes or the work
per byte: dtype, head dim, head counts, page size, Sq and the spread of lengths.

The prefill line figures (TFLOP/s, memory) leave decode cases out (`without_decode`): one
of their lines joins cases by sequence length alone, and a decode panel would zig-zag
between page sizes, batches and spreads at each context length.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable

import plotly.graph_objects as go

from fa_bench.case import Case, Status
from fa_bench.reports.axes import add_legends, panel_cell, panel_grid, pow2_ticks
from fa_bench.reports.figures import (
    DASHES,
    FAILED,
    PALETTE,
    SYMBOLS,
    Figure,
    esc,
    hover,
    impl_gpu_name,
)
from fa_bench.reports.merge import Merged, MergedCase, group_by
from fa_bench.results.bandwidth import Ceilings, ceilings, fractions, is_decode, record_env
from fa_bench.words import plural

__all__ = ["decode_figure", "decode_hover", "gpu_ceilings", "summary_sentences", "without_decode"]


def without_decode(merged: Merged) -> Merged:
    """`merged` without its decode cases; implementations and GPUs kept, so colours and
    labels stay those of the whole report."""
    if not any(is_decode(c.record.case) for c in merged.cases):
        return merged
    return dataclasses.replace(
        merged, cases=[c for c in merged.cases if not is_decode(c.record.case)]
    )


def decode_cases(merged: Merged) -> list[MergedCase]:
    return [c for c in merged.cases if is_decode(c.record.case)]


def facet(c: MergedCase) -> tuple:
    k = c.record.case
    return (k.dtype.value, k.head_dim, k.heads_q, k.heads_kv, k.page_size, k.seqlen_q,
            k.ctx_spread)  # fmt: skip


def facet_label(key: tuple) -> str:
    dtype, d, hq, hkv, page, sq, spread = key
    # Short: the full suite has 64 panels, four to a row, each title a quarter wide.
    cache = "contig" if page == 0 else f"page{page}"
    lengths = "equal" if spread == 1.0 else f"spread {spread:g}"
    return f"{dtype} H{hq}/{hkv} d{d} · {cache} · Sq={sq} · {lengths}"


def gpu_ceilings(merged: Merged) -> dict[str, Ceilings]:
    """Per GPU label of a decode case, the ceilings its worker measured (a run over several
    GPUs keeps each part's: `record_env`)."""
    out: dict[str, Ceilings] = {}
    for c in decode_cases(merged):
        if c.gpu not in out:
            out[c.gpu] = ceilings(record_env(merged.docs[c.run].env, c.record))
    return out


def _pct(v: float | None) -> str:
    return "–" if v is None else f"{v:.1%}"


def decode_hover(c: MergedCase, merged: Merged) -> str:
    """The common hover, plus the cache, the context lengths and the two fractions."""
    k: Case = c.record.case
    lengths = k.context_lengths()
    spread = f"{min(lengths)}–{max(lengths)}" if min(lengths) != max(lengths) else f"{max(lengths)}"
    hbm, copy = fractions(c.record, merged.docs[c.run].env)
    cache = "contiguous cache" if k.page_size == 0 else f"paged cache, {k.page_size} tokens a page"
    lines = [
        hover(c),
        f"{cache} · context lengths {spread}",
        f"<b>{_pct(copy)} of the copy bandwidth</b> · {_pct(hbm)} of the HBM peak",
    ]
    tel = c.record.telemetry if isinstance(c.record.telemetry, dict) else {}
    ratio = tel.get("bytes_ratio_measured_to_model")
    if isinstance(ratio, (int, float)):  # does the byte model match what NVML saw move?
        lines.append(f"NVML bytes per call ÷ byte model: {ratio:.3g}")
    return "<br>".join(lines)


def summary_sentences(merged: Merged) -> list[str]:
    """For the page's paragraph: per implementation (and GPU), the median and best
    fraction of the copy bandwidth over its ok decode cases; none without ceilings."""
    per: dict[str, list[float]] = {}
    for c in decode_cases(merged):
        copy = fractions(c.record, merged.docs[c.run].env)[1]
        if copy is not None:
            per.setdefault(impl_gpu_name(c, merged), []).append(copy)
    if not per:
        return []
    ranked = sorted(per.items(), key=lambda kv: -statistics.median(kv[1]))
    words = [f"{name} {statistics.median(v):.0%} (best {max(v):.0%}, {plural(len(v), 'case')})"
             for name, v in ranked]  # fmt: skip
    return ["Decode, median fraction of the measured copy bandwidth: " + "; ".join(words) + "."]


def _ctx(c: MergedCase) -> int:
    return int(c.record.case.seqlen_k)


def _style(merged: Merged, cases: list[MergedCase]) -> Callable[[MergedCase], dict]:
    """Colour and marker per implementation (as in the other figures), dash per batch."""
    index = {impl: i for i, impl in enumerate(merged.impls)}
    batches = {b: i for i, b in enumerate(sorted({c.record.case.batch for c in cases}))}

    def style(c: MergedCase) -> dict:
        i = index[c.record.impl]
        return {"color": PALETTE[i % len(PALETTE)], "symbol": SYMBOLS[i % len(SYMBOLS)],
                "dash": DASHES[batches[c.record.case.batch] % len(DASHES)]}  # fmt: skip

    return style


def _lines(fig: go.Figure, merged: Merged, cases: list[MergedCase], facets: list[tuple]) -> None:
    """One line per implementation (GPU) and batch in each panel, over its ok cases."""
    ok = [c for c in cases if c.record.status == Status.OK and c.record.gbps_model is not None]
    style = _style(merged, cases)
    shown: set[str] = set()
    by_facet = group_by(ok, facet)
    for i, key in enumerate(facets):
        row, col = panel_cell(i, len(facets))
        series = group_by(by_facet.get(key, []), lambda c: (impl_gpu_name(c, merged),
                                                            c.record.case.batch))  # fmt: skip
        for (impl, batch), group in series.items():
            name = f"{impl} · B={batch}"
            group.sort(key=_ctx)
            s = style(group[0])
            fig.add_trace(go.Scatter(
                x=[_ctx(c) for c in group], y=[c.record.gbps_model for c in group],
                name=name, legendgroup=name, showlegend=name not in shown,
                mode="lines+markers", line={"color": s["color"], "dash": s["dash"], "width": 2.5},
                marker={"symbol": s["symbol"], "size": 10, "line": {"width": 2}},
                text=[decode_hover(c, merged) for c in group],
                hovertemplate="%{text}<extra></extra>",
            ), row=row, col=col)  # fmt: skip
            shown.add(name)


def _failed_markers(fig: go.Figure, merged: Merged, cases: list[MergedCase],
                    facets: list[tuple]) -> None:  # fmt: skip
    """Out-of-memory and failed cases, at 0 with their message on hover."""
    for statuses, name, symbol, color in (
        ((Status.OOM,), "out of memory", "x", "#d62728"),
        (FAILED, "failed (error/timeout/mismatch)", "triangle-up-open", "#ff7f0e"),
    ):
        by_facet = group_by((c for c in cases if c.record.status in statuses), facet)
        for i, key in enumerate(facets):
            marked = by_facet.get(key, [])
            if not marked:
                continue
            row, col = panel_cell(i, len(facets))
            fig.add_trace(go.Scatter(
                x=[_ctx(c) for c in marked], y=[0.0] * len(marked), name=name, legendgroup=name,
                showlegend=not any(t.name == name for t in fig.data), mode="markers",
                marker={"symbol": symbol, "size": 11, "color": color, "line": {"width": 2}},
                text=[decode_hover(c, merged) for c in marked],
                hovertemplate="%{text}<extra></extra>",
            ), row=row, col=col)  # fmt: skip


def _ceiling_lines(fig: go.Figure, ceil: dict[str, Ceilings], facets: list[tuple],
                   x: tuple[float, float], several: bool) -> list[str]:  # fmt: skip
    """Each GPU's copy bandwidth and HBM peak as flat lines across every panel; returns the
    caption's words for them."""
    words = []
    for gpu, ce in ceil.items():
        where = f" · {esc(gpu)}" if several else ""
        for value, what, dash in ((ce.copy_gbps, "copy bandwidth (measured)", "dash"),
                                  (ce.hbm_gbps, "HBM peak (theoretical)", "dot")):  # fmt: skip
            if value is None:
                continue
            name = what + where
            for i in range(len(facets)):
                row, col = panel_cell(i, len(facets))
                fig.add_trace(go.Scatter(
                    x=list(x), y=[value, value], name=name, legendgroup=name, showlegend=i == 0,
                    mode="lines", line={"color": "#555" if dash == "dash" else "#999",
                                        "dash": dash, "width": 2},
                    hovertemplate=f"{name}: {value:.4g} GB/s<extra></extra>",
                ), row=row, col=col)  # fmt: skip
            words.append(f"{esc(gpu)} {what} {value:.4g} GB/s")
    return words


def decode_figure(merged: Merged) -> Figure | None:
    """GB/s against the context length for the decode cases; None when there are none."""
    cases = decode_cases(merged)
    if not cases:
        return None
    facets = sorted({facet(c) for c in cases}, key=lambda k: (*k[:-1], -k[-1]))  # equal first
    fig = panel_grid(facets, "GB/s (model)", titles=[facet_label(k) for k in facets],
                     x_title="context length (keys, the longest)")  # fmt: skip
    _lines(fig, merged, cases, facets)
    _failed_markers(fig, merged, cases, facets)
    xs = [_ctx(c) for c in cases]
    ceil = gpu_ceilings(merged)
    words = _ceiling_lines(fig, ceil, facets, (min(xs), max(xs)), len(merged.gpus) > 1)
    fig.update_annotations(font_size=11)  # the panel titles
    fig.update_xaxes(**pow2_ticks(xs))
    fig.update_yaxes(rangemode="tozero")
    add_legends(fig)
    ceilings_text = (
        "Flat lines: " + "; ".join(words) + ". "
        if words
        else "This run recorded no bandwidth ceilings (a CPU run, or NVML telemetry off or "
        "unavailable), so no fraction is shown. "
    )
    return Figure(
        "decode",
        "Decode: bandwidth vs context length",
        "Decoding is memory-bound: GB/s is the byte model (the K and V cache bytes of each "
        "sequence's valid length, plus q and o) ÷ the median latency. One line per "
        "implementation and batch (dash), one panel per dtype, head dim, head counts, "
        "cache layout, Sq and spread of context lengths; x is the longest context. "
        + ceilings_text
        + "The copy bandwidth is the worker's device-to-device copy timed before the first "
        "case (read + write bytes ÷ time): the ceiling a kernel that only streams memory "
        "reaches; the HBM peak is NVML's theoretical figure. Hover for the fractions of both.",
        fig,
    )
