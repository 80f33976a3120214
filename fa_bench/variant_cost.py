"""The cost of an attention variant (issue 19): each variant case against its dense control.

A variant case (a sliding window, ALiBi, a logit softcap, a packed batch of documents:
`Case.is_variant`) is paired with the dense case of the same shape: the same GPU,
implementation, mode, dtype, batch, head counts, sequence lengths, head dim and masking,
with no variant. The time ratio (variant median ÷ dense median) says what the variant
costs; the TFLOP/s side by side compare fairly, as the FLOP model counts attended pairs
only. A packed batch with no dense case of its padded shape (its `batch` sequences at the
longest length) is paired with an equal-length dense case of about its tokens (within
`TOKENS_TOLERANCE`), the one whose length is nearest its mean document length, and says so.

Pure functions of records: the terminal summary (`fa_bench.console`) and the report
(`fa_bench.reports.variants`) both read them; nothing here imports plotly.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass

from fa_bench.case import Case, Mode, Status
from fa_bench.results.record import CaseRecord

# A packed batch's fallback control: an equal-length dense case whose tokens (batch × N)
# are within this fraction of the packed total. A suite draws a packed batch's lengths
# around a target (`tokens`), and the seeded draws land up to ~15% off it (73462 for
# 65536 in the variants suite); further off, the time would mostly measure the token
# count, not the packing. The TFLOP/s (attended pairs) compare at any token count.
TOKENS_TOLERANCE = 0.25
SAME_SHAPE = "same shape"
SAME_TOKENS = "equal lengths, ~same tokens"


def is_variant(case: Case) -> bool:
    return case.is_variant


def variant_tag(case: Case) -> str:
    """The variant's part of the case id (`win4096.inf-alibi`), '' for a dense case: one
    spelling with the ids, so a facet, a table cell and a results file agree."""
    return case.id.rsplit("/", 1)[1] if is_variant(case) else ""


def _bound(n: int) -> str:
    return "∞" if n == -1 else str(n)


def variant_words(case: Case) -> str:
    """The variant in words for titles and tables: 'window 4096/∞ · ALiBi · softcap 50 ·
    packed uniform 512–4096'; '' for a dense case."""
    if not is_variant(case):
        return ""
    parts = []
    if case.has_window:
        parts.append(f"window {_bound(case.window_left)}/{_bound(case.window_right)}")
    if case.alibi:
        parts.append("ALiBi")
    if case.softcap:
        parts.append(f"softcap {case.softcap:g}")
    if case.varlen:
        kind, _, spec = case.varlen.partition(":")
        if kind == "uniform":
            parts.append(f"packed uniform {spec.replace('-', '–')}")
        else:
            parts.append(f"packed list of {case.batch}")
    return " · ".join(parts)


def _shape(case: Case, gpu: str) -> tuple:
    return (gpu, case.impl, case.mode.value, case.dtype.value, case.batch, case.heads_q,
            case.heads_kv, case.seqlen_q, case.seqlen_k, case.head_dim, case.causal)  # fmt: skip


def _family(case: Case, gpu: str) -> tuple:
    """What a packed batch's same-tokens control shares with it: all but batch and N."""
    return (gpu, case.impl, case.mode.value, case.dtype.value, case.heads_q, case.heads_kv,
            case.head_dim, case.causal)  # fmt: skip


@dataclass(frozen=True)
class VariantCost:
    """One variant case and its dense control (None when there is none)."""

    variant: CaseRecord
    gpu: str
    dense: CaseRecord | None
    control: str  # SAME_SHAPE, SAME_TOKENS, or '' without a control

    @property
    def ratio(self) -> float | None:
        """Variant median ÷ dense median: < 1 means the variant is faster (less work)."""
        v, d = _median(self.variant), _median(self.dense)
        return v / d if v is not None and d is not None and v > 0 and d > 0 else None

    @property
    def note(self) -> str:
        """Why there is no ratio, or '' when there is one."""
        if self.variant.status is not Status.OK:
            return f"variant {self.variant.status.value}"
        if self.dense is None:
            return "no dense control of the same shape"
        if self.dense.status is not Status.OK:
            return f"dense control {self.dense.status.value}"
        return "" if self.ratio is not None else "no median"


def _median(r: CaseRecord | None) -> float | None:
    if r is None or r.status is not Status.OK or r.latency_ms is None:
        return None
    return r.latency_ms.median


def _nearest_tokens(case: Case, candidates: list[CaseRecord]) -> CaseRecord | None:
    """The equal-length dense case of about `case`'s tokens whose length is nearest its
    mean document length (a suite holds several dense cases of one token count: 8 × 8k
    and 32 × 2k; the packed batch of 2k-token documents on average compares with 32 × 2k)."""
    total = case.total_tokens
    mean = total / case.batch
    near = [
        r for r in candidates
        if r.case.seqlen_q == r.case.seqlen_k
        and abs(r.case.batch * r.case.seqlen_q - total) <= TOKENS_TOLERANCE * total
    ]  # fmt: skip
    return min(near, key=lambda r: abs(math.log(r.case.seqlen_q / mean)), default=None)


def variant_costs(records: Iterable[tuple[CaseRecord, str]]) -> list[VariantCost]:
    """Each variant record (with its GPU label) paired with its dense control, in order."""
    items = list(records)
    dense: dict[tuple, CaseRecord] = {}
    family: dict[tuple, list[CaseRecord]] = {}
    for r, gpu in items:
        if not is_variant(r.case) and r.case.mode is not Mode.DECODE:
            dense[_shape(r.case, gpu)] = r
            family.setdefault(_family(r.case, gpu), []).append(r)
    out = []
    for r, gpu in items:
        if not is_variant(r.case):
            continue
        control = dense.get(_shape(r.case, gpu))
        how = SAME_SHAPE if control is not None else ""
        if control is None and r.case.varlen:
            control = _nearest_tokens(r.case, family.get(_family(r.case, gpu), []))
            how = SAME_TOKENS if control is not None else ""
        out.append(VariantCost(r, gpu, control, how))
    return out


def cost_lines(costs: list[VariantCost]) -> list[str]:
    """One line per (implementation, variant) with a ratio: the median time ratio over its
    shapes and how many had none; then one line for the variant cases without any ratio
    (most often variants an implementation does not run: their reasons are listed apart)."""
    groups: dict[tuple[str, str], list[VariantCost]] = {}
    for c in costs:
        groups.setdefault((c.variant.impl, variant_tag(c.variant.case)), []).append(c)
    lines, without = [], []
    for (impl, tag), group in groups.items():
        ratios = [x for c in group if (x := c.ratio) is not None]
        if not ratios:
            without += group
            continue
        lo, hi = min(ratios), max(ratios)
        detail = f", {lo:.2f}–{hi:.2f}×" if len(ratios) > 1 else ""
        tokens = sum(c.control == SAME_TOKENS for c in group)
        if tokens:  # a packed batch's fallback control: say so
            detail += f"; {tokens} against equal lengths of about its tokens"
        text = f"{statistics.median(ratios):.2f}× the dense time (median of {len(ratios)}{detail})"
        missing = [c for c in group if c.ratio is None]
        if missing:
            text += f"; {len(missing)} without a ratio ({_reasons(missing)})"
        lines.append(f"{impl} {tag}: {text}")
    if without:
        lines.append(f"no ratio for {len(without)} more: {_reasons(without)}")
    return lines


def _reasons(group: list[VariantCost]) -> str:
    notes: dict[str, int] = {}
    for c in group:
        if c.note:
            notes[c.note] = notes.get(c.note, 0) + 1
    return ", ".join(f"{n} {note}" for note, n in notes.items())
