"""The launch per head_dim that an A/B measured fastest (issue 18, session 7):

    python tools/gpu/gluon_bwd_pick.py OUT/gluon_bwd_ab.json

Prints $FA_BENCH_GLUON_BWD_ROLE's value, "<head_dim>=<role>,..." (empty if nothing was
measured), for the `fa-bench run` that follows in the same call. A role is a candidate
only where it was timed at every shape its baseline was and its dQ was within DQ_REL
of the baseline's (the reduce-adds land in any order; dK/dV may differ in the last bit
where a role sums the query blocks in another order: the accuracy rule that `fa-bench
run` applies to every case, and the GPU tests, judge them); among candidates the
highest geometric mean of TFLOP/s ÷ the baseline's wins, and the baseline (the first
role) keeps it unless another is at least MARGIN faster. A developer tool, not installed.
"""

from __future__ import annotations

import json
import math
import sys

DQ_REL = 1e-2
MARGIN = 1.005


def pick(doc: dict) -> dict[int, str]:
    """{head_dim: role} from gluon_bwd_ab.py's document (rows and roles)."""
    timed: dict[tuple[int, str], dict] = {}
    for r in doc["rows"]:
        if r.get("kind") == "bench" and "tflops" in r:
            timed.setdefault((r["head_dim"], r["impl"]), {})[(r["n"], r["causal"])] = r
    out = {}
    for dim, roles in doc["roles"].items():
        d = int(dim)
        base = timed.get((d, roles[0]), {})
        if not base:
            continue
        best, best_score = roles[0], 1.0
        for role in roles[1:]:
            rows = timed.get((d, role), {})
            if set(rows) != set(base):
                continue
            if any(r.get("dq_rel", 1.0) > DQ_REL for r in rows.values()):
                continue
            logs = [math.log(rows[s]["tflops"] / base[s]["tflops"]) for s in base]
            score = math.exp(sum(logs) / len(logs))
            if score >= MARGIN and score > best_score:
                best, best_score = role, score
        out[d] = best
    return out


def main() -> int:
    with open(sys.argv[1]) as f:
        doc = json.load(f)
    print(",".join(f"{d}={r}" for d, r in sorted(pick(doc).items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
