"""The measurement engine: warm up, time each call, stop on noise, keep the raw samples.

GPU calls are timed with CUDA events around each iteration; a buffer larger than L2 is
read between iterations (a max over it: a one-element result), outside the timed span, so
every call starts with a cold L2 as it would inside a model, and with no dirty lines in
it (`L2_FLUSH_OPS`: a zeroing flush, do_bench's, leaves the L2 full of dirty lines that
the next call pays to write back). CPU calls use `time.perf_counter` with the same
statistics.

Stopping rule: after at least `min_samples` samples and `min_time_s` of timed work, stop
as soon as the noise, the relative standard error of the mean (stdev / mean / sqrt(n)),
is at most `target_noise`; give up at `max_time_s` and say so in `stop_reason`.

On a GPU an optional `clock` probe (NVML's SM clock) is read once per batch of samples
while the batch runs: an H200 under its power cap moves its clock between runs, and a
latency change that comes with a clock change is the hardware's, not the code's.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

Closure = Callable[[], object]


# Untimed back-to-back calls before a case's samples. On the H200 the clock leaves its
# boost within 100-200 ms of sustained work when the power cap bites, and A/A runs of
# cuDNN agreed at 500 ms but not at 20 (docs/measurement.md). A CPU has no such
# controller to wait for.
GPU_WARMUP_MS = 500.0
CPU_WARMUP_MS = 20.0


def default_warmup_ms(on_cpu: bool) -> float:
    return CPU_WARMUP_MS if on_cpu else GPU_WARMUP_MS


# Threads torch (and OpenMP, through OMP_NUM_THREADS) uses in a CPU worker, unless
# --cpu-threads says otherwise. One: with torch's default (one per core) OpenMP's idle
# threads spin-wait between calls, and when anything else wants the cores (the runner,
# another worker, a CI neighbour) a 0.1 ms call's median lands on 8, 16 or 24 ms, the
# scheduler's time slices. On a 2-core machine one thread timed naive fwd N=128 at
# 0.07 ms run after run; with two, one case per run took 24-68 ms (docs/measurement.md). One thread
# also measures the kernel, not the machine's parallelism, so CPU runs compare across hosts.
DEFAULT_CPU_THREADS = 1


def worker_threads(device: str, requested: int | None) -> int | None:
    """The CPU thread count a worker on `device` ("cpu" or "cuda") sets: --cpu-threads,
    else DEFAULT_CPU_THREADS on the CPU; None leaves torch's default (a GPU run, whose
    host threads only launch kernels and build the float64 reference)."""
    if requested is not None:
        return requested
    return DEFAULT_CPU_THREADS if device == "cpu" else None


# How the flush buffer evicts the L2 between timed calls. "read" (the default): a max
# over the buffer into one preallocated element. The L2 is left full of the buffer's
# clean lines, which the next call evicts for free. "zero" (triton's do_bench, and
# fa-bench before session 5): the buffer is zeroed, which leaves up to the whole L2 (50 MB
# on an H200) dirty; the next call pays for writing it back while it reads. On the H200
# (tools/gpu/decode_flush_ab.py, docs/measurement.md) a 50 us decode call read at 0.63 of
# the copy bandwidth behind a zeroing flush and at 0.76 behind a reading one (batch 8 x 8k,
# 80 us: 0.79 and 0.89; batch 8 x 32k, 260 us: 4% apart), SDPA alike.
L2_FLUSH_OPS = ("read", "zero")


@dataclass(frozen=True)
class TimingConfig:
    target_noise: float = 0.01
    min_samples: int = 10
    min_time_s: float = 0.05
    max_time_s: float = 3.0
    warmup_ms: float = 20.0
    flush_l2: bool = True
    cuda_graph: bool = False
    # how the L2 is flushed between GPU calls (L2_FLUSH_OPS); "read" since session 5
    l2_flush_op: str = "read"

    def __post_init__(self) -> None:
        if not 0 < self.target_noise < 1:
            raise ValueError(f"target_noise must be in (0, 1), got {self.target_noise}")
        if self.min_samples < 2:
            raise ValueError(f"min_samples must be at least 2, got {self.min_samples}")
        if self.max_time_s <= 0 or self.min_time_s < 0 or self.min_time_s > self.max_time_s:
            raise ValueError(
                f"need 0 <= min_time_s <= max_time_s, got {self.min_time_s}, {self.max_time_s}"
            )
        if self.l2_flush_op not in L2_FLUSH_OPS:
            raise ValueError(
                f"l2_flush_op must be one of {', '.join(L2_FLUSH_OPS)}, got {self.l2_flush_op!r}"
            )


@dataclass
class Timing:
    samples_ms: list[float]
    method: str
    stop_reason: str
    warmup_calls: int
    l2_flush: bool
    sm_clock_mhz: list[float] = field(default_factory=list)  # one reading per batch
    # the flush between calls: "read" or "zero" (L2_FLUSH_OPS), None when there was none
    l2_flush_op: str | None = None

    def stats(self) -> dict:
        return summarize(self.samples_ms)

    def clock_stats(self) -> dict | None:
        c = self.sm_clock_mhz
        if not c:
            return None
        return {"min": min(c), "mean": statistics.fmean(c), "max": max(c), "n": len(c)}


def quantile(sorted_values: list[float], q: float) -> float:
    """Linear-interpolation quantile (numpy's default) of already sorted values."""
    if not sorted_values:
        raise ValueError("quantile of no samples")
    pos = q * (len(sorted_values) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def noise(samples: list[float]) -> float:
    """Relative standard error of the mean; inf with fewer than two samples."""
    if len(samples) < 2:
        return math.inf
    mean = statistics.fmean(samples)
    return statistics.stdev(samples) / mean / math.sqrt(len(samples)) if mean > 0 else math.inf


def summarize(samples: list[float]) -> dict:
    s = sorted(samples)
    return {
        "median": quantile(s, 0.5),
        "mean": statistics.fmean(s),
        "min": s[0],
        "max": s[-1],
        "p20": quantile(s, 0.2),
        "p80": quantile(s, 0.8),
        "stdev": statistics.stdev(s) if len(s) > 1 else 0.0,
        "noise": noise(s) if len(s) > 1 else None,
        "n": len(s),
        "samples": list(samples),
    }


def _should_stop(
    samples: list[float], timed_s: float, wall_s: float, cfg: TimingConfig
) -> str | None:
    """`timed_s` sums the samples; `wall_s` also counts flushes and synchronizations."""
    if len(samples) >= cfg.min_samples and timed_s >= cfg.min_time_s:
        if noise(samples) <= cfg.target_noise:
            return "noise"
    if wall_s >= cfg.max_time_s and len(samples) >= 2:  # two samples give a spread
        return "time-limit"
    return None


def measure(
    fn: Closure,
    *,
    device: torch.device | str,
    config: TimingConfig,
    before: Closure | None = None,
    clock: Callable[[], float | None] | None = None,
) -> Timing:
    """Time `fn()`; `before()` runs ahead of every call, outside the timed span; `clock()`
    (GPU only) reads the SM clock in MHz, None when it cannot."""
    if getattr(device, "type", str(device)) == "cuda":
        return _measure_cuda(fn, device, config, before, clock)
    return _measure_cpu(fn, config, before)


def _measure_cpu(fn: Closure, cfg: TimingConfig, before: Closure | None) -> Timing:
    warm, t_end = 0, time.perf_counter() + cfg.warmup_ms / 1e3
    while warm < 2 or time.perf_counter() < t_end:
        if before:
            before()
        fn()
        warm += 1
    samples: list[float] = []
    timed_s, start = 0.0, time.perf_counter()
    while True:
        if before:
            before()
        t0 = time.perf_counter()
        fn()
        dt = time.perf_counter() - t0
        samples.append(dt * 1e3)
        timed_s += dt
        reason = _should_stop(samples, timed_s, time.perf_counter() - start, cfg)
        if reason:
            return Timing(samples, "perf_counter", reason, warm, l2_flush=False)


def l2_flush_bytes(device: torch.device | str) -> int:
    """Twice the device's L2 (at least 256 MB, what triton.testing.do_bench zeroes)."""
    import torch

    l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 0
    return max(2 * l2, 256 * 1024 * 1024)


def l2_flush(buffer: torch.Tensor, op: str) -> Closure:
    """The closure that flushes the L2 through `buffer` (1-D) by `op` (L2_FLUSH_OPS)."""
    import torch

    if op == "zero":
        return buffer.zero_
    if op == "read":
        # out= keeps the call free of allocations; the result is one element
        result = torch.empty((), dtype=buffer.dtype, device=buffer.device)
        return lambda: torch.amax(buffer, dim=0, out=result)
    raise ValueError(f"l2 flush op must be one of {', '.join(L2_FLUSH_OPS)}, got {op!r}")


def _measure_cuda(
    fn: Closure,
    device: torch.device | str,
    cfg: TimingConfig,
    before: Closure | None,
    clock: Callable[[], float | None] | None = None,
) -> Timing:
    import torch

    # zeros, not torch.empty: a read of never-written memory must not depend on whatever
    # the allocator hands back
    flush = (
        l2_flush(torch.zeros(l2_flush_bytes(device), dtype=torch.int8, device=device),
                 cfg.l2_flush_op)
        if cfg.flush_l2
        else None
    )  # fmt: skip
    run = fn
    if cfg.cuda_graph:
        run = _capture_graph(fn, device, before)
        before = None

    def one_iteration(start: torch.cuda.Event, end: torch.cuda.Event) -> None:
        if before:
            before()
        if flush is not None:
            flush()
        start.record()
        run()
        end.record()

    warm, est_ms = _warm_up(one_iteration, device, cfg.warmup_ms)
    batch = int(min(100, max(1, 20.0 / est_ms)))
    samples, clocks, reason = _sample(one_iteration, device, cfg, batch, clock)
    method = "cuda-graph" if cfg.cuda_graph else "cuda-events"
    op = cfg.l2_flush_op if flush is not None else None
    return Timing(samples, method, reason, warm, flush is not None, clocks, op)


def _warm_up(
    one_iteration: Callable[[Any, Any], None], device: torch.device | str, warmup_ms: float
) -> tuple[int, float]:
    """Warm up for `warmup_ms`; returns (calls made, one call's estimated device ms).

    Two synchronized calls estimate one call's cost (to size the batches between
    synchronizations); the rest of the warm-up runs back to back, keeping the GPU as
    busy as the samples will, so its clock settles under the same load."""
    import torch

    torch.cuda.synchronize(device)
    t_start = time.perf_counter()
    for _ in range(2):
        t0 = time.perf_counter()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        one_iteration(s, e)
        torch.cuda.synchronize(device)
    warm = 2
    iter_ms = (time.perf_counter() - t0) * 1e3  # the second call: flush and launch included
    est_ms = max(s.elapsed_time(e), 1e-3)
    spent_ms = (time.perf_counter() - t_start) * 1e3
    more = math.ceil(max(0.0, warmup_ms - spent_ms) / max(iter_ms, 1e-3))
    for _ in range(min(more, 100_000)):
        one_iteration(s, e)
        warm += 1
    torch.cuda.synchronize(device)
    return warm, est_ms


def _sample(
    one_iteration: Callable[[Any, Any], None],
    device: torch.device | str,
    cfg: TimingConfig,
    batch: int,
    clock: Callable[[], float | None] | None,
) -> tuple[list[float], list[float], str]:
    """Timed batches of `batch` calls until `_should_stop`; (samples ms, SM clocks, why)."""
    import torch

    samples: list[float] = []
    clocks: list[float] = []
    timed_s, start = 0.0, time.perf_counter()
    while True:
        events = [
            (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            for _ in range(batch)
        ]
        for s, e in events:
            one_iteration(s, e)
        if clock is not None:  # before the sync: the batch is still running
            mhz = clock()
            if mhz is not None:
                clocks.append(float(mhz))
        torch.cuda.synchronize(device)
        for s, e in events:
            ms = s.elapsed_time(e)
            samples.append(ms)
            timed_s += ms / 1e3
        reason = _should_stop(samples, timed_s, time.perf_counter() - start, cfg)
        if reason:
            return samples, clocks, reason


def _capture_graph(fn: Closure, device: torch.device | str, before: Closure | None) -> Closure:
    import torch

    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):  # capture needs warm-up on a side stream
        for _ in range(3):
            if before:
                before()
            fn()
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    if before:
        before()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay
