"""Issue 20, session 7: batch 8 x 8k's launches at Sq 4 and at 64/8 heads, and what a
shuffled block table costs.

Per shape (Llama-3-8B-like 32/8 heads or 70B-like 64/8, D 128, bf16, equal lengths):
SDPA (the bench's adapter, its dense copy made outside the timed span), then our kernel
planned (fa_bench.kernels.decode_plan) at the heuristic's launch (also timed as its split
kernel alone, so the combine's share is the difference) and at candidate launches (split
count, key block, stages, warps, one block loop, no PDL). Behind the reading L2 flush,
median of 200 calls (12 for caches over 2 GB), CUDA events per call; each candidate's
max |o - o_heuristic| is listed (a wrong launch shows there, the GPU tests check them
against the float64 reference). `--order` shapes (paged): ours on the suite's shuffled
block table beside an ordered one (the same pages in sequence order), SDPA beside.

    DEADLINE_S=60 python tools/gpu/decode_s7_ab.py --json $OUT/ab.json > ab.md

A development tool, not installed; DEADLINE_S (env, default 60) stops it between
candidates. `--smoke`: tiny fp32 shapes on the CPU (the Triton interpreter, wall-clock
timing), so a test runs every path of the tool without a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable

import decode_ab
import torch

from fa_bench import models
from fa_bench.case import Case

FLUSH_BYTES = 256 << 20
# --smoke: the device, dtype and call count (main sets them)
RUN = {"device": "cuda", "dtype": "bf16", "calls": 200}

Cand = tuple[str, int | None, dict]
# the candidates also timed as their split kernel alone (the plan's first bound launch;
# decode_s8_ab.py adds its explicit two-kernel `rows`)
SPLIT_ALONE = {"heuristic"}
# contiguous (heuristic at batch 8 x 8k: 8 splits, 64-key blocks, 2 stages)
CONTIG: list[Cand] = [
    ("heuristic", None, {}),
    ("one loop", None, {"one_loop": True}),
    # few programs, deep pipelines: 64 or 128 programs of 5-6 blocks in flight (one per
    # SM), so no or a 2-way combine
    ("s2 bn64 st6", 2, {"block_n": 64, "num_stages": 6}),
    ("s1 bn64 st7", 1, {"block_n": 64, "num_stages": 7}),
    ("s2 bn128 st4", 2, {"block_n": 128, "num_stages": 4}),
    ("s4 bn64 st4", 4, {"block_n": 64, "num_stages": 4}),
    ("s4 bn64 st3", 4, {"block_n": 64, "num_stages": 3}),
    ("s12 bn64 st2", 12, {"block_n": 64, "num_stages": 2}),
    ("s16 bn64 st2", 16, {"block_n": 64, "num_stages": 2}),
    ("s8 bn32 st3", 8, {"block_n": 32, "num_stages": 3}),
    ("heuristic no pdl", None, {"pdl": False}),
]
# paged (heuristic at batch 8 x 8k: 8 splits, 32-key blocks, 5 stages)
PAGED: list[Cand] = [
    ("heuristic", None, {}),
    ("one loop", None, {"one_loop": True}),
    ("s8 bn64 st4", 8, {"block_n": 64, "num_stages": 4}),
    ("s8 bn64 st4 one loop", 8, {"block_n": 64, "num_stages": 4, "one_loop": True}),
    # few programs, deep pipelines (triton 3.6's pipeliner, sm_90: 3 paged 64-key blocks
    # in flight at 7 and 8 stages, 104 KB of shared memory, 2 programs per SM)
    ("s2 bn64 st8", 2, {"block_n": 64, "num_stages": 8}),
    ("s4 bn64 st7", 4, {"block_n": 64, "num_stages": 7}),
    ("s4 bn64 st5", 4, {"block_n": 64, "num_stages": 5}),
    ("s12 bn32 st5", 12, {"block_n": 32, "num_stages": 5}),
    ("s16 bn32 st5", 16, {"block_n": 32, "num_stages": 5}),
    ("s8 bn32 st4", 8, {"block_n": 32, "num_stages": 4}),
    ("heuristic no pdl", None, {"pdl": False}),
]
NEIGHBOUR: list[Cand] = [
    ("heuristic", None, {}),
    ("one loop", None, {"one_loop": True}),
]
# (batch, heads_q, seqlen_q, context, page or 0, candidates), most wanted first: the
# three cases below 0.9 x copy in call 0, the borderline ones, then the neighbours
DEEP = [c for c in CONTIG if c[0] in ("heuristic", "s2 bn64 st6", "s1 bn64 st7", "s4 bn64 st4")]
Shape = tuple  # (batch, heads_q, seqlen_q, context, page or 0[, ctx_spread])
SHAPES: list[tuple[Shape, list[Cand]]] = [
    ((8, 32, 4, 8192, 64), PAGED),
    ((8, 32, 4, 8192, 0), CONTIG),
    ((8, 64, 1, 8192, 64), PAGED),
    ((8, 32, 1, 8192, 0), CONTIG),
    ((8, 32, 1, 8192, 64), PAGED),
    ((8, 64, 1, 8192, 0), CONTIG),
    ((8, 32, 1, 8192, 256), PAGED[:3]),
    ((8, 32, 1, 32768, 64), [*NEIGHBOUR, PAGED[2]]),
    # what a few-program launch would cost where the lengths are ragged (splits are
    # chosen against the capacity) and at the next context
    ((8, 32, 1, 8192, 0, 0.25), DEEP),
    ((8, 32, 1, 32768, 0), DEEP),
    ((64, 32, 1, 8192, 0), NEIGHBOUR),
    ((64, 32, 1, 8192, 64), NEIGHBOUR),
]
# peer exceptions of target 3: shuffled against ordered block tables
ORDER_SHAPES: list[tuple[int, int, int, int, int]] = [
    (64, 32, 1, 32768, 64),
    (8, 32, 1, 131072, 64),
    (64, 32, 1, 32768, 16),
    (256, 32, 1, 8192, 16),
]
SMOKE_SHAPES = [((2, 16, 4, 160, 16), PAGED[:3]), ((2, 16, 1, 160, 0, 0.5), [CONTIG[0], CONTIG[8]])]
SMOKE_ORDER_SHAPES = [(2, 16, 1, 128, 16)]


def case_of(batch: int, hq: int, sq: int, ctx: int, page: int, spread: float = 1.0) -> Case:
    return Case(impl="triton", mode="decode", dtype=RUN["dtype"], batch=batch, heads_q=hq,
                heads_kv=8, seqlen_q=sq, seqlen_k=ctx, head_dim=128, causal=True,
                page_size=page, ctx_spread=spread)  # fmt: skip


def copy_gbps() -> float:
    """The run's copy bandwidth as decode_ab.py measures it (read + write of 1 GiB)."""
    if RUN["device"] != "cuda":
        return 1.0
    return decode_ab.copy_gbps()


def median_us(fn, flush, calls: int) -> float:
    if RUN["device"] != "cuda":  # --smoke: wall clock
        times = []
        for _ in range(calls):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return statistics.median(times) * 1e6
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


def launch_label(plan) -> str:
    ln = plan.launch
    extra = (" pdl" if plan.pdl else "") + (" one-loop" if ln.one_loop else "")
    return f"s{ln.num_splits} bn{ln.block_n} w{ln.num_warps} st{ln.num_stages}{extra}"


def _dense(q, k, v):
    return q.transpose(1, 2), k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()


def _inputs(case: Case):
    """q (B, Sq, Hq, D), the suite's caches (shuffled pages when paged), lengths; and
    the dense (B, Hkv, S, D) k, v for SDPA (the caller drops them)."""
    from fa_bench.run.decode_inputs import paged_cache
    from fa_bench.run.execute import make_inputs

    q, k, v, _ = make_inputs(case, torch.device(RUN["device"]))
    seqlens = torch.tensor(case.context_lengths(), dtype=torch.int32, device=q.device)
    if case.page_size:
        kc, vc, table = paged_cache(case, k, v)
    else:
        _, kc, vc = _dense(q, k, v)
        table = None
    return q, k, v, kc, vc, table, seqlens


def _sdpa_row(case: Case, q, k, v, flush, calls: int) -> dict:
    from fa_bench import registry

    sdpa = registry.get("sdpa").prepare(case, q, k, v)
    us = median_us(lambda f=sdpa.fn: f(q, k, v), flush, calls)
    return {"variant": "sdpa", "us": us, "launch": str(sdpa.backend)[:60]}


def shape_rows(case: Case, candidates: list[Cand], flush, deadline: float) -> list[dict]:
    from fa_bench.kernels.decode_attention import DecodeConfig
    from fa_bench.kernels.decode_plan import plan_decode

    q, k, v, kc, vc, table, seqlens = _inputs(case)
    calls = RUN["calls"] if models.decode_bytes(case) < 2e9 else 12
    rows = [_sdpa_row(case, q, k, v, flush, calls)]
    del k, v
    torch.cuda.empty_cache()
    qk = q.transpose(1, 2)
    want = None
    for label, splits, kw in candidates:
        if time.monotonic() > deadline:
            print(f"deadline: stopped before {label}", file=sys.stderr)
            break
        try:
            plan = plan_decode(qk, kc, vc, cache_seqlens=seqlens, block_table=table,
                               num_splits=splits, config=DecodeConfig(**kw))  # fmt: skip
            o = plan.run().float()
        except Exception as exc:  # e.g. out of shared memory: the next candidate
            print(f"{label}: {type(exc).__name__}: {str(exc)[:300]}", file=sys.stderr)
            continue
        err = 0.0 if want is None else (o - want).abs().max().item()
        want = o if want is None else want
        row = {"variant": label, "us": median_us(plan.run, flush, calls), "max_diff": err,
               "launch": launch_label(plan), "bound": plan.bound_reason}  # fmt: skip
        if label in SPLIT_ALONE and plan.bound and plan.launch.num_splits > 1:
            row["split_us"] = median_us(plan._bound[0], flush, calls)  # split kernel alone
        rows.append(row)
    return rows


def order_rows(case: Case, flush, deadline: float) -> list[dict]:
    """SDPA, ours on the suite's shuffled table, ours on an ordered table."""
    from fa_bench.kernels.decode_plan import plan_decode

    q, k, v, kc, vc, table, seqlens = _inputs(case)
    calls = RUN["calls"] if models.decode_bytes(case) < 2e9 else 12
    rows = [_sdpa_row(case, q, k, v, flush, calls)]
    _, kd, vd = _dense(q, k, v)  # (B, S, Hkv, D): consecutive pages in sequence order
    del k, v
    size = case.page_size
    pages = case.batch * case.seqlen_k // size
    ordered = torch.arange(pages, dtype=torch.int32, device=q.device).view(case.batch, -1)
    kd, vd = (t.view(pages, size, *t.shape[2:]) for t in (kd, vd))
    qk = q.transpose(1, 2)
    want = None
    for label, kp, vp, tb in (
        ("shuffled table", kc, vc, table),
        ("ordered table", kd, vd, ordered),
    ):
        if time.monotonic() > deadline:
            break
        plan = plan_decode(qk, kp, vp, cache_seqlens=seqlens, block_table=tb)
        o = plan.run().float()
        want = o if want is None else want  # the same pages, the same sums: the same bits
        rows.append({"variant": label, "us": median_us(plan.run, flush, calls),
                     "max_diff": (o - want).abs().max().item(),
                     "launch": launch_label(plan), "bound": plan.bound_reason})  # fmt: skip
    return rows


def markdown(rows: list[dict], copy: float) -> list[str]:
    head = (
        "| shape | variant | launch | µs | split kernel alone µs | GB/s | ÷ copy | "
        "÷ sdpa | max diff vs heuristic |"
    )
    lines = [f"copy bandwidth: {copy:.0f} GB/s", "", head, "|---" * 9 + "|"]
    for r in rows:
        split = f"{r['split_us']:.1f}" if "split_us" in r else "–"
        diff = f"{r['max_diff']:.2e}" if "max_diff" in r else "–"
        lines.append(f"| {r['shape']} | {r['variant']} | {r['launch']} | {r['us']:.1f} | "
                     f"{split} | {r['gbps']:.0f} | {r['copy']:.3f} | {r['vs_sdpa']:.3f} | "
                     f"{diff} |")  # fmt: skip
    return lines


def _annotate(rows: list[dict], case: Case, copy: float) -> None:
    nbytes = models.decode_bytes(case)
    cache = f"page{case.page_size}" if case.page_size else "contig"
    ragged = f" ragged {case.ctx_spread}" if case.ctx_spread < 1 else ""
    shape = (
        f"b{case.batch} hq{case.heads_q} sq{case.seqlen_q} {case.seqlen_k // 1024}k {cache}{ragged}"
    )
    sdpa_us = rows[0]["us"]
    for r in rows:
        r.update(shape=shape, gbps=nbytes / r["us"] / 1e3, vs_sdpa=sdpa_us / r["us"])
        r["copy"] = r["gbps"] / copy


def harness(smoke: bool) -> tuple[float, float, Callable[[], None]]:
    """(deadline, copy bandwidth in GB/s, the reading L2 flush) for an A/B tool's run, after
    loading the registry; `smoke` first sets the CPU's tiny fp32 run (the interpreter)."""
    from fa_bench import registry
    from fa_bench.run.timing import l2_flush

    if smoke:
        RUN.update(device="cpu", dtype="fp32", calls=2)
    deadline = time.monotonic() + float(os.environ.get("DEADLINE_S", "60"))
    registry.load()
    copy = copy_gbps()
    size = 16 if smoke else FLUSH_BYTES
    return (
        deadline,
        copy,
        l2_flush(torch.zeros(size, dtype=torch.int8, device=RUN["device"]), "read"),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="also write the rows here")
    parser.add_argument("--no-order", action="store_true", help="skip the table-order rows")
    parser.add_argument("--smoke", action="store_true", help="tiny fp32 shapes on the CPU")
    args = parser.parse_args(argv)
    shapes, order_shapes = SHAPES, ORDER_SHAPES
    if args.smoke:
        shapes, order_shapes = SMOKE_SHAPES, SMOKE_ORDER_SHAPES
    deadline, copy, flush = harness(args.smoke)
    rows: list[dict] = []
    jobs: list[tuple[Shape, list[Cand] | None]] = list(shapes)
    if not args.no_order:
        # the first two table-order shapes after the three call-0 misses (a cut run still
        # has them), the rest at the end
        order: list[tuple[Shape, list[Cand] | None]] = [(s, None) for s in order_shapes]
        jobs = jobs[:3] + order[:2] + jobs[3:] + order[2:]
    for shape, candidates in jobs:
        if time.monotonic() > deadline:
            print(f"deadline: stopped before {shape}", file=sys.stderr)
            break
        case = case_of(*shape)
        got = (
            shape_rows(case, candidates, flush, deadline)
            if candidates is not None
            else order_rows(case, flush, deadline)
        )
        _annotate(got, case, copy)
        rows += got
        torch.cuda.empty_cache()
        print("\n".join(markdown(rows, copy)), file=sys.stderr, flush=True)
        if args.json:  # after every shape: a cut run keeps what it measured
            with open(args.json, "w") as f:
                json.dump({"copy_gbps": copy, "rows": rows}, f, indent=1)
    print("\n".join(markdown(rows, copy)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
