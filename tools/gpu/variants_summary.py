"""Issue 19's H200 ratios from `fa-bench run` results of the variants suite
(tools/gpu/variants_check.sh): per mode,

- sliding window: ours ÷ flex (time ratio, flex's time over ours: >= 1.0 is ours faster)
  and our window TFLOP/s (attended pairs only) ÷ our dense causal TFLOP/s at the same
  shape (>= 0.85 wanted);
- softcap, ALiBi: our TFLOP/s ÷ our plain kernel's (>= 0.9 wanted) and ours ÷ flex;
- packed batches: our TFLOP/s ÷ ours on the equal-length control of the same batch and
  head shape (>= 0.9 wanted);
- every case's status and accuracy.

    python tools/gpu/variants_summary.py RESULTS_JSON [...]

Prints Markdown. A developer tool, not installed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from fa_bench.variants import varlen_lengths


def _records(paths: list[str]) -> list[dict]:
    out = []
    for p in paths:
        path = Path(p) / "results.json" if Path(p).is_dir() else Path(p)
        with open(path) as f:
            # each run pairs its own cases (a control is measured beside its variant)
            out.extend(dict(rec, _src=str(path)) for rec in json.load(f)["cases"])
    return out


def _rest(rec: dict) -> str:
    """The id without the implementation: the same workload across implementations."""
    return rec["id"].split("/", 1)[1]


def _variant(rec: dict) -> bool:
    return (
        rec.get("window_left", -1) != -1
        or rec.get("window_right", -1) != -1
        or bool(rec.get("alibi"))
        or bool(rec.get("softcap"))
        or bool(rec.get("varlen"))
    )


def _control(rec: dict, recs: list[dict]) -> dict | None:
    """The dense causal case of the same shape (a packed batch: the equal-length case of
    the same batch size, heads and tokens), same implementation and mode, from the same run."""
    best: tuple[int, dict] | None = None
    for r in recs:
        if r["impl"] != rec["impl"] or r["mode"] != rec["mode"] or _variant(r):
            continue
        if r["_src"] != rec["_src"]:
            continue
        same = ("dtype", "heads_q", "heads_kv", "head_dim", "causal", "batch")
        if any(r.get(k) != rec.get(k) for k in same):
            continue
        if r["seqlen_q"] == rec["seqlen_q"] and not rec.get("varlen"):
            return r
        if rec.get("varlen"):
            # the equal-length control holds the same tokens: of the run's dense cases of
            # this batch, the one whose batch x seqlen is nearest the packed documents' sum
            tokens = sum(varlen_lengths(rec["varlen"], rec["batch"]))
            gap = abs(r["batch"] * r["seqlen_q"] - tokens)
            if best is None or gap < best[0]:
                best = (gap, r)
    return best[1] if best else None


def _tflops(rec: dict | None) -> float | None:
    if rec is None or rec.get("status") != "ok":
        return None
    return rec.get("tflops")


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.3f}" if a and b else "–"


def _time(rec: dict | None) -> float | None:
    if rec is None or rec.get("status") != "ok":
        return None
    return (rec.get("latency_ms") or {}).get("median")


def summary(recs: list[dict]) -> list[str]:
    by_rest = {(r["_src"], r["impl"], _rest(r)): r for r in recs}
    # flex from another run of the same call when its own run had none (FLEX_LAST)
    anywhere = {(r["impl"], _rest(r)): r for r in recs if r["status"] == "ok"}
    lines = [
        "| case | mode | status | acc | TFLOP/s | ÷ our control | control TFLOP/s | "
        "flex ÷ ours (time) | backend |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(recs, key=lambda r: (r["impl"] != "triton", r["mode"], r["id"])):
        if r["impl"] != "triton":
            continue
        ctrl = _control(r, recs) if _variant(r) else None
        flex = by_rest.get((r["_src"], "flex", _rest(r))) or anywhere.get(("flex", _rest(r)))
        acc = (r.get("accuracy") or {}).get("passed")
        t = _tflops(r)
        lines.append(
            f"| {_rest(r)} | {r['mode']} | {r['status']} | {acc} | "
            f"{f'{t:.1f}' if t else '–'} | {_ratio(t, _tflops(ctrl))} | "
            f"{f'{_tflops(ctrl):.1f}' if _tflops(ctrl) else '–'} | "
            f"{_ratio(_time(flex), _time(r))} | {r.get('backend') or ''} |"
        )
    bad = [r for r in recs if r["status"] != "ok" or not (r.get("accuracy") or {}).get("passed")]
    lines += ["", f"{len(recs)} cases; not ok or failing accuracy: {len(bad)}"]
    lines += [f"- {r['id']}: {r['status']} {r.get('error') or ''}"[:300] for r in bad]
    return lines


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    paths = [a for a in argv if Path(a).exists()]
    if not paths:
        print("no results files found:", " ".join(argv))
        return 1
    print("\n".join(summary(_records(paths))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
