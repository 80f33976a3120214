"""Pick the Gluon fp8 launch for the final run from tools/gpu/fp8_gluon_check.py's results:

    python tools/gpu/fp8_pick.py $OUT/fp8_gluon.json   # prints "<non-causal role>,<causal role>"
    python tools/gpu/fp8_pick.py --table $OUT/fp8_gluon.json   # "128/0/0=ws,128/1/0=...,..."

(or the check's rows file, $OUT/fp8-gluon-lines.jsonl, one JSON row per line).

Per causality, among the roles whose every correctness check passed and that were timed at
every head_dim 128 shape of that causality, the one with the best mean fp8 ÷ bf16 ratio
(the bf16 forward timed in the same check; without it, the best mean TFLOP/s); "ws" (the
heuristic's) where none qualifies.
The output is what $FA_BENCH_FP8_GLUON_ROLE takes (kernels/flash_gluon_fp8.py).
--table: per causality and timed length the best role the same way (at that length only),
as $FA_BENCH_FP8_GLUON_TABLE's ranges (kernels/flash_gluon_fp8_table.py): the shortest
length's role from 0, each longer length's from twice the length before it.
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


def _best(bench: list[dict], failed: set[str], causal: bool, n: int) -> str:
    """The role with the best fp8 ÷ bf16 (or TFLOP/s) at one shape, "ws" where none."""

    def at(role: str) -> float | None:
        got = [r["tflops"] for r in bench if r["role"] == role and r["causal"] == causal
               and r["n"] == n and "tflops" in r and not r.get("failed_checks")]  # fmt: skip
        return got[0] if got else None

    base = at("bf16") or 1.0
    best, best_score = "ws", -1.0
    for role in sorted({r["role"] for r in bench} - set(BASELINES) - failed):
        tflops = at(role)
        if tflops is not None and tflops / base > best_score:
            best, best_score = role, tflops / base
    return best


def table(doc: dict, valid: set[str] | None = None) -> str:
    """--table's text: head_dim 128's ranges per causality (empty where nothing was timed)."""
    rows = [r for r in doc.get("rows", []) if valid is None or r.get("role") in valid
            or r.get("role") in BASELINES]  # fmt: skip
    failed = {r["role"] for r in rows if r.get("kind") == "check" and not r.get("passed")}
    bench = [r for r in rows if r.get("kind") == "bench" and r.get("head_dim") == 128]
    entries = []
    for causal in (False, True):
        lengths = sorted({r["n"] for r in bench if r["causal"] == causal
                          and r["role"] not in BASELINES})  # fmt: skip
        previous = None
        for i, n in enumerate(lengths):
            role = _best(bench, failed, causal, n)
            if role != previous:
                start = 0 if i == 0 else 2 * lengths[i - 1]
                entries.append(f"128/{int(causal)}/{start}={role}")
                previous = role
    return ",".join(entries)


def main(argv: list[str]) -> int:
    as_table = argv[:1] == ["--table"]
    argv = argv[1:] if as_table else argv
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
    print(table(doc, valid) if as_table else pick(doc, valid))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
