"""Issue 19's variants in the Gluon forward on the H200: correctness, then speed.

1. Correctness: every variant and combination through `flash_attention(...,
   config=FlashConfig(forward="gluon"))` / `flash_attention_varlen` (the dispatch forced
   to the Gluon kernel) against the float64 reference (fa_bench.run.variant_reference)
   under the accuracy rule (o), the lse's empty rows and values, and our `tl` backward
   run on the Gluon forward's (o, lse2) (gradients under the rule); bf16/fp16,
   head_dim 64/128, GQA, Sq ≠ Sk, rows without keys, packed sequences of length 1.
2. Speed: forward TFLOP/s over the attended pairs (fa_bench.variants.window_pairs;
   triton.testing.do_bench, L2 flushed), bf16, 32 query / 8 KV heads, head_dim 128: a 4k
   window causal at 2 × 32k, softcap 50 and ALiBi causal at 8 × 8k, a packed 16k-token
   batch (uniform:256-3840, the variants suite's) against 8 × 2048 equal sequences;
   each as the Gluon variant kernel ("gluon"), our `tl` variant kernel ("tl"), and
   beside the dense Gluon kernel of the same shape; flex (torch.compile'd
   flex_attention with a block mask) unless --no-flex or the time budget is spent.

    python tools/gpu/variants_gluon.py [--no-flex] [--budget 100]

Writes $OUT/variants_gluon.md and .json (OUT defaults to fa-bench-out/out). A developer
tool, not installed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Iterator

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # its sibling modules
from variants_gluon_checks import (
    DEV_MODES,
    _cases,
    _check_row,
    _dev_cases,
    correctness,
)
from variants_gluon_speed import N_MAIN, N_SPECS


def _job(job: tuple) -> dict | None:
    """One job of a worker process: ("check", dtypes, dev, i) runs the i-th check and
    returns its row; ("warm", i) runs speed row i once (compiling it into triton's
    on-disk cache for the timing process) and returns None."""
    if job[0] == "warm":
        import variants_gluon_speed as sp

        sp.WARM = True
        try:  # a failure here shows again, as a row, when the main process times it
            for _row in sp.speed(job[2], math.inf, only=job[1]):  # job[2]: flex too
                pass
        except Exception as e:
            print(f"warm-up of speed row {job[1]}: {type(e).__name__}: {e}", flush=True)
        return None
    _kind, dtypes, dev, i = job
    return _check_row(*(_cases(dtypes) + _dev_cases(dtypes, dev))[i])


def _indexed(item: tuple[int, tuple]) -> tuple[int, dict | None]:
    return item[0], _job(item[1])


def parallel(
    dtypes: tuple[str, ...],
    dev: list[str],
    warm: bool,
    workers: int,
    flex: bool = False,
    deadline: float = math.inf,
    out_dir: str = "",
    rows: int = N_SPECS,
) -> list[dict]:
    """The checks (and the speed rows' compiles, flex's too with `flex`: torch.compile's
    caches then serve the timing process) in `workers` spawned processes, each with its
    own CUDA context: compiling dominates, and triton compiles one kernel per core. Rows
    are written as they come; a check still running at `deadline` (a hang?) is a failed
    row saying so, and the pool is ended."""
    import multiprocessing as mp

    cases = _cases(dtypes) + _dev_cases(dtypes, dev)
    jobs: list[tuple] = [("warm", i, flex) for i in range(rows)] if warm else []
    jobs += [("check", dtypes, dev, i) for i in range(len(cases))]
    done: dict[int, dict] = {}
    pool = mp.get_context("spawn").Pool(workers)
    try:
        results = pool.imap_unordered(_indexed, list(enumerate(jobs)), chunksize=1)
        for _ in jobs:
            try:
                i, row = results.next(timeout=max(1.0, deadline - time.time()))
            except mp.TimeoutError:
                break
            if row is not None:
                done[i] = row
                if out_dir:
                    _write(out_dir, [done[k] for k in sorted(done)], [])
    finally:
        pool.terminate()
    first = len(jobs) - len(cases)
    for i in range(first, len(jobs)):
        if i not in done:
            why = "did not finish within the checks' time budget (a hang, or slow compiles)"
            done[i] = {"check": cases[i - first][0], "passed": False, "error": why}
    return [done[k] for k in sorted(done)]


def _time_row(i: int, flex: bool) -> dict:
    """Speed row i, timed in a worker process (see timed_rows)."""
    import variants_gluon_speed as sp

    return next(iter(sp.speed(flex, math.inf, only=i)))


def timed_rows(
    flex: bool, row_timeout: float, deadline: float, rows: int = N_SPECS, first: int = 0
) -> Iterator[dict]:
    """The speed rows one at a time in one spawned worker (the GPU to itself), each
    given `row_timeout` seconds: a row that hangs is an error row and its worker is
    replaced; rows not started by `deadline` are skipped."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    pool = ctx.Pool(1)
    try:
        for i in range(first, rows):
            if time.time() > deadline:
                yield {"variant": f"row {i}", "shape": "", "gluon": "skipped: time budget"}
                continue
            try:
                yield pool.apply_async(_time_row, (i, flex)).get(timeout=row_timeout)
            except mp.TimeoutError:
                why = f"timed out ({row_timeout:.0f} s)"
                yield {"variant": f"row {i}", "shape": "", "gluon": why}
                pool.terminate()
                pool = ctx.Pool(1)
            except Exception as e:  # the worker's exception: a result here
                why = f"error {type(e).__name__}: {str(e)[:160]}"
                yield {"variant": f"row {i}", "shape": "", "gluon": why}
    finally:
        pool.terminate()


def _is_dev(check: dict) -> bool:
    """A development mode's check: its name ends with " [mode]"."""
    return any(check["check"].endswith(f" [{mode}]") for mode in DEV_MODES)


def _fmt(x) -> str:
    return f"{x:.1f}" if isinstance(x, float) else str(x if x is not None else "")


def _ratio(row: dict, a: str, b: str) -> str:
    x, y = row.get(a), row.get(b)
    return f"{x / y:.3f}" if isinstance(x, float) and isinstance(y, float) else ""


def report(checks: list[dict], rows: list[dict]) -> str:
    import triton

    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    dev = [c for c in checks if _is_dev(c)]
    main = [c for c in checks if c not in dev]
    out = [
        f"# Gluon forward variants ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})",
        "",
        f"{gpu}, torch {torch.__version__}, triton {triton.__version__}",
        "",
        f"## Correctness: {sum(c['passed'] for c in main)} / {len(main)} passed",
        "",
    ]
    if dev:
        passed = sum(c["passed"] for c in dev)
        out += [f"Development modes (not the default): {passed} / {len(dev)} passed", ""]
    for c in checks:
        if not c["passed"]:
            why = c.get("error") or json.dumps(c["detail"])[:600]
            out.append(f"- FAIL {c['check']}: {why}")
    out += [
        "",
        "## Forward TFLOP/s (attended pairs; bf16, 32/8 heads, D 128)",
        "",
        "| variant | B x N | gluon | tl | dense gluon | flex | gluon / dense | gluon / tl "
        "| gluon / flex |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        cells = [_fmt(r.get(c)) for c in ("gluon", "tl", "dense gluon", "flex")]
        cells += [_ratio(r, "gluon", c) for c in ("dense gluon", "tl", "flex")]
        out.append(f"| {r['variant']} | {r['shape']} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def _write(out_dir: str, checks: list[dict], rows: list[dict]) -> None:
    with open(os.path.join(out_dir, "variants_gluon.json"), "w") as f:
        json.dump({"checks": checks, "speed": rows}, f, indent=1, default=str)
    with open(os.path.join(out_dir, "variants_gluon.md"), "w") as f:
        f.write(report(checks, rows))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-flex", action="store_true", help="skip flex_attention")
    ap.add_argument(
        "--budget",
        type=float,
        default=180.0,
        help="seconds in all: the checks get 55%%, no speed row starts after it",
    )
    ap.add_argument("--no-dev-rows", action="store_true", help="time the four target rows only")
    ap.add_argument("--rows", type=int, default=0, help="time the first N speed rows (0: all)")
    ap.add_argument("--row-timeout", type=float, default=45.0, help="seconds per speed row")
    ap.add_argument("--checks-only", action="store_true")
    ap.add_argument("--speed-only", action="store_true", help="no checks: the speed rows only")
    ap.add_argument("--from-row", type=int, default=0, help="time the speed rows from this one")
    ap.add_argument(
        "--workers",
        type=int,
        default=min(8, os.cpu_count() or 1),
        help="processes for the checks and the speed rows' compiles (1: all in this one)",
    )
    ap.add_argument(  # an older command line's spelling of --dev "tanh f16x2"
        "--f16x2", action="store_true", help='the same as --dev "tanh f16x2"'
    )
    ap.add_argument(
        "--dev",
        default="",
        help=f"also the softcap checks in these development modes ({', '.join(DEV_MODES)})",
    )
    ap.add_argument(
        "--dtypes", default="bf16,fp16", help="the checks' dtypes (each compiles its kernels)"
    )
    args = ap.parse_args()
    start = time.time()
    out_dir = os.environ.get("OUT", "fa-bench-out/out")
    os.makedirs(out_dir, exist_ok=True)
    dev = [m for m in args.dev.split(",") if m]
    if args.f16x2 and "tanh f16x2" not in dev:
        dev.append("tanh f16x2")
    unknown = [m for m in dev if m not in DEV_MODES]
    if unknown:
        ap.error(f"--dev {','.join(unknown)}: expected some of {', '.join(DEV_MODES)}")
    dtypes = tuple(args.dtypes.split(","))
    flex = not args.no_flex
    n_rows = N_MAIN if args.no_dev_rows else (args.rows or N_SPECS)
    if args.speed_only:
        checks: list[dict] = []
    elif args.workers > 1:
        checks = parallel(dtypes, dev, not args.checks_only, args.workers, flex,
                          start + 0.55 * args.budget, out_dir, n_rows)  # fmt: skip
    else:
        checks = correctness(dtypes, dev)
    print(f"checks: {time.time() - start:.0f} s", flush=True)
    _write(out_dir, checks, [])  # the checks survive a later crash or timeout
    rows: list[dict] = []
    if not args.checks_only:
        for row in timed_rows(flex, args.row_timeout, start + args.budget, n_rows, args.from_row):
            print(row, flush=True)
            rows.append(row)
            _write(out_dir, checks, rows)
    print(report(checks, rows))
    print(f"total {time.time() - start:.0f} s")
    return 0 if all(c["passed"] for c in checks if not _is_dev(c)) else 1


if __name__ == "__main__":
    sys.exit(main())
