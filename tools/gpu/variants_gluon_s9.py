"""Issue 19's variant forward on the H200, session 9 (SC): fp16 softcap 50 with and without
the threshold rescale (flash_gluon_varhost.SOFTCAP_LAZY_FP16, the LAZY bit) beside the
dense kernel, on both launches.

    python tools/gpu/variants_gluon_s9.py [--budget S] [--workers N]

Rows (`ROWS`): fp16 softcap 50, causal, head_dim 128, 32 query / 8 KV heads, 8 × 8k and
2 × 32k. Each row times, through tools/gpu/variants_gluon_s8.py's plumbing (flash_attention
with FlashConfig(forward="gluon"), do_bench with L2 flushed, each twice in turn): c2 (the
two-consumer 128-key launch), c2l (c2 + LAZY: the warpgroup's `if`), c2w (c2 + LAZY +
LAZY_WARP: a vote per warp, the skip inside PTX), c3, c3l, c3w (the same on C3_N64, the
committed fp16 softcap launch) and the dense Gluon kernel of the same shape; TFLOP/s over
the attended pairs, each ÷ dense, each LAZY form ÷ its launch without, the backend labels,
and max |o − o_c3| of the LAZY launches (a smoke check; the GPU tests,
tests/test_flash_gluon_var_s9_gpu.py, apply the accuracy rule). Writes
$OUT/variants_gluon_s9_speed.{md,json} as it goes and prints which forms beat their launch
by variants_gluon_s8.PICK_MARGIN in the geometric mean. `--best SPEED_JSON` prints the
$FA_BENCH_SOFTCAP_LAZY value of the faster form on C3_N64 ("1" or "warp").

A developer tool, not installed.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import math
import multiprocessing as mp
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import variants_gluon_s8 as s8

# (kind, batch, N, dtype)
ROWS: tuple[tuple[str, int, int, str], ...] = (
    ("softcap", 8, 8192, "fp16"),
    ("softcap", 2, 32768, "fp16"),
)
LAUNCHES = ("c2", "c2l", "c2w", "c3", "c3l", "c3w")
PAIRS = (("c3l", "c3"), ("c3w", "c3"), ("c2l", "c2"), ("c2w", "c2"))  # (with LAZY, without)
if os.environ.get("S10"):  # session 10: the sum check (c3s), with Q scaled (c3sq), with
    # every 4th / 8th exponential on the FMA pipes (c3s4, c3s8; call 5), with tree sums (c3st;
    # call 6), with a 3- / 2-deep K/V ring (c3s3, c3s2; call 7), with P rounded before the
    # check (c3se)
    LAUNCHES = ("c3", "c3s", "c3se")
    PAIRS = (("c3s", "c3"), ("c3se", "c3"))


def warm(workers: int) -> None:
    """Compile every (launch, dtype) and the dense kernel in worker processes."""
    jobs = sorted({(name, kind, d) for kind, _b, _n, d in ROWS for name in LAUNCHES})
    jobs += sorted({("dense", kind, d) for kind, _b, _n, d in ROWS})
    ctx = mp.get_context("spawn")
    with cf.ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
        for done in pool.map(s8._warm, jobs):
            print(f"compiled {done}", flush=True)


def row(kind: str, b: int, n: int, dname: str) -> dict:
    """One shape: TFLOP/s of each launch and the dense control, the ratios, the labels."""
    q, k, v, kw, pairs, ctrl, ctrl_pairs = s8._inputs(kind, b, n, s8.DTYPES[dname])
    fns, outs, labels = {}, {}, {}
    for name in LAUNCHES:
        with s8.launch(name):
            labels[name] = s8._label(kind, q, k, v, kw)
            outs[name] = s8._fn(kind, q, k, v, kw)().float()
        fns[name] = s8._switched(name, s8._fn(kind, q, k, v, kw))
    fns["dense"] = s8._dense(*ctrl)
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(2):
        for name, fn in fns.items():
            times[name].append(s8._bench(fn))
    flops = {name: 4.0 * (ctrl_pairs if name == "dense" else pairs) * s8.D * s8.HQ
             for name in fns}  # fmt: skip
    tf = {name: flops[name] / (sum(t) / len(t)) / 1e9 for name, t in times.items()}
    out = dict(kind=kind, dtype=dname, shape=f"{b} x {n}", tflops=tf, labels=labels,
               over_dense={name: tf[name] / tf["dense"] for name in LAUNCHES},
               ms={name: sum(t) / len(t) for name, t in times.items()})  # fmt: skip
    for lazy, base in PAIRS:
        out[f"{lazy}_over_{base}"] = tf[lazy] / tf[base]
        out[f"max_diff_{lazy}"] = (outs[lazy] - outs["c3"]).abs().max().item()
    return out


def md(rows: list[dict]) -> str:
    head = " | ".join(f"{n} TFLOP/s (÷ dense)" for n in LAUNCHES)
    ratios = " | ".join(f"{a} ÷ {b}" for a, b in PAIRS)
    lines = [
        f"| shape | {head} | dense | {ratios} | max diff {' / '.join(a for a, _ in PAIRS)} "
        f"| labels {LAUNCHES[-1]} |",
        "|---" * (len(LAUNCHES) + len(PAIRS) + 4) + "|",
    ]
    for r in rows:
        cells = " | ".join(f"{r['tflops'][n]:.1f} ({r['over_dense'][n]:.3f})" for n in LAUNCHES)
        rs = " | ".join(f"{r[f'{a}_over_{b}']:.3f}" for a, b in PAIRS)
        diffs = " / ".join(f"{r[f'max_diff_{a}']:.1e}" for a, _ in PAIRS)
        lines.append(
            f"| {r['dtype']} softcap {r['shape']} | {cells} | {r['tflops']['dense']:.1f} | "
            f"{rs} | {diffs} | {r['labels'][LAUNCHES[-1]]} |"
        )
    return "\n".join(lines) + "\n"


def verdict(rows: list[dict], lazy: str = "c3l", base: str = "c3") -> bool | None:
    """Whether `lazy` beat `base` by s8.PICK_MARGIN in the geometric mean (None: no rows)."""
    rs = [r[f"{lazy}_over_{base}"] for r in rows if f"{lazy}_over_{base}" in r]
    if not rs:
        return None
    return math.exp(sum(math.log(x) for x in rs) / len(rs)) >= 1 + s8.PICK_MARGIN


def best_form(rows: list[dict]) -> str:
    """$FA_BENCH_SOFTCAP_LAZY for the faster form on C3_N64 by the rows' geometric means:
    "warp" (c3w) or "1" (c3l); "warp" without rows (fewer instructions in the SASS)."""

    def gm(key: str) -> float:
        xs = [r[key] for r in rows if key in r]
        return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else math.nan

    lazy, warp = gm("c3l_over_c3"), gm("c3w_over_c3")
    return "1" if lazy > warp else "warp"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, default=60.0, help="seconds to stop timing")
    ap.add_argument("--workers", type=int, default=8, help="compile processes")
    ap.add_argument("--best", metavar="SPEED_JSON", help="print best_form of these rows, exit")
    args = ap.parse_args()
    if args.best:
        rows = json.loads(open(args.best).read()) if os.path.exists(args.best) else []
        print(best_form(rows))
        return 0
    import torch

    deadline = time.time() + args.budget  # from the start: compiling counts too
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}", flush=True)
    warm(args.workers)
    rows: list[dict] = []
    for kind, b, n, dname in ROWS:
        if time.time() > deadline:
            print(f"time budget spent before {kind} {dname} {b} x {n}", flush=True)
            break
        rows.append(row(kind, b, n, dname))
        print(json.dumps(rows[-1]), flush=True)
        with open(s8._out("variants_gluon_s9_speed.md"), "w") as f:
            f.write(md(rows))
        with open(s8._out("variants_gluon_s9_speed.json"), "w") as f:
            json.dump(rows, f, indent=1)
    print(md(rows), flush=True)
    for lazy, base in PAIRS:
        print(f"{lazy} ÷ {base} ≥ {1 + s8.PICK_MARGIN}: {verdict(rows, lazy, base)} "
              "(None: not timed)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
