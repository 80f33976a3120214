"""Where a short forward's time goes on the host: for `fa-bench run`'s triton and
sdpa-cudnn adapters at the standard suite's short shapes (16k tokens, 16 heads, d128),
the host time of one call (enqueued behind a GPU sleep, so no launch waits on the GPU),
the GPU time (CUDA graph replay, no host in the span), timing.measure's median as
`fa-bench run` takes it (events, L2 flush), and a cProfile of the triton calls. The
"triton-unplanned" rows launch the Gluon forward through triton's JIT every call, as
before kernels/flash_gluon_plan.py, beside "triton" (planned launches replayed).

    python tools/gpu/host_cost.py [--seqlen 1024,2048] > host_cost.md

If the host time exceeds the flush + kernel time, the per-call events measure the host.
A developer tool, not installed.
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import io
import pstats
import time

import torch

from fa_bench import registry
from fa_bench.case import Case
from fa_bench.kernels import flash_gluon_plan
from fa_bench.run import timing
from fa_bench.run.execute import make_inputs


def host_us(fn, n: int = 200) -> float:
    """Median host µs of one enqueue, with the GPU kept busy so launches never block."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(n // 20):
        torch.cuda._sleep(50_000_000)  # ~25+ ms of GPU work ahead of the launches
        for _ in range(20):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e6)
        torch.cuda.synchronize()
    times.sort()
    return times[len(times) // 2]


def graph_us(fn, n: int = 50) -> float:
    """GPU µs of one call from a CUDA graph of n calls (no host time in the span)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(n):
            fn()
    g.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        g.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / (5 * n)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqlen", default="1024,2048,4096")
    ap.add_argument("--profile", default="1024")
    args = ap.parse_args()
    dev = torch.device("cuda")
    registry.load()
    print(
        "| impl | dtype | N | causal | host µs/call | graph GPU µs | measure median µs | "
        "min µs | backend |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    profiles = []
    for n in (int(x) for x in args.seqlen.split(",")):
        for dtype in ("bf16", "fp16"):
            for causal in (False, True):
                for label in ("triton", "triton-unplanned", "sdpa-cudnn"):
                    # triton-unplanned: the Gluon forward's launches through triton's JIT
                    # every call, as before kernels/flash_gluon_plan.py (the A/B's "before")
                    flash_gluon_plan.ENABLED = label != "triton-unplanned"
                    name = label.removesuffix("-unplanned")
                    case = Case(name, "fwd", dtype, 16384 // n, 16, 16, n, n, 128, causal)
                    q, k, v, _ = make_inputs(case, dev)
                    prep = registry.get(name).prepare(case, q, k, v)
                    fn = functools.partial(prep.fn, q, k, v)
                    h = host_us(fn)
                    try:
                        g = f"{graph_us(fn):.1f}"
                    except Exception as e:  # a launch path a graph cannot capture
                        g = f"– ({type(e).__name__})"
                    t = timing.measure(fn, device=dev, config=timing.TimingConfig(
                        max_time_s=0.3, warmup_ms=200))  # fmt: skip
                    st = t.stats()
                    print(f"| {label} | {dtype} | {n} | {causal} | {h:.1f} | {g} | "
                          f"{st['median'] * 1e3:.1f} | {st['min'] * 1e3:.1f} | "
                          f"{prep.backend or ''} |", flush=True)  # fmt: skip
                    if label == "triton" and str(n) == args.profile and dtype == "bf16":
                        pr = cProfile.Profile()
                        torch.cuda._sleep(200_000_000)
                        pr.enable()
                        for _ in range(100):
                            fn()
                        pr.disable()
                        torch.cuda.synchronize()
                        buf = io.StringIO()
                        pstats.Stats(pr, stream=buf).sort_stats("cumulative").print_stats(25)
                        profiles.append((causal, buf.getvalue()))
    flash_gluon_plan.ENABLED = True
    print(f"\nGluon forward plans: {flash_gluon_plan.hits} replays, {len(flash_gluon_plan._PLANS)} "
          f"kept, last miss: {flash_gluon_plan.last_reason or 'planned'}")  # fmt: skip
    for causal, text in profiles:
        print(f"\n## cProfile, triton bf16 N={args.profile} causal={causal}, 100 calls\n")
        print("```\n" + text + "\n```")


if __name__ == "__main__":
    main()
