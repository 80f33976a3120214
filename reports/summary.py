"""The one-paragraph summary at the top of a report, written from the data.

Plain text: the template escapes it like every other string.
"""

from __future__ import annotations

import statistics
from collections import Counter

from fa_bench.case import Status
from fa_bench.reports import decode, variants
from fa_bench.reports.figures import FAILED
from fa_bench.reports.merge import Merged, MergedCase, group_by
from fa_bench.reports.speedup import shape_key, speedups
from fa_bench.words import plural

_MODE_WORDS = {"fwd": "forward", "bwd": "backward", "fwd_bwd": "forward+backward",
               "decode": "decode"}  # fmt: skip


def _kseq(n: int) -> str:
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


def _join(words: list[str]) -> str:
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def _counts(merged: Merged) -> str:
    status = Counter(c.record.status.value for c in merged.cases)
    parts = [f"{status['ok']} ok"]
    for key, word in (("oom", "out of memory"), ("unsupported", "unsupported")):
        if status[key]:
            parts.append(f"{status[key]} {word}")
    failed = sum(status[s.value] for s in FAILED)
    if failed:
        parts.append(f"{failed} failed")
    impls = ", ".join(merged.impls)
    cases = plural(len(merged.cases), "case")
    return f"{cases} of {impls} on {_join(merged.gpus)}: {', '.join(parts)}."


def _speedup_sentences(merged: Merged, baseline: str) -> list[str]:
    rows = speedups(merged, baseline)
    ranked = []
    for row, pairs in rows.items():
        impl, _, gpu = row.partition(" · ")
        med = statistics.median(r for _, r in pairs)
        dtypes = sorted({s[1] for s, _ in pairs})
        modes = sorted({_MODE_WORDS.get(s[0], s[0]) for s, _ in pairs})
        where = f" on {gpu}" if gpu else ""
        ranked.append(
            (
                med,
                f"{impl} is {med:.2f}× {baseline}{where} on median over "
                f"{len(pairs)} {'/'.join(dtypes)} {'/'.join(modes)} "
                f"{'case' if len(pairs) == 1 else 'cases'}",
            )
        )
    ranked.sort(key=lambda t: -t[0])
    if not ranked:
        return []
    return [_join([text for _, text in ranked]) + "."]


def _leaders(merged: Merged) -> str | None:
    """Which implementation is fastest on how many shapes (per GPU)."""
    best: dict[tuple, tuple[float, MergedCase]] = {}
    for c in merged.cases:
        lat = c.record.latency_ms
        if c.record.status != Status.OK or lat is None:
            continue
        key = (shape_key(c), c.gpu)
        if key not in best or lat.median < best[key][0]:
            best[key] = (lat.median, c)
    ok = Counter((shape_key(c), c.gpu) for c in merged.cases if c.record.status == Status.OK)
    contested = {k for k in best if ok[k] > 1}
    if not contested:
        return None
    wins = Counter(best[k][1].record.impl for k in contested)
    ordered = [f"{impl} in {n}" for impl, n in wins.most_common()]
    return f"Fastest per shape: {_join(ordered)} of {plural(len(contested), 'shape')} compared."


def _oom_sentences(merged: Merged) -> list[str]:
    out = []
    by_impl = group_by((c for c in merged.cases if c.record.status == Status.OOM),
                       lambda c: c.record.impl)  # fmt: skip
    for impl in merged.impls:
        ooms = [c.record.case for c in by_impl.get(impl, [])]
        if ooms:
            n_min = min(k.seqlen_k for k in ooms)
            word = "case" if len(ooms) == 1 else "cases"
            out.append(f"{len(ooms)} {impl} {word} ran out of memory at N ≥ {_kseq(n_min)}")
    return [_join(out) + "."] if out else []


def _failure_sentence(merged: Merged) -> list[str]:
    failed = Counter(c.record.status.value for c in merged.cases if c.record.status in FAILED)
    if not failed:
        return []
    detail = ", ".join(f"{n} {s}" for s, n in sorted(failed.items()))
    cases = plural(sum(failed.values()), "case")
    return [f"{cases} failed ({detail}): see the failures list below."]


def _time_limit_sentence(merged: Merged) -> list[str]:
    """How many medians are less certain than the run asked (CaseRecord.noisy_at_limit)."""
    noisy = [c.record for c in merged.cases if c.record.noisy_at_limit]
    if not noisy:
        return []
    worst = max(r.latency_ms.noise or 0.0 for r in noisy if r.latency_ms is not None)
    n = len(noisy)
    return [
        f"{n} {'case' if n == 1 else 'cases'} stopped at the time limit with the noise "
        f"above its target (up to {worst:.1%}): marked ⚠ in the table and the figures' "
        "hover; --max-time or a quieter machine gives surer medians."
    ]


def paragraph(merged: Merged, baseline: str) -> str:
    parts = [_counts(merged), *_speedup_sentences(merged, baseline)]
    leaders = _leaders(merged)
    if leaders:
        parts.append(leaders)
    parts += decode.summary_sentences(merged)  # bandwidth, not speed, for decode
    parts += variants.summary_sentences(merged)  # each variant's time against its dense case
    parts += _oom_sentences(merged) + _failure_sentence(merged) + _time_limit_sentence(merged)
    if any(label.split(" (")[0] == "CPU" for label in merged.gpus):  # "CPU (runA)" too
        parts.append("CPU timings show that the cases run and are correct, not GPU performance.")
    return " ".join(parts)
