"""How long after a kernel starts running back to back do its clock and latency settle?

On 2026-11-29 two identical standard runs disagreed by 6-7.5% on sdpa-cudnn: the H200
hits its power cap, and a case's ~50 ms of samples caught the clock in whatever state
the previous work left it. `--warmup MS` is meant to cover the power controller's
settling time; this measures that time instead of guessing it.

For each kernel and each starting state (after 3 s idle; straight after 2 s of the same
kernel with a 50 ms gap, as consecutive cases see it), it launches 1.5 s of back-to-back
calls, times every call with CUDA events, and polls NVML's SM clock and power every 5 ms.
It prints, per bin of time since onset, the median call latency, the mean SM clock and
power, and the time after which the latency stays within 1% of its 1.0-1.5 s level.

    python3 tools/gpu/clock_settle.py
"""

from __future__ import annotations

import itertools
import statistics
import threading
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from fa_bench.telemetry.nvml import NvmlDevice, load_library, normalize_uuid

BINS_MS = (0, 20, 50, 100, 200, 300, 500, 700, 1000, 1500)


def poll(dev: NvmlDevice, stop: threading.Event, out: list) -> None:
    while not stop.is_set():
        out.append((time.perf_counter(), dev.read("sm_clock_mhz"), dev.read("power_w")))
        time.sleep(0.005)


def burst(fn, seconds: float, dev: NvmlDevice) -> tuple[list[float], list[float], list]:
    """Back-to-back calls for `seconds`; per-call start (ms since onset) and latency (ms)."""
    readings: list = []
    stop = threading.Event()
    poller = threading.Thread(target=poll, args=(dev, stop, readings))
    events = []
    torch.cuda.synchronize()
    poller.start()
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        start = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        events.append(start)
        if len(events) % 64 == 0:
            # Keep the CPU at most ~64 calls ahead so that CPU time tracks GPU time.
            events[-32].synchronize()
    end = torch.cuda.Event(enable_timing=True)
    end.record()
    end.synchronize()
    stop.set()
    poller.join()
    events.append(end)
    starts = [events[0].elapsed_time(e) for e in events[:-1]]
    lat = [a.elapsed_time(b) for a, b in itertools.pairwise(events)]
    clocks = [(1e3 * (t - t0), c, p) for t, c, p in readings if t >= t0]
    return starts, lat, clocks


def report(name: str, starts: list[float], lat: list[float], clocks: list) -> None:
    print(f"  {name}: {len(lat)} calls")
    print(f"    {'bin ms':>12} {'calls':>6} {'median ms':>10} {'SM MHz':>7} {'W':>5}")
    for lo, hi in itertools.pairwise(BINS_MS):
        ls = [x for s, x in zip(starts, lat, strict=True) if lo <= s < hi]
        cs = [(c, p) for t, c, p in clocks if lo <= t < hi]
        if not ls:
            continue
        mhz = statistics.fmean(c for c, _ in cs) if cs else float("nan")
        watts = statistics.fmean(p for _, p in cs) if cs else float("nan")
        print(
            f"    {lo:>5}-{hi:<6} {len(ls):>6} {statistics.median(ls):>10.4f} "
            f"{mhz:>7.0f} {watts:>5.0f}"
        )
    tail = [x for s, x in zip(starts, lat, strict=True) if s >= 1000]
    final = statistics.median(tail or lat[-20:])
    # A rolling median over 9 calls, so that one noisy call does not count as unsettled.
    settled = 0.0
    for i in range(len(lat) - 8):
        if abs(statistics.median(lat[i : i + 9]) / final - 1) > 0.01:
            settled = starts[i + 8]
    print(
        f"    latency within 1% of its 1.0-1.5 s level ({final:.4f} ms) "
        f"for good after {settled:.0f} ms"
    )


def main() -> None:
    lib = load_library()
    dev = NvmlDevice.by_uuid(lib, normalize_uuid(torch.cuda.get_device_properties(0).uuid))
    kernels = {
        # The A/A comparison's worst case, and the headline shape.
        "cudnn fp16 d64 16k causal fwd": (torch.float16, 32, 64, True),
        "cudnn bf16 d128 16k fwd": (torch.bfloat16, 16, 128, False),
    }
    for name, (dtype, heads, d, causal) in kernels.items():
        q, k, v = (torch.randn(1, heads, 16384, d, device="cuda", dtype=dtype) for _ in range(3))

        def fn(q=q, k=k, v=v, causal=causal) -> None:
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                F.scaled_dot_product_attention(q, k, v, is_causal=causal)

        fn()
        print(name)
        time.sleep(3.0)
        report("after 3 s idle", *burst(fn, 1.5, dev))
        burst(fn, 2.0, dev)
        time.sleep(0.05)
        report("after 2 s of itself and a 50 ms gap", *burst(fn, 1.5, dev))


if __name__ == "__main__":
    main()
