"""Issue 20, session 11: the deeper pipeline with half the splits (kernels/decode_config.py
`deeper`, $FA_BENCH_DECODE_DEEP) against the launch it replaces, on the shapes where it
changes the heuristic's launch.

Per shape (D 128, bf16, 8 KV heads, equal lengths; batch 8, where the rule changes the
launch, most wanted first: 8k at Sq 4, at 64/8 heads and in pages, which sat at 0.87-0.92
x copy in session 11's first two calls): our kernel planned at the heuristic's launch
with the rule off ("old") and on ("deep"), timed in turns (ROUNDS
rounds of a median of 200 calls behind the reading L2 flush, so drift between them hits
both), and SDPA once. The pick: the rule stays on if the geometric mean of old ÷ deep
time is at least 1.005 and no shape is more than 1.5% slower with it.

    DEADLINE_S=60 python tools/gpu/decode_s11_ab.py [--switch one-loop] --json ab.json > ab.md

`--switch one-loop`: the same for $FA_BENCH_DECODE_ONE_LOOP (one block loop at Sq > 1,
kernels/decode_rules.py), on Sq 4 shapes ("old" is the switch at 0, "deep" at 1). Prints
`pick: 0` or `pick: 1` last (the value for the switch's variable). `--smoke`: tiny
fp32 shapes on the CPU (the interpreter), so a test runs every path. A development tool,
not installed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import decode_s7_ab as s7
import torch

ROUNDS = 3
# (batch, heads_q, Sq, context, page; 0 = contiguous)
SHAPES = [
    (8, 32, 4, 8192, 64),
    (8, 32, 1, 8192, 64),
    (8, 32, 1, 8192, 256),
    (8, 32, 1, 8192, 0),
    (8, 32, 4, 8192, 0),
    (8, 64, 1, 8192, 64),
    (8, 64, 1, 8192, 0),
    (8, 32, 1, 8192, 16),
    (8, 64, 4, 8192, 64),
    (8, 32, 1, 32768, 64),
    (8, 32, 1, 32768, 0),
    (8, 32, 1, 131072, 0),
    (8, 32, 1, 1024, 64),
]
# one block loop at Sq > 1: batch 8 x 8k (fused merge), 32k, batch 1 (the combine kernel
# by rows), batch 64 (one split)
ONE_LOOP_SHAPES = [
    (8, 32, 4, 8192, 64),
    (8, 32, 4, 8192, 0),
    (8, 32, 4, 8192, 256),
    (8, 64, 4, 8192, 64),
    (8, 32, 4, 32768, 64),
    (1, 32, 4, 32768, 0),
    (64, 32, 4, 8192, 0),
]
SWITCHES = {"deep": "FA_BENCH_DECODE_DEEP", "one-loop": "FA_BENCH_DECODE_ONE_LOOP"}
ENV = {"name": SWITCHES["deep"]}
SMOKE_SHAPES = [(2, 16, 4, 200, 16), (2, 16, 4, 200, 0)]
GAIN, WORST = 1.005, 0.985


def _plan(inputs: tuple, env: str):
    from fa_bench.kernels.decode_plan import plan_decode

    q, _k, _v, kc, vc, table, seqlens = inputs
    os.environ[ENV["name"]] = env
    try:
        return plan_decode(q.transpose(1, 2), kc, vc, cache_seqlens=seqlens, block_table=table)
    finally:
        os.environ.pop(ENV["name"], None)


def shape_row(case, flush) -> dict:
    from fa_bench import models

    inputs = s7._inputs(case)
    calls = s7.RUN["calls"] if models.decode_bytes(case) < 2e9 else 12
    sdpa = s7._sdpa_row(case, *inputs[:3], flush, calls)
    inputs = (inputs[0], None, None, *inputs[3:])  # the dense copies dropped
    if s7.RUN["device"] == "cuda":
        torch.cuda.empty_cache()
    old, deep = _plan(inputs, "0"), _plan(inputs, "1")
    o_old, o_deep = old.run().float(), deep.run().float()
    times: dict[str, list[float]] = {"old": [], "deep": []}
    for _ in range(ROUNDS):
        times["old"].append(s7.median_us(old.run, flush, calls))
        times["deep"].append(s7.median_us(deep.run, flush, calls))
    return {
        "old": min(times["old"]), "deep": min(times["deep"]), "sdpa": sdpa["us"],
        "rounds": times, "launch_old": s7.launch_label(old), "launch_deep": s7.launch_label(deep),
        "max_diff": (o_old - o_deep).abs().max().item(),
        "same_launch": old.launch == deep.launch,
    }  # fmt: skip


def pick(rows: list[dict]) -> tuple[int, str]:
    """(1 if the rule stays on else 0, why) by old ÷ deep over the shapes it changed."""
    ratios = [r["old"] / r["deep"] for r in rows if not r["same_launch"]]
    if not ratios:
        return 0, "no shape measured where the rule changes the launch"
    gm = math.exp(sum(map(math.log, ratios)) / len(ratios))
    worst = min(ratios)
    ok = gm >= GAIN and worst >= WORST
    return int(ok), f"geometric mean {gm:.4f} (needs {GAIN}), worst {worst:.4f} (needs {WORST})"


def markdown(rows: list[dict], copy: float) -> str:
    lines = [
        f"copy bandwidth: {copy:.0f} GB/s; ${ENV['name']} 0 against 1",
        "",
        "| shape | launch at 0 | µs (÷ copy) | launch at 1 | µs (÷ copy) | 0 ÷ 1 | SDPA µs "
        "| max diff |",
        "|---" * 8 + "|",
    ]
    for r in rows:
        lines.append(
            f"| {r['shape']} | {r['launch_old']} | {r['old']:.1f} ({r['copy_old']:.3f}) | "
            f"{r['launch_deep']} | {r['deep']:.1f} ({r['copy_deep']:.3f}) | "
            f"{r['old'] / r['deep']:.3f} | {r['sdpa']:.1f} | {r['max_diff']:.1e} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="also write the rows here (after every shape)")
    parser.add_argument("--smoke", action="store_true", help="tiny fp32 shapes on the CPU")
    parser.add_argument("--switch", choices=sorted(SWITCHES), default="deep",
                        help="the rule to measure (default: deep)")  # fmt: skip
    args = parser.parse_args(argv)
    ENV["name"] = SWITCHES[args.switch]
    shapes = SHAPES if args.switch == "deep" else ONE_LOOP_SHAPES
    if args.smoke:
        shapes = SMOKE_SHAPES
    from fa_bench import models

    deadline, copy, flush = s7.harness(args.smoke)
    rows: list[dict] = []
    for shape in shapes:
        if time.monotonic() > deadline:
            print(f"deadline: stopped before {shape}", file=sys.stderr)
            break
        case = s7.case_of(*shape)
        row = shape_row(case, flush)
        nbytes = models.decode_bytes(case)
        cache = f"page{case.page_size}" if case.page_size else "contig"
        row.update(shape=f"b{case.batch} hq{case.heads_q} sq{case.seqlen_q} "
                         f"{case.seqlen_k // 1024}k {cache}",
                   copy_old=nbytes / row["old"] / 1e3 / copy,
                   copy_deep=nbytes / row["deep"] / 1e3 / copy)  # fmt: skip
        rows.append(row)
        if s7.RUN["device"] == "cuda":
            torch.cuda.empty_cache()
        print(markdown(rows, copy), file=sys.stderr, flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"copy_gbps": copy, "rows": rows}, f, indent=1)
    print(markdown(rows, copy))
    choice, why = pick(rows)
    print(f"\n{why}\npick: {choice}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
