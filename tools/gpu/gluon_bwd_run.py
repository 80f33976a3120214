"""Issue 18's benchmark through `fa-bench run` (the final call): the standard suite's
backward at 4k and 16k for `triton` (the two-kernel backward), `triton-onepass` (the
one-pass backward: the Gluon kernel on sm_90 where it runs) and `sdpa-cudnn`, bf16 then
fp16 as time allows, each dtype's table (TFLOP/s, ÷ cuDNN, NVML tensor %, the backend
that ran) from tools/gpu/issue18_summary.py.

    python tools/gpu/gluon_bwd_run.py [--budget 200] [--max-time 1.0]

Writes under $OUT: gluon_bwd_run.md (the tables), results-<dtype>.json, run-<dtype>.log.
Each `fa-bench run` gets what is left of the budget; a dtype that does not finish is
reported. Needs CUDA; a developer tool, not installed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
IMPLS = ("triton", "triton-onepass", "sdpa-cudnn")


def _from_journal(folder: Path) -> Path | None:
    """A results-like document from a cut-short run's journal (one record a line)."""
    journal = folder / "journal.jsonl"
    if not journal.exists():
        return None
    cases = []
    for line in journal.read_text().splitlines():
        try:
            cases.append(json.loads(line))
        except ValueError:  # a line cut by the kill
            continue
    path = folder / "results-partial.json"
    path.write_text(json.dumps({"cases": cases, "env": {}}))
    return path


def run_dtype(dtype: str, out: Path, work: Path, timeout: float, max_time: float,
              impls: tuple[str, ...] = IMPLS) -> str:  # fmt: skip
    """One `fa-bench run` of the backward; the summary table or why there is none."""
    folder = work / f"run-{dtype}"
    shutil.rmtree(folder, ignore_errors=True)
    cmd = ["fa-bench", "run", "-s", "standard", "--mode", "bwd", "--seqlen", "4096,16384",
           "--dtype", dtype, "--tuning-cache", "off", "--no-report", "--max-time",
           str(max_time), "--out", str(folder)]  # fmt: skip
    for impl in impls:
        cmd += ["-i", impl]
    log = out / f"run-{dtype}.log"
    try:
        with open(log, "w") as f:
            done = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=timeout)
        status = f"exit {done.returncode}"
    except subprocess.TimeoutExpired:
        status = f"killed after {timeout:.0f} s"
    results = folder / "results.json"
    if not results.exists():  # cut short: the cases the journal has
        results = _from_journal(folder)
        if results is None:
            return f"{dtype}: no results ({status}; see run-{dtype}.log)\n"
        status += ", cut short: the journal's cases"
    shutil.copy(results, out / f"results-{dtype}.json")
    table = subprocess.run(
        [sys.executable, str(HERE / "issue18_summary.py"), str(results)],
        capture_output=True,
        text=True,
    )
    return f"## {dtype} ({status})\n\n{table.stdout}\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, default=200.0, help="seconds for both dtypes")
    ap.add_argument("--max-time", type=float, default=1.0, help="fa-bench's --max-time")
    ap.add_argument("--dtypes", default="bf16,fp16")
    ap.add_argument("--impls", default=",".join(IMPLS), help="fa-bench run's -i, in order")
    ap.add_argument("--md", default="gluon_bwd_run.md", help="the tables' file under $OUT")
    args = ap.parse_args()
    out = Path(os.environ.get("OUT", "fa-bench-out/out"))
    out.mkdir(parents=True, exist_ok=True)
    work = Path("fa-bench-out/gluon-bwd-run")
    work.mkdir(parents=True, exist_ok=True)
    start = time.time()
    parts = ["# Issue 18 through fa-bench run\n"]
    for dtype in args.dtypes.split(","):
        left = args.budget - (time.time() - start)
        if left < 30:
            parts.append(f"{dtype}: not run (budget)\n")
            continue
        impls = tuple(args.impls.split(","))
        parts.append(run_dtype(dtype, out, work, left, args.max_time, impls))
    text = "\n".join(parts)
    (out / args.md).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
