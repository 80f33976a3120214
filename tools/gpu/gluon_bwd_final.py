"""Issue 18's final GPU call in one command (~2.5 minutes): the Gluon backward as it ships
checked, then measured through `fa-bench run`.

    python tools/gpu/gluon_bwd_final.py [--budget 150] [--check-s 30]

1. tools/gpu/gluon_bwd_check.py's FINAL_PLAN in a child (killed after 30 s without
   progress): the heuristic's kernel (early dQ chunk, rotated non-causal) against the
   float64 reference with the accuracy rule and against the deterministic backward, bf16
   and fp16, head_dim 64 and 128, causal both, GQA, odd lengths, Sq ≠ Sk; the
   `flash_attention(backward="gluon")` call;
2. tools/gpu/gluon_bwd_run.py's `fa-bench run` of the standard suite's backward at 4k and
   16k, bf16 (fp16 too if the budget allows): `triton` (two-kernel), `triton-onepass`
   (the Gluon backward on sm_90) and `sdpa-cudnn`, with the TFLOP/s table.

Writes under $OUT: gluon_bwd_final.md (rewritten after each stage, so a cap that kills
the command leaves what finished), gluon-bwd-lines.jsonl, results-<dtype>.json,
run-<dtype>.log, gluon-bwd-check.log. Needs CUDA; a developer tool, not installed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import gluon_bwd_check as check  # noqa: E402  (beside this file)
import gluon_bwd_run as run  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, default=140.0, help="seconds for everything")
    ap.add_argument("--check-s", type=float, default=30.0, help="no new check after this")
    ap.add_argument("--max-time", type=float, default=0.5, help="fa-bench's --max-time")
    args = ap.parse_args()
    start = time.time()
    out = Path(os.environ.get("OUT", "fa-bench-out/out"))
    out.mkdir(parents=True, exist_ok=True)
    work = Path("fa-bench-out/gluon-bwd-run")
    work.mkdir(parents=True, exist_ok=True)
    report = out / "gluon_bwd_final.md"
    lines = str(out / "gluon-bwd-lines.jsonl")
    if os.path.exists(lines):
        os.remove(lines)
    child = check._run_child(
        ["--child", "check", "--final", str(args.check_s), "--lines", lines],
        lines,
        "check",
        str(HERE / "gluon_bwd_check.py"),
    )
    rows = [json.loads(line) for line in open(lines)] if os.path.exists(lines) else []
    text = check.markdown(dict(env={}, children=[child], rows=rows))
    report.write_text(text)
    print(text, flush=True)
    for dtype in ("bf16", "fp16"):
        left = args.budget - (time.time() - start)
        if left < (45 if dtype == "bf16" else 60):
            text += f"\n{dtype}: fa-bench run not started ({left:.0f} s of the budget left)\n"
            continue
        text += "\n" + run.run_dtype(dtype, out, work, left - 5, args.max_time)
        report.write_text(text)
        print(text, flush=True)
    report.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
