"""Rows for the report's HTML tables: all cases, failures, throttled cases.

Cells are plain strings (escaped where they are written: by the template, or by
`case_rows_html` for the all-cases table) with a numeric sort value where the column is a
number, so the page's sorter orders 9 before 10.
"""

from __future__ import annotations

from numbers import Number

from markupsafe import Markup, escape

from fa_bench.case import Status
from fa_bench.reports.figures import time_limit_note
from fa_bench.reports.merge import Merged, MergedCase, group_by
from fa_bench.results.bandwidth import fractions, is_decode
from fa_bench.variant_cost import is_variant, variant_words

CASE_COLUMNS = (
    "GPU",
    "impl",
    "mode",
    "dtype",
    "B",
    "Hq",
    "Hkv",
    "Sq",
    "Sk",
    "D",
    "causal",
    "status",
    "median ms",
    "p20–p80 ms",
    "TFLOP/s",
    "GB/s",
    "peak MiB",
    "max abs err",
    "backend",
    "message",
)
STATUS_COLUMN = CASE_COLUMNS.index("status")  # its cell is coloured by the case's status
# With decode cases the table also names each case's cache and spread (two decode cases
# differ by those alone) and its fractions of the GPU's ceilings, beside GB/s. A page
# without decode cases keeps the columns it always had.
_AFTER_CAUSAL, _AFTER_GBPS = CASE_COLUMNS.index("causal") + 1, CASE_COLUMNS.index("GB/s") + 1
DECODE_CASE_COLUMNS = (
    *CASE_COLUMNS[:_AFTER_CAUSAL], "cache", "spread", *CASE_COLUMNS[_AFTER_CAUSAL:_AFTER_GBPS],
    "% copy BW", "% HBM peak", *CASE_COLUMNS[_AFTER_GBPS:],
)  # fmt: skip


def has_decode(merged: Merged) -> bool:
    return any(is_decode(c.record.case) for c in merged.cases)


def has_variants(merged: Merged) -> bool:
    return any(is_variant(c.record.case) for c in merged.cases)


def case_columns(merged: Merged) -> tuple[str, ...]:
    """The all-cases table's columns: a page with variant cases (issue 19) gets a variant
    column after causal (two cases may differ by it alone); decode cases theirs."""
    columns = DECODE_CASE_COLUMNS if has_decode(merged) else CASE_COLUMNS
    if has_variants(merged):
        columns = (*columns[:_AFTER_CAUSAL], "variant", *columns[_AFTER_CAUSAL:])
    return columns


def _decode_cells(c: MergedCase, merged: Merged) -> tuple[list[dict], list[dict]]:
    """(cache and spread, the two fractions) of a case; '–' for a prefill case."""
    k = c.record.case
    if not is_decode(k):
        return [_cell(None, "")] * 2, [_cell(None, "")] * 2
    cache = _cell("contig" if k.page_size == 0 else f"page{k.page_size}", k.page_size)
    spread = _cell(f"{k.ctx_spread:g}", k.ctx_spread)
    hbm, copy = fractions(c.record, merged.docs[c.run].env)
    pct = [_cell(None, "") if f is None else _cell(f"{f:.1%}", f) for f in (copy, hbm)]
    return [cache, spread], pct


def _cell(text: object, sort: float | str | None = None) -> dict:
    shown = "–" if text is None else str(text)
    return {"text": shown, "sort": shown if sort is None else sort}


def _num(v: object, fmt: str = ".4g") -> dict:
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return _cell(None, "")
    return _cell(format(v, fmt), v)


def _message(c: MergedCase) -> str:
    """The case's error, or, for a median measured less surely than asked, why."""
    text = " ".join(str(c.record.error or "").split())
    if c.record.noisy_at_limit:
        text = "⚠ " + time_limit_note(c.record) + (f"; {text}" if text else "")
    return text if len(text) <= 300 else text[:299] + "…"


def case_rows(merged: Merged) -> list[dict]:
    rows = []
    decode, variants = has_decode(merged), has_variants(merged)
    for c in merged.cases:
        r, k, lat = c.record, c.record.case, c.record.latency_ms
        peak = r.peak_mem_bytes
        spread = (
            f"{lat.p20:.4g}–{lat.p80:.4g}"
            if lat is not None and lat.p20 is not None and lat.p80 is not None
            else None
        )
        cells = [
            _cell(c.gpu),
            _cell(k.impl),
            _cell(k.mode.value),
            _cell(k.dtype.value),
            _num(k.batch, "d"),
            _num(k.heads_q, "d"),
            _num(k.heads_kv, "d"),
            _num(k.seqlen_q, "d"),
            _num(k.seqlen_k, "d"),
            _num(k.head_dim, "d"),
            _cell("yes" if k.causal else "no"),
            _cell(r.status.value),
            _num(lat.median if lat else None),
            _cell(spread, (lat.p80 if lat else None) or ""),
            _num(r.tflops),
            _num(r.gbps_model),
            _num(peak / 2**20 if isinstance(peak, (int, float)) else None, ".4g"),
            _num((r.accuracy or {}).get("max_abs_err"), ".3g"),
            _cell(r.backend),
            _cell(_message(c) or None, ""),
        ]
        if decode:
            layout, pct = _decode_cells(c, merged)
            cells[_AFTER_GBPS:_AFTER_GBPS] = pct  # the later insert first: indices hold
            cells[_AFTER_CAUSAL:_AFTER_CAUSAL] = layout
        if variants:  # last: before the decode cells, as case_columns puts it
            cells.insert(_AFTER_CAUSAL, _cell(variant_words(k) or None, ""))
        rows.append({"status": r.status.value, "cells": cells})
    return rows


def case_rows_html(rows: list[dict], status_column: int = STATUS_COLUMN) -> Markup:
    """The all-cases table's body rows, each cell escaped: what a template loop over `rows`
    would write, byte for byte, at a fraction of its cost (a loop of 20 cells per case
    was the largest step of a 100k-case report)."""
    out = []
    for row in rows:
        status = escape(row["status"])
        tds = []
        for i, cell in enumerate(row["cells"]):
            sort = cell["sort"]
            num = ' class="num"' if isinstance(sort, Number) else ""
            cls = f' class="status-{status}"' if i == status_column else ""
            tds.append(f'<td data-sort="{escape(sort)}"{num}{cls}>{escape(cell["text"])}</td>')
        out.append(f'<tr data-status="{status}">{"".join(tds)}</tr>\n')
    return Markup("".join(out))


def failure_rows(merged: Merged) -> list[dict]:
    """Every case that is not ok, with its message: failed, mismatched, OOM, unsupported."""
    order = {"error": 0, "timeout": 1, "mismatch": 2, "oom": 3, "unsupported": 4}
    bad = [c for c in merged.cases if c.record.status != Status.OK]
    bad.sort(key=lambda c: (order.get(c.record.status.value, 9), c.gpu, c.record.id))
    return [
        {
            "gpu": c.gpu,
            "id": c.record.id,
            "status": c.record.status.value,
            "message": " ".join(str(c.record.error or "(no message)").split()),
        }
        for c in bad
    ]


def throttle_rows(merged: Merged) -> list[dict]:
    """Cases whose telemetry warned: throttling, or an SM clock under 90% of its max.
    `warnings` leaves out benign clock-event bits (gpu_idle, sync boost) that
    `throttle_reasons` lists too."""
    rows = []
    for c in merged.cases:
        tel = c.record.telemetry
        if not isinstance(tel, dict):
            continue
        reasons = tel["warnings"] if "warnings" in tel else tel.get("throttle_reasons")
        if reasons:
            text = ", ".join(map(str, reasons)) if isinstance(reasons, list) else str(reasons)
            rows.append({"gpu": c.gpu, "id": c.record.id, "reasons": text})
    return rows


def telemetry_note(merged: Merged) -> str | None:
    """A sentence for the GPUs whose cases have no NVML telemetry: switched off by the
    user (--no-telemetry), which is a choice and not a fault, or unavailable, with why.
    None when every GPU has telemetry, or no case recorded any (older results)."""
    from fa_bench.telemetry.session import DISABLED

    states: list[tuple[str, str]] = []
    with_tel = group_by((c for c in merged.cases if isinstance(c.record.telemetry, dict)),
                        lambda c: c.gpu)  # fmt: skip
    for doc, label in merged.labelled_docs():
        tels = [t for c in with_tel.get(label, []) if isinstance(t := c.record.telemetry, dict)]
        if not tels or any(t.get("available") is not False for t in tels):
            continue
        options = doc.run.get("options") or {}
        reasons = sorted({str(t.get("reason")) for t in tels if t.get("reason")} - {DISABLED})
        switched_off = not reasons and any(t.get("reason") == DISABLED for t in tels)
        if options.get("telemetry") is False or switched_off:
            states.append((label, "off (--no-telemetry)"))
        else:
            states.append((label, "unavailable: " + ("; ".join(reasons) or "no reason recorded")))
    if not states:
        return None
    if len(merged.gpus) == 1:
        return f"NVML telemetry: {states[0][1]}."
    return "NVML telemetry " + "; ".join(f"on {label}: {state}" for label, state in states) + "."
