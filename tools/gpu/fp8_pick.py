"""Pick the Gluon fp8 launch for the final run from tools/gpu/fp8_gluon_check.py's results:

    python tools/gpu/fp8_pick.py $OUT/fp8_gluon.json   # prints "<non-causal role>,<causal role>"

(or the check's rows file, $OUT/fp8-gluon-lines.jsonl, one JSON row per line).

Per causality, among the roles whose every correctness check passed and that were timed at
every head_dim 128 shape of that causality, the one with the best mean fp8 ÷ bf16 ratio
(the bf16 forward timed in the same check; without it, the best mean TFLOP/s); "ws" (the
heuristic's) where none qualifies.
The output is what $FA_BENCH_FP8_GLUON_ROLE takes (kernels/flash_gluon_fp8.py).
"""

from __future__ import annotations

import json
import sys

BASELINES = ("bf16", "tl-fp8")


def pick(doc: dict, valid: set[str] | None = None) -> str:
    """`valid`: the role names the kernel knows (others are ignored)."""
    rows = [r for r in doc.get("rows", []) if valid is None or r.get("role") in valid
            or r.get("role") in BASELINES]  # fmt: skip
    failed = {r["role"] for r in rows if r.get("kind") == "check" and not r.get("passed")}
    bench = [r for r in rows if r.get("kind") == "bench" and r.get("head_dim") == 128]
    chosen = []
    for causal in (False, True):
        base = {r["n"]: r["tflops"] for r in bench
                if r["role"] == "bf16" and r["causal"] == causal and "tflops" in r}  # fmt: skip
        shapes = {r["n"] for r in bench if r["causal"] == causal and r["role"] not in BASELINES}
        if not base:  # no bf16 timed: every role against the same 1, i.e. plain TFLOP/s
            base = dict.fromkeys(shapes, 1.0)
        best, best_score = "ws", -1.0
        for role in sorted({r["role"] for r in bench} - set(BASELINES) - failed):
            got = {r["n"]: r["tflops"] for r in bench if r["role"] == role
                   and r["causal"] == causal and "tflops" in r
                   and not r.get("failed_checks")}  # fmt: skip
            if not shapes or set(got) != shapes or not all(base.get(n) for n in shapes):
                continue
            score = sum(got[n] / base[n] for n in shapes) / len(shapes)
            if score > best_score:
                best, best_score = role, score
        chosen.append(best)
    return ",".join(chosen)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    try:
        with open(argv[0]) as f:
            text = f.read()
        if argv[0].endswith(".jsonl"):
            doc = {"rows": [json.loads(line) for line in text.splitlines() if line.strip()]}
        else:
            doc = json.loads(text)
    except (OSError, ValueError) as e:
        print(f"ws,ws  # {argv[0]}: {e}", file=sys.stderr)
        doc = {}
    try:
        from fa_bench.kernels.flash_gluon_fp8 import candidate_configs

        valid: set[str] | None = set(candidate_configs(128))
    except ImportError:
        valid = None
    print(pick(doc, valid))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
