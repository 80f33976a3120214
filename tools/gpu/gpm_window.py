"""Where to take the GPM samples: at the window's idle edges or inside the busy period?

On 2026-11-29 fa-bench's calibration read NVML/copy = 0.855 on the H200 (GPM sampled
before the first call and after the final sync), while the field notes' 1 s copy read
0.99. This times the same device copy three ways and prints NVML GB/s / copy GB/s:

  edges   GPM sample, launch 1 s of copies, sync, GPM sample (fa-bench 2026-11-29)
  busy    fa-bench's own busy window (run_busy_window): 0.2 s + 1 s + 0.2 s of copies,
          GPM sampled as each fence passes with copies still queued; copy GB/s from the
          CUDA events over the same calls
  long    edges with a 3 s window (does the gap shrink as 1/window?)

    python3 tools/gpu/gpm_window.py
"""

from __future__ import annotations

import time

import torch

from fa_bench.telemetry.nvml import GPM_METRICS, NvmlDevice, load_library, normalize_uuid
from fa_bench.telemetry.window import CudaMark, run_busy_window


def main() -> None:
    lib = load_library()
    dev = NvmlDevice.by_uuid(lib, normalize_uuid(torch.cuda.get_device_properties(0).uuid))
    peak = dev.peak_bandwidth_gbps()
    n = 256 * 2**20
    src = torch.ones(n, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    for _ in range(10):
        dst.copy_(src)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(50):
        dst.copy_(src)
    torch.cuda.synchronize()
    per_call = (time.perf_counter() - t0) / 50

    def util(first: object, second: object) -> float:
        return dev.gpm_metrics(first, second)["dram_bw_util_pct"]

    for window in (1.0, 3.0):  # edges
        calls = round(window / per_call)
        first = dev.gpm_sample()
        t0 = time.perf_counter()
        for _ in range(calls):
            dst.copy_(src)
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        second = dev.gpm_sample()
        nvml = util(first, second) / 100 * peak
        copy = 2 * n * calls / dt / 1e9
        name = "edges" if window == 1.0 else "long"
        print(f"GPM {name} {window:.0f}s: nvml {nvml:.0f} GB/s, copy {copy:.0f} GB/s, "
              f"ratio {nvml / copy:.3f}")  # fmt: skip

    # The busy window fa-bench ships (fa_bench.telemetry.window), with GPM at its ends.
    samples: list[object] = []
    stamps: list[float] = []

    def take() -> None:
        samples.append(dev.gpm_sample())
        stamps.append(time.perf_counter())

    w = run_busy_window(
        lambda: dst.copy_(src), None, mark=lambda: CudaMark("cuda"), sync=torch.cuda.synchronize,
        open=take, close=take, per_call_s=per_call, target_s=1.0, max_calls=10**6, roll_s=0.2,
    )  # fmt: skip
    first, second = samples[-2:]
    t_first, t_second = stamps[-2:]
    copy = 2 * n * w.calls / w.seconds / 1e9
    nvml = util(first, second) / 100 * peak
    print(f"GPM busy: nvml {nvml:.0f} GB/s, copy {copy:.0f} GB/s, ratio {nvml / copy:.3f}, "
          f"GPM interval {t_second - t_first:.3f} s")  # fmt: skip
    print("GPM metrics known:", list(GPM_METRICS))


if __name__ == "__main__":
    main()
