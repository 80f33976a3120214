"""Issue 20's A/B on the H200: our decode kernel with the two-kernel combine against the
fused one (DecodeConfig.fused_combine), each behind the zeroing and the reading L2 flush
(fa_bench.run.timing.l2_flush), SDPA (cuDNN on the dense cache, the bench's call) beside
them, over the issue's target shapes; then, behind the reading flush, the fused launch at
other split counts for the two shapes short of their target (batch 1 x 32k, batch 8 x 8k):
what the split heuristic should pick once the combine costs no launch.

    python tools/gpu/decode_fused_ab.py --json $OUT/decode_fused_ab.json > decode_fused_ab.md

Each figure: GB/s by fa_bench.models.decode_bytes over the median of CALLS calls (CUDA
events around each call, the flush before each, outside the events), through the
benchmark's adapters (registry `triton` with options, `sdpa`), so a planned, bound launch
is what is timed. The copy bandwidth: a 1 GiB device-to-device copy (read + write), the
median of 20. 32/8 heads, D 128, bf16, Sq 1, equal lengths. A development tool, not
installed; DEADLINE_S (env, default 80) stops it between shapes.
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

# (batch, context, page size or 0): the target shapes
SHAPES = (
    (1, 32768, 0), (1, 32768, 64), (8, 8192, 0), (8, 8192, 64), (1, 131072, 64),
    (8, 32768, 0), (64, 8192, 0),
)  # fmt: skip
# split counts tried with the fused combine where the target is missed
SPLIT_SWEEP = {(1, 32768, 0): (16, 24, 32, 48, 64), (8, 8192, 0): (4, 6, 8, 12, 16),
               (1, 32768, 64): (16, 32, 49, 64), (8, 8192, 64): (4, 8, 12, 16)}  # fmt: skip
CALLS = 200
FLUSH_BYTES = 256 << 20


def _case(batch: int, ctx: int, page: int) -> Case:
    return Case(impl="triton", mode="decode", dtype="bf16", batch=batch, heads_q=32,
                heads_kv=8, seqlen_q=1, seqlen_k=ctx, head_dim=128, causal=True,
                page_size=page)  # fmt: skip


def _median_us(fn, flush) -> float:
    events = []
    for _ in range(CALLS + 10):
        flush()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        events.append((start, end))
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in events[10:]) * 1e3


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


def _variants(case: Case, q, k, v) -> list[tuple[str, object, str, bool]]:
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


def _shape_rows(case: Case, flushes: dict, copy: float) -> list[dict]:
    from fa_bench.run.execute import make_inputs

    q, k, v, _ = make_inputs(case, torch.device("cuda"))
    nbytes = models.decode_bytes(case)
    rows = []
    for label, fn, backend, both in _variants(case, q, k, v):
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


def _markdown(rows: list[dict], copy: float) -> list[str]:
    lines = [f"copy bandwidth: {copy:.0f} GB/s (1 GiB device-to-device, median of 20)", "",
             "| shape | variant | zeroing flush µs / GB/s | reading flush µs / GB/s | "
             "reading ÷ copy | launch |", "|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        cache = "contig" if r["page"] == 0 else f"page{r['page']}"
        shape = f"b{r['batch']} {r['context'] // 1024}k {cache}"
        zero = f"{r['zero_us']:.1f} / {r['zero_gbps']:.0f}" if "zero_us" in r else "–"
        read = f"{r['read_us']:.1f} / {r['read_gbps']:.0f}"
        launch = r["backend"].split("; ", 1)[-1]
        lines.append(f"| {shape} | {r['variant']} | {zero} | {read} | {r['read_copy']:.2f} "
                     f"| {launch} |")  # fmt: skip
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args(argv)
    from fa_bench import registry
    from fa_bench.run.timing import l2_flush

    deadline = time.monotonic() + float(os.environ.get("DEADLINE_S", "80"))
    registry.load()
    copy = copy_gbps()
    buf = torch.zeros(FLUSH_BYTES, dtype=torch.int8, device="cuda")
    flushes = {"zero": l2_flush(buf, "zero"), "read": l2_flush(buf, "read")}
    rows: list[dict] = []
    for shape in SHAPES:
        if time.monotonic() > deadline:
            print(f"deadline: stopped before {shape}", file=sys.stderr)
            break
        rows += _shape_rows(_case(*shape), flushes, copy)
        torch.cuda.empty_cache()  # the shape's caches are gone with its frame
        print(f"done {shape}", file=sys.stderr, flush=True)
    print("\n".join(_markdown(rows, copy)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"copy_gbps": copy, "calls": CALLS, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
