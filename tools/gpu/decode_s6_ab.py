"""Issue 20, session 6: where batch 8 x 8k's and paged batch 64 x 128k's last 10% go.

For each shape, our kernel planned (fa_bench.kernels.decode_plan) at the heuristic's
launch and at candidate launches (split count, key block, stages, warps), each timed as
the whole call and, with splits, as the split kernel alone (the plan's first bound
launch), so the combine's share (its launch gap + its runtime) is the difference; SDPA
(the bench's adapter) beside them. Behind the reading L2 flush, median of the calls (CUDA
events per call).

    python tools/gpu/decode_s6_ab.py --json $OUT/ab.json > ab.md

32/8 heads, D 128, bf16, Sq 1, equal lengths. A development tool, not installed;
DEADLINE_S (env, default 60) stops it between candidates.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

from fa_bench import models
from fa_bench.case import Case

FLUSH_BYTES = 256 << 20
# (batch, context, page or 0) -> candidates (label, num_splits or None, DecodeConfig kw).
# Call B (89495bb) tried more: batch 8 x 8k s4 bn128 st2, s8 bn128 st2, s8 bn64 st3, s4
# bn32 st5 (paged) and batch 64 x 128k bn32 st4, bn64 st3 w8, bn128 st3 were 1-25% slower
# than the heuristic; docs/kernel.md ("Decoding", session 6) has the table.
SHAPES: dict[tuple[int, int, int], list[tuple[str, int | None, dict]]] = {
    # the heuristic combines by PDL since call B (2ce01d6); "no pdl" is the old launch.
    # Call C (d8c81b1) ran these with a paged rule (64-key blocks at 4 stages) that it
    # then measured slower, since reverted: the heuristic is 32-key blocks at 5 stages.
    (8, 8192, 0): [
        ("heuristic", None, {}),
        ("heuristic no pdl", None, {"pdl": False}),
        ("s4 bn64 st3", 4, {"block_n": 64, "num_stages": 3}),
        ("s6 bn64 st2", 6, {"block_n": 64, "num_stages": 2}),
    ],
    (64, 131072, 64): [
        ("heuristic", None, {}),
        ("bn64 st3", 1, {"block_n": 64, "num_stages": 3}),
        ("bn64 st4", 1, {"block_n": 64, "num_stages": 4}),
    ],
    (8, 8192, 64): [
        ("heuristic", None, {}),
        ("heuristic no pdl", None, {"pdl": False}),
        ("s8 bn64 st4", 8, {"block_n": 64, "num_stages": 4}),
        ("s8 bn64 st4 no pdl", 8, {"block_n": 64, "num_stages": 4, "pdl": False}),
    ],
    (64, 131072, 256): [
        ("heuristic", None, {}),
        ("bn64 st3", 1, {"block_n": 64, "num_stages": 3}),
        ("bn64 st4", 1, {"block_n": 64, "num_stages": 4}),
    ],
    (8, 8192, 256): [
        ("heuristic", None, {}),
        ("heuristic no pdl", None, {"pdl": False}),
        ("s8 bn64 st4", 8, {"block_n": 64, "num_stages": 4}),
        ("s8 bn64 st4 no pdl", 8, {"block_n": 64, "num_stages": 4, "pdl": False}),
    ],
    (8, 32768, 64): [
        ("heuristic", None, {}),
        ("s8 bn64 st4", 8, {"block_n": 64, "num_stages": 4}),
    ],
}


def _case(batch: int, ctx: int, page: int) -> Case:
    return Case(impl="triton", mode="decode", dtype="bf16", batch=batch, heads_q=32,
                heads_kv=8, seqlen_q=1, seqlen_k=ctx, head_dim=128, causal=True,
                page_size=page)  # fmt: skip


def _median_us(fn, flush, calls: int) -> float:
    events = []
    for _ in range(calls + 5):
        flush()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        events.append((start, end))
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in events[5:]) * 1e3


def _bench_median_us(fn) -> float:
    """The median as `fa-bench run --max-time 0.2 --warmup 200` measures it
    (fa_bench.run.timing.measure: its warm-up, its reading flush, its stopping rule): call
    A's fa-bench run read batch 8 x 8k 1.1-1.5 us slower than this tool, SDPA alike."""
    from fa_bench.run.timing import TimingConfig, measure

    cfg = TimingConfig(max_time_s=0.2, warmup_ms=200.0)
    return measure(fn, device=torch.device("cuda"), config=cfg).stats()["median"] * 1e3


def _caches(case: Case, q, k, v):
    from fa_bench.run.decode_inputs import paged_cache

    if case.page_size:
        return paged_cache(case, k, v)
    kc, vc = (t.transpose(1, 2).contiguous() for t in (k, v))
    return kc, vc, None


def _shape_rows(case: Case, candidates, flush, copy: float, deadline: float) -> list[dict]:
    from fa_bench import registry
    from fa_bench.kernels.decode_attention import DecodeConfig
    from fa_bench.kernels.decode_plan import plan_decode
    from fa_bench.run.execute import make_inputs

    q, k, v, _ = make_inputs(case, torch.device("cuda"))
    nbytes = models.decode_bytes(case)
    seqlens = torch.tensor(case.context_lengths(), dtype=torch.int32, device=q.device)
    calls = 200 if case.batch * case.seqlen_k <= 1 << 20 else 12
    rows = []
    sdpa = registry.get("sdpa").prepare(case, q, k, v)
    us = _median_us(lambda f=sdpa.fn, q=q, k=k, v=v: f(q, k, v), flush, calls)
    rows.append({"variant": "sdpa", "us": us, "gbps": nbytes / us / 1e3, "launch": sdpa.backend})
    del sdpa  # its dense copy: batch 64 x 128k holds 34 GB per copy of the cache
    kc, vc, table = _caches(case, q, k, v)
    del k, v
    torch.cuda.empty_cache()
    qk = q.transpose(1, 2)
    want = None
    for label, splits, kw in candidates:
        if time.monotonic() > deadline:
            print(f"deadline: stopped before {label}", file=sys.stderr)
            break
        plan = plan_decode(qk, kc, vc, cache_seqlens=seqlens, block_table=table,
                           num_splits=splits, config=DecodeConfig(**kw))  # fmt: skip
        o = plan.run().float()
        err = 0.0 if want is None else (o - want).abs().max().item()
        want = o if want is None else want
        us = _median_us(plan.run, flush, calls)
        ln = plan.launch
        row = {"variant": label, "us": us, "gbps": nbytes / us / 1e3, "max_diff": err,
               "launch": f"s{ln.num_splits} bn{ln.block_n} w{ln.num_warps} st{ln.num_stages}"
                         f"{' pdl' if plan.pdl else ''}",
               "bound": plan.bound_reason}  # fmt: skip
        if label == "heuristic":
            row["measure_us"] = _bench_median_us(plan.run)
        if plan.bound and ln.num_splits > 1:
            split_only = plan._bound[0]  # the split kernel's launch alone
            row["split_us"] = _median_us(split_only, flush, calls)
        rows.append(row)
    for r in rows:
        r.update(batch=case.batch, context=case.seqlen_k, page=case.page_size)
        r["copy"] = r["gbps"] / copy
    return rows


def _markdown(rows: list[dict], copy: float) -> list[str]:
    lines = [f"copy bandwidth: {copy:.0f} GB/s", "",
             "| shape | variant | launch | µs | split kernel alone µs | GB/s | ÷ copy | "
             "max diff vs first |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        cache = "contig" if r["page"] == 0 else f"page{r['page']}"
        shape = f"b{r['batch']} {r['context'] // 1024}k {cache}"
        split = f"{r['split_us']:.1f}" if "split_us" in r else "–"
        if "measure_us" in r:  # the heuristic's row: fa-bench's own timing beside it
            split += f"; timing.measure {r['measure_us']:.1f}"
        diff = f"{r['max_diff']:.2e}" if "max_diff" in r else "–"
        lines.append(f"| {shape} | {r['variant']} | {r['launch'][:60]} | {r['us']:.1f} | "
                     f"{split} | {r['gbps']:.0f} | {r['copy']:.3f} | {diff} |")  # fmt: skip
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="also write the rows here")
    parser.add_argument("--batch", type=int, help="only the shapes of this batch size")
    args = parser.parse_args(argv)
    sys.path.insert(0, os.path.dirname(__file__))
    from decode_fused_ab import copy_gbps

    from fa_bench import registry
    from fa_bench.run.timing import l2_flush

    deadline = time.monotonic() + float(os.environ.get("DEADLINE_S", "60"))
    registry.load()
    copy = copy_gbps()
    buf = torch.zeros(FLUSH_BYTES, dtype=torch.int8, device="cuda")
    flush = l2_flush(buf, "read")
    rows: list[dict] = []
    for shape, candidates in SHAPES.items():
        if args.batch is not None and shape[0] != args.batch:
            continue
        if time.monotonic() > deadline:
            print(f"deadline: stopped before {shape}", file=sys.stderr)
            break
        rows += _shape_rows(_case(*shape), candidates, flush, copy, deadline)
        torch.cuda.empty_cache()
        print(f"done {shape}", file=sys.stderr, flush=True)
        print("\n".join(_markdown(rows, copy)), file=sys.stderr, flush=True)
    print("\n".join(_markdown(rows, copy)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"copy_gbps": copy, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
