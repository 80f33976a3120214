"""How much of a short decode call's time is the L2 flush's doing (issue 20): our kernel
(a planned call, kernels/decode_plan.py) and SDPA (cuDNN on the dense cache, the bench's
call) timed behind three flushes of a 256 MB buffer between calls:

- zero: the buffer zeroed (what triton's do_bench and fa-bench's timing do): up to the
  L2's 50 MB of dirty lines are written back while the next call reads;
- read: the buffer read (a max over it): the L2 holds clean lines of it, evicted for free;
- none: no flush (the caches outgrow the L2, so most of each still comes from HBM).

    python tools/gpu/decode_flush_ab.py > flush_ab.md

Shapes: 32/8 heads, D 128, bf16, Sq 1: batch 1 x 32k contiguous, batch 8 x 8k contiguous
and page 64, batch 8 x 32k contiguous. GB/s by fa_bench.models.decode_bytes over the
median of 200 calls (CUDA events around each call). Then the combine kernel's share of a
planned batch-1 call (32k contiguous, 128k page 64): the whole call against its split
kernel alone. A development tool, not installed.
"""

from __future__ import annotations

import statistics
import sys

import torch

from fa_bench import models
from fa_bench.case import Case

SHAPES = ((1, 32768, 0), (8, 8192, 0), (8, 8192, 64), (8, 32768, 0))
COMBINE_SHAPES = ((32768, 0), (131072, 64))  # batch 1: (context, page size or 0)
DEVICE, DTYPE = "cuda", torch.bfloat16
FLUSH_BYTES = 256 << 20
CALLS = 200


def _case(batch: int, ctx: int, page: int) -> Case:
    return Case(impl="triton", mode="decode", dtype="bf16", batch=batch, heads_q=32,
                heads_kv=8, seqlen_q=1, seqlen_k=ctx, head_dim=128, causal=True,
                page_size=page)  # fmt: skip


def _median_ms(fn, flush) -> float:
    times = []
    for _ in range(CALLS + 10):
        flush()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        times.append((start, end))
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in times[10:])


def _fns(case: Case) -> dict:
    from fa_bench import registry
    from fa_bench.run.execute import make_inputs

    registry.load()
    q, k, v, _ = make_inputs(case, torch.device("cuda"))
    ours = registry.get("triton").prepare(case, q, k, v)
    sdpa = registry.get("sdpa").prepare(case, q, k, v)
    return {
        "ours": (lambda: ours.fn(q, k, v), ours.backend),
        "sdpa": (lambda: sdpa.fn(q, k, v), sdpa.backend),
    }


def combine_cost(flush) -> list[str]:
    """The combine kernel's share of a planned batch-1 call: the whole call against its
    split kernel alone (the bound launches run one by one), behind `flush`."""
    from fa_bench.kernels.decode_plan import plan_decode

    lines = ["", "| shape | splits | whole call µs | split kernel alone µs | combine µs |",
             "|---|---|---|---|---|"]  # fmt: skip
    for ctx, page in COMBINE_SHAPES:
        dt, dev = DTYPE, DEVICE
        q = torch.randn(1, 1, 32, 128, dtype=dt, device=dev)
        seqlens = torch.full((1,), ctx, dtype=torch.int32, device=dev)
        table = None
        if page:
            k = torch.randn(ctx // page, page, 8, 128, dtype=dt, device=dev)
            table = torch.randperm(ctx // page, device=dev).to(torch.int32)[None]
        else:
            k = torch.randn(1, ctx, 8, 128, dtype=dt, device=dev)
        plan = plan_decode(q, k, torch.randn_like(k), cache_seqlens=seqlens, block_table=table)
        plan.run()
        if not plan.bound or len(plan._bound or []) < 2:
            lines.append(f"| b1 {ctx // 1024}k | – | – | – | not bound ({plan.bound_reason}) |")
            continue
        whole = _median_ms(plan.run, flush) * 1e3
        alone = _median_ms(plan._bound[0], flush) * 1e3
        cache = "contig" if page == 0 else f"page{page}"
        lines.append(f"| b1 {ctx // 1024}k {cache} | {plan.launch.num_splits} | {whole:.1f} | "
                     f"{alone:.1f} | {whole - alone:.1f} |")  # fmt: skip
    return lines


def main() -> int:
    buf = torch.empty(FLUSH_BYTES // 2, dtype=torch.bfloat16, device="cuda").normal_()
    flushes = {"zero": buf.zero_, "read": lambda: buf.amax(), "none": lambda: None}
    print("| shape | impl | " + " | ".join(f"{f} flush GB/s" for f in flushes) + " | backend |")
    print("|---|---|" + "---|" * len(flushes) + "---|")
    for batch, ctx, page in SHAPES:
        case = _case(batch, ctx, page)
        nbytes = models.decode_bytes(case)
        for impl, (fn, backend) in _fns(case).items():
            fn()
            cells = [f"{nbytes / _median_ms(fn, f) / 1e6:.0f}" for f in flushes.values()]
            cache = "contig" if page == 0 else f"page{page}"
            print(f"| b{batch} {ctx // 1024}k {cache} | {impl} | " + " | ".join(cells)
                  + f" | {backend} |", flush=True)  # fmt: skip
        torch.cuda.empty_cache()
    print("\n".join(combine_cost(flushes["zero"])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
