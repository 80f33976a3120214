"""Compare two sets of results case by case and decide, with the noise taken into account,
whether anything got slower (the core of `fa-bench compare`).

The decision rule, per case present in both runs with status ok (README "Comparing runs"):

1. Let w be how much worse the current median is than the baseline's: current / baseline
   for latency and peak memory, baseline / current for TFLOP/s and GB/s. Within the
   threshold t (1/(1+t) <= w <= 1+t) the case is `same`.
2. Past the threshold, the change counts only when it also exceeds both runs' noise:
   a two-sided Mann-Whitney U test on the raw samples gives p < alpha, and the p20-p80
   ranges of the two runs do not overlap. Then the case is `slower` (w > 1+t) or
   `faster`. Otherwise, or with fewer than `min_samples` samples on a side, `ambiguous`.

Peak memory is one number per case (no samples, no noise): the threshold alone decides.
Status changes are verdicts of their own: `broken` (ok -> mismatch, ok -> oom, oom ->
error, ...), `fixed` (the reverse) and `changed` (between equally bad statuses).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import Enum

from fa_bench.case import Status
from fa_bench.compare.match import (
    CaseFilter,
    CompareError,
    EnvDiff,
    env_diffs,
    gpu_names,
    index_cases,
    side_value,
)
from fa_bench.compare.stats import mann_whitney_p, quantile

# The metric and thresholds live in their own module; re-exported here, where the commands
# and tests import them.
from fa_bench.compare.thresholds import (
    PRESETS,
    Metric,
    Thresholds,
    parse_threshold,
    thresholds_from,
)
from fa_bench.results.record import CaseRecord, ResultsDoc
from fa_bench.words import plural

__all__ = [
    "ALWAYS_FAIL_ON",
    "PRESETS",
    "CaseFilter",
    "CompareError",
    "Comparison",
    "FailOn",
    "Metric",
    "Row",
    "Thresholds",
    "Verdict",
    "compare_case",
    "compare_docs",
    "metric_samples",
    "parse_threshold",
    "sort_by_impact",
    "thresholds_from",
]


class Verdict(str, Enum):
    SAME = "same"
    FASTER = "faster"
    SLOWER = "slower"
    AMBIGUOUS = "ambiguous"
    BROKEN = "broken"  # status got worse: ok -> mismatch, ok -> oom, ...
    FIXED = "fixed"  # status got better
    CHANGED = "changed"  # between equally bad statuses (error -> mismatch, oom -> unsupported)
    NEW = "new"
    MISSING = "missing"
    UNMEASURED = "unmeasured"  # both ok, but the metric is absent (peak memory on a CPU)


class FailOn(str, Enum):
    """What makes the gate fail (exit 1). `slower` and `status` always do."""

    SLOWER = "slower"
    STATUS = "status"
    MISSING = "missing"
    AMBIGUOUS = "ambiguous"
    NEW = "new"


ALWAYS_FAIL_ON = frozenset({FailOn.SLOWER, FailOn.STATUS})
_FAILING = {
    FailOn.SLOWER: Verdict.SLOWER,
    FailOn.STATUS: Verdict.BROKEN,
    FailOn.MISSING: Verdict.MISSING,
    FailOn.AMBIGUOUS: Verdict.AMBIGUOUS,
    FailOn.NEW: Verdict.NEW,
}
# How bad a status is: a move to a higher rank is `broken`. An OOM or unsupported case
# is a finding, not a failure, but a case that used to run and no longer does regressed.
_STATUS_RANK = {
    Status.OK.value: 0,
    Status.OOM.value: 1,
    Status.UNSUPPORTED.value: 1,
    Status.ERROR.value: 2,
    Status.TIMEOUT.value: 2,
    Status.MISMATCH.value: 2,
}


# --- one case ---------------------------------------------------------------------------


@dataclass
class Row:
    """The comparison of one case."""

    key: str
    verdict: Verdict
    base_status: str | None
    cur_status: str | None
    base_value: float | None = None  # the metric's median (latency ms, TFLOP/s, ...)
    cur_value: float | None = None
    ratio: float | None = None  # current / baseline of the medians
    worse: float | None = None  # > 1 means worse, whatever the metric's direction
    p_value: float | None = None
    overlap: bool | None = None  # p20-p80 ranges overlap
    base_range: tuple[float, float] | None = None
    cur_range: tuple[float, float] | None = None
    n: tuple[int, int] | None = None
    reason: str = ""
    sm_clock_mhz: tuple[float, float] | None = None  # mean while sampling, both sides

    @property
    def impact(self) -> float:
        """Size of the change in log space, so 2x slower and 2x faster weigh the same."""
        return abs(math.log(self.worse)) if self.worse and self.worse > 0 else 0.0


def metric_samples(case: CaseRecord, metric: Metric) -> list[float] | None:
    """The case's raw samples in the metric's unit (tflops and gbps through the FLOP and
    byte models: value = model / time, one per latency sample)."""
    raw = case.latency_ms.samples if case.latency_ms is not None else []
    samples = [s for s in raw or [] if s is not None and s > 0]
    if not samples:
        return None
    if metric is Metric.LATENCY:
        return samples
    model = case.flops if metric is Metric.TFLOPS else case.bytes_model
    if not model:
        return None
    scale = 1e12 if metric is Metric.TFLOPS else 1e9
    return [model / (ms * 1e-3) / scale for ms in samples]


def _status_row(key: str, base: CaseRecord, cur: CaseRecord) -> Row | None:
    b, c = base.status.value, cur.status.value
    if b == c == Status.OK.value:
        return None
    if b == c:
        return Row(key, Verdict.SAME, b, c, reason=f"{b} in both")
    rb, rc = _STATUS_RANK[b], _STATUS_RANK[c]
    verdict = Verdict.BROKEN if rc > rb else Verdict.FIXED if rc < rb else Verdict.CHANGED
    message = (cur.error or "").strip().splitlines()
    detail = f": {message[0][:200]}" if message else ""
    return Row(key, verdict, b, c, reason=f"{b} → {c}{detail}")


def _classify(worse: float, threshold: float) -> Verdict:
    if worse > 1 + threshold:
        return Verdict.SLOWER
    if worse < 1 / (1 + threshold):
        return Verdict.FASTER
    return Verdict.SAME


def compare_case(
    key: str, base: CaseRecord, cur: CaseRecord, metric: Metric, th: Thresholds
) -> Row:
    """The verdict for one case present in both runs (the rule in the module docstring)."""
    status_row = _status_row(key, base, cur)
    if status_row is not None:
        return status_row
    ok = Status.OK.value
    t = th.of(metric)
    if metric is Metric.PEAK_MEM:
        b, c = base.peak_mem_bytes, cur.peak_mem_bytes
        if b is None or c is None:
            return Row(key, Verdict.UNMEASURED, ok, ok, reason="peak memory not recorded")
        b_mib, c_mib = b / 2**20, c / 2**20
        if b == 0 or c == 0:
            worse = 1.0 if b == c else (math.inf if b == 0 else 0.0)
        else:
            worse = c / b
        return Row(key, _classify(worse, t), ok, ok, b_mib, c_mib,
                   c / b if b else None, worse, reason="one value per run")  # fmt: skip
    bs, cs = metric_samples(base, metric), metric_samples(cur, metric)
    if not bs or not cs:
        return Row(key, Verdict.UNMEASURED, ok, ok, reason=f"no {metric.value} samples")
    bm, cm = quantile(bs, 0.5), quantile(cs, 0.5)
    ratio = cm / bm
    worse = 1 / ratio if metric.higher_is_better else ratio
    b20, b80, c20, c80 = (quantile(x, q) for x in (bs, cs) for q in (0.2, 0.8))
    row = Row(key, _classify(worse, t), ok, ok, bm, cm, ratio, worse, base_range=(b20, b80),
              cur_range=(c20, c80), n=(len(bs), len(cs)))  # fmt: skip
    if row.verdict is Verdict.SAME:
        row.reason = f"change within {t * 100:g}%"
        return row
    row.p_value = mann_whitney_p(bs, cs)
    row.overlap = b20 <= c80 and c20 <= b80
    if min(len(bs), len(cs)) < th.min_samples:
        row.verdict, row.reason = Verdict.AMBIGUOUS, f"too few samples (< {th.min_samples})"
    elif row.p_value >= th.alpha:
        row.verdict, row.reason = Verdict.AMBIGUOUS, f"within noise: p={row.p_value:.2g}"
    elif row.overlap:
        row.verdict = Verdict.AMBIGUOUS
        row.reason = f"p={row.p_value:.2g} but p20–p80 ranges overlap"
    else:
        row.reason = f"p={row.p_value:.2g}, p20–p80 ranges apart"
    _note_clock(row, base, cur)
    return row


def _note_clock(row: Row, base: CaseRecord, cur: CaseRecord) -> None:
    """Say when the SM clock moved with the latency: on a power-capped GPU the same code
    runs some percent slower at a lower clock. Said, not excused: the verdict stands."""
    b, c = (((r.timing or {}).get("sm_clock_mhz") or {}).get("mean") for r in (base, cur))
    if b is None or c is None:
        return
    row.sm_clock_mhz = (b, c)
    if abs(c / b - 1) >= 0.01:
        row.reason += f"; SM clock {b:.0f}→{c:.0f} MHz"


# --- many cases -------------------------------------------------------------------------


@dataclass
class Comparison:
    metric: Metric
    thresholds: Thresholds
    fail_on: frozenset[FailOn]
    rows: list[Row]
    env_diffs: list[EnvDiff] = field(default_factory=list)
    keyed_by_gpu: bool = False
    gpu_mismatch: bool = False  # the sides share no GPU model (allowed by the caller)

    def count(self, verdict: Verdict) -> int:
        return sum(1 for r in self.rows if r.verdict is verdict)

    @property
    def failing(self) -> list[Row]:
        bad = {_FAILING[f] for f in self.fail_on}
        return [r for r in self.rows if r.verdict in bad]

    @property
    def exit_code(self) -> int:
        return 1 if self.failing else 0


_VERDICT_ORDER = [Verdict.BROKEN, Verdict.SLOWER, Verdict.MISSING, Verdict.AMBIGUOUS,
                  Verdict.FASTER, Verdict.FIXED, Verdict.CHANGED, Verdict.NEW,
                  Verdict.UNMEASURED, Verdict.SAME]  # fmt: skip


def sort_by_impact(rows: Iterable[Row]) -> list[Row]:
    """Gate failures first, then by size of the change, then by name."""
    return sorted(rows, key=lambda r: (_VERDICT_ORDER.index(r.verdict), -r.impact, r.key))


_STATUS_CHANGES = (Verdict.BROKEN, Verdict.FIXED, Verdict.CHANGED)


def _check_comparable(rows: list[Row], metric: Metric) -> None:
    """Refuse a comparison that compared nothing: no common case has the metric on both
    sides and none changed status (all unmeasured, or failed alike in both), so a PASS
    would say nothing. One comparable case is enough: the rest are listed as they are."""
    if any(r.base_value is not None and r.cur_value is not None for r in rows):
        return
    if any(r.verdict in _STATUS_CHANGES for r in rows):
        return
    why = Counter(
        "unmeasured" if r.verdict is Verdict.UNMEASURED else f"{r.cur_status} in both" for r in rows
    )
    detail = ", ".join(f"{n} {what}" for what, n in sorted(why.items()))
    raise CompareError(
        f"nothing comparable: none of the {plural(len(rows), 'case')} common to both inputs has a "
        f"usable {metric.value} measurement on both sides ({detail})"
    )


def compare_docs(
    base_docs: Sequence[ResultsDoc],
    cur_docs: Sequence[ResultsDoc],
    *,
    metric: Metric = Metric.LATENCY,
    thresholds: Thresholds | None = None,
    fail_on: Iterable[FailOn] = (),
    case_filter: CaseFilter | None = None,
    allow_env_mismatch: bool = False,
) -> Comparison:
    """Match cases by id (and GPU name when both sides name one) and decide each.
    Raises CompareError when the GPU models differ (unless allowed), when no case is
    common to both, or when no common case is comparable (`_check_comparable`)."""
    th = thresholds or PRESETS["default"]
    diffs = env_diffs(base_docs, cur_docs)
    gb, gc = gpu_names(base_docs), gpu_names(cur_docs)
    # Key by GPU when every run names one, the sides share a model and some side holds
    # several: then a report merging H100 and H200 runs compares H200 with H200 (the H100
    # cases are `missing`). Otherwise (one GPU model, CPU runs, or models allowed to
    # differ) the id alone matches.
    by_gpu = None not in gb | gc and bool(gb & gc) and len(gb | gc) > 1
    gpu_mismatch = gb != gc and not by_gpu
    if gpu_mismatch and not allow_env_mismatch:
        b, c = side_value(base_docs, "gpu_name"), side_value(cur_docs, "gpu_name")
        raise CompareError(
            f"the GPU models differ (baseline: {b}; current: {c}): timings from different "
            "GPUs are not comparable; pass --allow-env-mismatch to compare anyway"
        )
    base, cur = index_cases(base_docs, by_gpu), index_cases(cur_docs, by_gpu)
    if case_filter is not None:
        base = {k: c for k, c in base.items() if case_filter.matches(c)}
        cur = {k: c for k, c in cur.items() if case_filter.matches(c)}
        if not base and not cur:
            raise CompareError(f"--filter {case_filter.text!r} matches no case in either input")
    common = base.keys() & cur.keys()
    if not common:
        raise CompareError(
            f"no case is common to both inputs ({len(base)} in the baseline, {len(cur)} in "
            "the current run): were they run with the same suite and implementations?"
        )
    rows = [compare_case(k, base[k], cur[k], metric, th) for k in common]
    _check_comparable(rows, metric)
    rows += [Row(k, Verdict.MISSING, base[k].status.value, None, reason="not in the current run")
             for k in base.keys() - cur.keys()]  # fmt: skip
    rows += [Row(k, Verdict.NEW, None, cur[k].status.value, reason="not in the baseline")
             for k in cur.keys() - base.keys()]  # fmt: skip
    return Comparison(metric, th, frozenset(fail_on) | ALWAYS_FAIL_ON, sort_by_impact(rows),
                      diffs, by_gpu, gpu_mismatch)  # fmt: skip
