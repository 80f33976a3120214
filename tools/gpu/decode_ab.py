"""Issue 20's decode A/Bs on the H200, one tool with a mode (session 5's
tools/gpu/decode_fused_ab.py and session 6's decode_s6_ab.py, merged: their commits keep
the old names):

- `--mode fused` (session 5): our decode kernel with the two-kernel combine against the
  fused one (DecodeConfig.fused_combine), each behind the zeroing and the reading L2 flush
  (fa_bench.run.timing.l2_flush), SDPA (cuDNN on the dense cache, the bench's call) beside
  them, over the issue's target shapes; then, behind the reading flush, the fused launch
  at other split counts for the two shapes short of their target (batch 1 x 32k, batch 8
  x 8k). Through the benchmark's adapters (registry `triton` with options, `sdpa`), so a
  planned, bound launch is what is timed. DEADLINE_S (env) defaults to 80.
- `--mode launches` (session 6): where batch 8 x 8k's and paged batch 64 x 128k's last
  10% go. For each shape, our kernel planned (fa_bench.kernels.decode_plan) at the
  heuristic's launch and at candidate launches (split count, key block, stages, warps),
  each timed as the whole call and, with splits, as the split kernel alone (the plan's
  first bound launch), so the combine's share is the difference; SDPA beside them; behind
  the reading flush. `--batch` keeps one batch size's shapes. DEADLINE_S defaults to 60.

    python tools/gpu/decode_ab.py --mode fused --json $OUT/ab.json > ab.md

Each figure: GB/s by fa_bench.models.decode_bytes over the median of the calls (CUDA
events around each call, the flush before each, outside the events). The copy bandwidth:
a 1 GiB device-to-device copy (read + write), the median of 20. 32/8 heads, D 128, bf16,
Sq 1, equal lengths. A development tool, not installed; DEADLINE_S stops it between
shapes (and candidates).
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

# --mode fused: (batch, context, page size or 0), the target shapes
FUSED_SHAPES = (
    (1, 32768, 0), (1, 32768, 64), (8, 8192, 0), (8, 8192, 64), (1, 131072, 64),
    (8, 32768, 0), (64, 8192, 0),
)  # fmt: skip
# split counts tried with the fused combine where the target is missed
SPLIT_SWEEP = {(1, 32768, 0): (16, 24, 32, 48, 64), (8, 8192, 0): (4, 6, 8, 12, 16),
               (1, 32768, 64): (16, 32, 49, 64), (8, 8192, 64): (4, 8, 12, 16)}  # fmt: skip
CALLS = 200

# --mode launches: (batch, context, page or 0) -> candidates (label, num_splits or None,
# DecodeConfig kw).
# Call B (89495bb) tried more: batch 8 x 8k s4 bn128 st2, s8 bn128 st2, s8 bn64 st3, s4
# bn32 st5 (paged) and batch 64 x 128k bn32 st4, bn64 st3 w8, bn128 st3 were 1-25% slower
# than the heuristic; docs/kernel.md ("Decoding", session 6) has the table.
LAUNCH_SHAPES: dict[tuple[int, int, int], list[tuple[str, int | None, dict]]] = {
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


def _median_us(fn, flush, calls: int = CALLS, warm: int = 10) -> float:
    """The median µs of `calls` calls after `warm` more, the flush before each."""
    events = []
    for _ in range(calls + warm):
        flush()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        events.append((start, end))
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in events[warm:]) * 1e3


def _shape(r: dict) -> str:
    cache = "contig" if r["page"] == 0 else f"page{r['page']}"
    return f"b{r['batch']} {r['context'] // 1024}k {cache}"


def copy_gbps() -> float:
    n = 1 << 30
    src = torch.ones(n, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    times = []
    for _ in range(23):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        dst.copy_(src)
        e.record()
        times.append((s, e))
    torch.cuda.synchronize()
    ms = statistics.median(s.elapsed_time(e) for s, e in times[3:])
    del src, dst
    torch.cuda.empty_cache()
    return 2 * n / ms / 1e6


# --- --mode fused ----------------------------------------------------------------------


def _fused_variants(case: Case, q, k, v) -> list[tuple[str, object, str, bool]]:
    """(label, fn, backend, both flushes) for one shape: SDPA, ours two-kernel and fused
    at the heuristic's splits (both flushes), then the fused split sweep (reading only)."""
    from fa_bench import registry

    out = []
    sdpa = registry.get("sdpa").prepare(case, q, k, v)
    out.append(("sdpa", sdpa.fn, sdpa.backend, True))
    ours = registry.get("triton")
    for label, opts in (("ours two-kernel", {"fused_combine": False}),
                        ("ours fused", {"fused_combine": True})):  # fmt: skip
        p = ours.prepare(case, q, k, v, opts)
        out.append((label, p.fn, p.backend, True))
    key = (case.batch, case.seqlen_k, case.page_size)
    for splits in SPLIT_SWEEP.get(key, ()):
        p = ours.prepare(case, q, k, v, {"fused_combine": True, "num_splits": splits})
        out.append((f"ours fused x{splits}", p.fn, p.backend, False))
    return out


def _fused_rows(case: Case, flushes: dict, copy: float) -> list[dict]:
    from fa_bench.run.execute import make_inputs

    q, k, v, _ = make_inputs(case, torch.device("cuda"))
    nbytes = models.decode_bytes(case)
    rows = []
    for label, fn, backend, both in _fused_variants(case, q, k, v):
        call = lambda fn=fn, q=q, k=k, v=v: fn(q, k, v)  # noqa: E731
        call()
        row = {"batch": case.batch, "context": case.seqlen_k, "page": case.page_size,
               "variant": label, "backend": backend}  # fmt: skip
        for name, flush in flushes.items():
            if name == "zero" and not both:
                continue
            us = _median_us(call, flush)
            row[f"{name}_us"], row[f"{name}_gbps"] = us, nbytes / us / 1e3
        row["read_copy"] = row["read_gbps"] / copy
        rows.append(row)
    return rows


def _fused_markdown(rows: list[dict], copy: float) -> list[str]:
    lines = [f"copy bandwidth: {copy:.0f} GB/s (1 GiB device-to-device, median of 20)", "",
             "| shape | variant | zeroing flush µs / GB/s | reading flush µs / GB/s | "
             "reading ÷ copy | launch |", "|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        shape = _shape(r)
        zero = f"{r['zero_us']:.1f} / {r['zero_gbps']:.0f}" if "zero_us" in r else "–"
        read = f"{r['read_us']:.1f} / {r['read_gbps']:.0f}"
        launch = r["backend"].split("; ", 1)[-1]
        lines.append(f"| {shape} | {r['variant']} | {zero} | {read} | {r['read_copy']:.2f} "
                     f"| {launch} |")  # fmt: skip
    return lines


# --- --mode launches -------------------------------------------------------------------


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


def _launch_rows(case: Case, candidates, flush, copy: float, deadline: float) -> list[dict]:
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
    us = _median_us(lambda f=sdpa.fn, q=q, k=k, v=v: f(q, k, v), flush, calls, warm=5)
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
        us = _median_us(plan.run, flush, calls, warm=5)
        ln = plan.launch
        row = {"variant": label, "us": us, "gbps": nbytes / us / 1e3, "max_diff": err,
               "launch": f"s{ln.num_splits} bn{ln.block_n} w{ln.num_warps} st{ln.num_stages}"
                         f"{' pdl' if plan.pdl else ''}",
               "bound": plan.bound_reason}  # fmt: skip
        if label == "heuristic":
            row["measure_us"] = _bench_median_us(plan.run)
        if plan.bound and ln.num_splits > 1:
            split_only = plan._bound[0]  # the split kernel's launch alone
            row["split_us"] = _median_us(split_only, flush, calls, warm=5)
        rows.append(row)
    for r in rows:
        r.update(batch=case.batch, context=case.seqlen_k, page=case.page_size)
        r["copy"] = r["gbps"] / copy
    return rows


def _launches_markdown(rows: list[dict], copy: float) -> list[str]:
    lines = [f"copy bandwidth: {copy:.0f} GB/s", "",
             "| shape | variant | launch | µs | split kernel alone µs | GB/s | ÷ copy | "
             "max diff vs first |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        shape = _shape(r)
        split = f"{r['split_us']:.1f}" if "split_us" in r else "–"
        if "measure_us" in r:  # the heuristic's row: fa-bench's own timing beside it
            split += f"; timing.measure {r['measure_us']:.1f}"
        diff = f"{r['max_diff']:.2e}" if "max_diff" in r else "–"
        lines.append(f"| {shape} | {r['variant']} | {r['launch'][:60]} | {r['us']:.1f} | "
                     f"{split} | {r['gbps']:.0f} | {r['copy']:.3f} | {diff} |")  # fmt: skip
    return lines


# --- both ----------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=("fused", "launches"), required=True)
    parser.add_argument("--json", help="also write the rows here")
    parser.add_argument("--batch", type=int, help="--mode launches: this batch size's shapes")
    args = parser.parse_args(argv)
    from fa_bench import registry
    from fa_bench.run.timing import l2_flush

    fused = args.mode == "fused"
    deadline = time.monotonic() + float(os.environ.get("DEADLINE_S", "80" if fused else "60"))
    registry.load()
    copy = copy_gbps()
    buf = torch.zeros(FLUSH_BYTES, dtype=torch.int8, device="cuda")
    flushes = {"zero": l2_flush(buf, "zero"), "read": l2_flush(buf, "read")}
    rows: list[dict] = []
    markdown = _fused_markdown if fused else _launches_markdown
    for shape in FUSED_SHAPES if fused else LAUNCH_SHAPES:
        if not fused and args.batch is not None and shape[0] != args.batch:
            continue
        if time.monotonic() > deadline:
            print(f"deadline: stopped before {shape}", file=sys.stderr)
            break
        if fused:
            rows += _fused_rows(_case(*shape), flushes, copy)
        else:
            case = _case(*shape)
            rows += _launch_rows(case, LAUNCH_SHAPES[shape], flushes["read"], copy, deadline)
        torch.cuda.empty_cache()  # the shape's caches are gone with its frame
        print(f"done {shape}", file=sys.stderr, flush=True)
        if not fused:
            print("\n".join(markdown(rows, copy)), file=sys.stderr, flush=True)
    print("\n".join(markdown(rows, copy)))
    if args.json:
        doc = {"copy_gbps": copy, "rows": rows} | ({"calls": CALLS} if fused else {})
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
