"""Issue 18, session 13: is the non-causal backward's gap to cuDNN a power-cap effect?
Our kernel alone matched cuDNN's in short bursts (tools/gpu/bwd_timeline.py) but
`fa-bench run` (power-capped at 700 W in steady state) had it 6% behind. For our
one-pass backward and sdpa-cudnn at the standard suite's bwd shapes, the backward runs
back to back (no flush, no synchronisation between calls) for a short and a long window,
alternating the implementations; per window: ms per call (CUDA events around the
window), and NVML's power, SM clock and throttle reasons read at its end.

    python tools/gpu/bwd_power.py [--dims 128,64] [--seqlens 16384] [--causal no]
        [--heads 32,33] [--windows 0.05,2.0] [--rounds 2] [--out DIR]

`--heads` replaces the suite's head count (2048 / head_dim) with each one given, to
compare grids of whole waves (132 SMs: 33 heads × 128 key blocks is 32 waves) with the
suite's (32 heads at 16k: 31.03 waves); the table's µs per head puts them side by side.

Writes DIR/bwd_power.jsonl (a line per window) and prints a markdown table. A developer
tool, not installed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import pynvml
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bwd_case import standard_bwd


def _window(closure, before, seconds: float, per_call_ms: float, handle) -> dict:
    calls = max(3, int(seconds * 1e3 / per_call_ms))
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for i in range(calls):
        before()
        closure()
        if i == calls - 1:
            # the window's end: the GPU is still busy with it (the host runs ahead)
            power = pynvml.nvmlDeviceGetPowerUsage(handle) / 1e3
            mhz = pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)
            reasons = pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle)
    e.record()
    torch.cuda.synchronize()
    return dict(calls=calls, ms_per_call=s.elapsed_time(e) / calls, power_w=power,
                sm_mhz=mhz, throttle=hex(reasons))  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dims", default="128,64")
    ap.add_argument("--seqlens", default="16384")
    ap.add_argument("--causal", default="no")
    ap.add_argument("--windows", default="0.05,2.0")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--heads", default="", help="head counts (default: 2048 / head_dim)")
    ap.add_argument("--out", default=os.environ.get("OUT", "fa-bench-out/out"))
    args = ap.parse_args()
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    windows = [float(x) for x in args.windows.split(",")]
    lines = ["| D | H | N | causal | window s | round | impl | ms/call | µs/head | W | SM MHz | "
             "throttle |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    heads_of = {d: [int(x) for x in args.heads.split(",")] if args.heads else [2048 // d]
                for d in (int(x) for x in args.dims.split(","))}  # fmt: skip
    shapes = [(d, h, n, c) for d, hs in heads_of.items() for h in hs
              for n in (int(x) for x in args.seqlens.split(","))
              for c in (x.strip() == "yes" for x in args.causal.split(","))]  # fmt: skip
    with (out / "bwd_power.jsonl").open("a") as f:
        for d, heads, n, c in shapes:
            runs = {}
            for impl_name in ("triton-onepass", "sdpa-cudnn"):
                closure, before, keep = standard_bwd(impl_name, args.dtype, d, n, c, heads)
                t0 = time.perf_counter()
                before()
                closure()
                torch.cuda.synchronize()
                runs[impl_name] = (closure, before, (time.perf_counter() - t0) * 1e3, keep)
            for rnd in range(args.rounds):
                for w in windows:
                    for impl_name, (closure, before, est, _) in runs.items():
                        time.sleep(1.0)  # the same rest before each window
                        r = _window(closure, before, w, est, handle)
                        r.update(impl=impl_name, head_dim=d, heads=heads, n=n, causal=c,
                                 window_s=w, round=rnd)  # fmt: skip
                        f.write(json.dumps(r) + "\n")
                        f.flush()
                        per_head = r["ms_per_call"] * 1e3 / heads
                        cells = (d, heads, n, c, w, rnd, impl_name, f"{r['ms_per_call']:.3f}",
                                 f"{per_head:.1f}", f"{r['power_w']:.0f}", r["sm_mhz"],
                                 r["throttle"])  # fmt: skip
                        lines.append("| " + " | ".join(map(str, cells)) + " |")
                        print(lines[-1], flush=True)
            del runs
            torch.cuda.empty_cache()
    (out / "bwd_power.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
