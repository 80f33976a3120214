"""Issue 18, session 13: where a `fa-bench run --mode bwd` sample's time goes, from the GPU's
own timeline (torch.profiler / CUPTI). For our one-pass backward (triton-onepass) and
sdpa-cudnn at the standard suite's shapes (16k tokens, hidden 2048), each sample exactly
as `timing.measure` takes it (reset the grads, flush the L2, start event, the backward
replayed on one forward's graph, end event) and synchronised after it, as every sample
is when one call is over half of the 20 ms batch (16k non-causal). Per sample: the GPU
idle from the flush's end to the backward's first kernel and to its longest (the host's
share before the main kernel: medians over the samples; µs throughout), each kernel's
duration, the gaps between them, and the host µs from the call to each launch.

    python tools/gpu/bwd_timeline.py [--dims 128,64] [--seqlens 16384,4096]
        [--causal no,yes] [--impls triton-onepass,sdpa-cudnn] [--samples 6] [--out DIR]

Writes DIR/bwd_timeline.jsonl (a line per implementation and shape: the medians over the
samples, and the last sample's kernels) and prints a markdown table. A developer tool,
not installed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from fa_bench.run import timing

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bwd_case import standard_bwd


def _trace(closure, before, flush, n: int) -> dict:
    """The chrome trace of n synchronised samples, each inside a `sample<i>` range."""
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i in range(n):
            torch.cuda.synchronize()
            with record_function(f"sample{i}"):
                before()
                flush()
                with record_function("call"):
                    closure()
            torch.cuda.synchronize()
    path = Path(tempfile.mkdtemp()) / "trace.json"
    prof.export_chrome_trace(str(path))
    return json.loads(path.read_text())


def _samples(trace: dict, n: int) -> list[dict]:
    """Per sample: the flush kernel's end, the backward's kernels (name, start, duration,
    µs from the flush's end), and the host µs from the call's start to each launch."""
    events = trace.get("traceEvents", [])
    ranges = {e["name"]: e for e in events if e.get("cat") == "user_annotation"}
    calls = sorted((e for e in events if e.get("cat") == "user_annotation"
                    and e["name"] == "call"), key=lambda e: e["ts"])  # fmt: skip
    kernels = sorted((e for e in events if e.get("cat") in ("kernel", "gpu_memset")),
                     key=lambda e: e["ts"])  # fmt: skip
    launches = sorted((e for e in events if e.get("cat") == "cuda_runtime"
                       and ("Launch" in e["name"] or "Memset" in e["name"])),
                      key=lambda e: e["ts"])  # fmt: skip
    out = []
    for i in range(n):
        span = ranges.get(f"sample{i}")
        if span is None or i >= len(calls):
            continue
        # the sample's kernels start after its range opens and before the next one's
        # (each sample is synchronised before the next begins)
        t0, call = span["ts"], calls[i]
        nxt = ranges.get(f"sample{i + 1}")
        t1 = nxt["ts"] if nxt is not None else float("inf")
        mine = [k for k in kernels if t0 <= k["ts"] < t1]
        at = next((j for j, k in enumerate(mine) if "reduce" in k["name"]), None)
        if at is None or at + 1 >= len(mine):
            continue
        flush, rest = mine[at], mine[at + 1 :]  # the L2 flush (a read: amax), the backward
        flush_end = flush["ts"] + flush["dur"]
        ks = [dict(name=k["name"][:70], start=round(k["ts"] - flush_end, 1),
                   dur=round(k["dur"], 1)) for k in rest]  # fmt: skip
        gaps = [round(rest[j + 1]["ts"] - (rest[j]["ts"] + rest[j]["dur"]), 1)
                for j in range(len(rest) - 1)]  # fmt: skip
        host = [round(x["ts"] - call["ts"], 1) for x in launches
                if call["ts"] <= x["ts"] <= call["ts"] + call["dur"]]  # fmt: skip
        end = rest[-1]["ts"] + rest[-1]["dur"]
        main = max(rest, key=lambda k: k["dur"])
        out.append(dict(idle_us=round(rest[0]["ts"] - flush_end, 1),
                        to_main_us=round(main["ts"] - flush_end, 1),
                        span_us=round(end - flush_end, 1),
                        busy_us=round(sum(k["dur"] for k in rest), 1),
                        call_host_us=round(call["dur"], 1), kernels=ks, gaps=gaps,
                        launch_host_us=host))  # fmt: skip
    return out


def one(impl_name: str, head_dim: int, n: int, causal: bool, dtype: str, samples: int) -> dict:
    closure, before, keep = standard_bwd(impl_name, dtype, head_dim, n, causal, warm=5)
    dev = torch.device("cuda")
    buf = torch.zeros(timing.l2_flush_bytes(dev), dtype=torch.int8, device=dev)
    flush = timing.l2_flush(buf, timing.TimingConfig().l2_flush_op)
    rows = _samples(_trace(closure, before, flush, samples + 1), samples + 1)[1:]
    keys = ("idle_us", "to_main_us", "span_us", "busy_us", "call_host_us")
    med = {key: statistics.median(r[key] for r in rows) for key in keys} if rows else {}
    del closure, before, keep, buf
    torch.cuda.empty_cache()
    return dict(impl=impl_name, head_dim=head_dim, n=n, causal=causal, dtype=dtype,
                samples=len(rows), **med,
                last=rows[-1] if rows else None)  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dims", default="128,64")
    ap.add_argument("--seqlens", default="16384,4096")
    ap.add_argument("--causal", default="no,yes")
    ap.add_argument("--impls", default="triton-onepass,sdpa-cudnn")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--samples", type=int, default=6)
    ap.add_argument("--out", default=os.environ.get("OUT", "fa-bench-out/out"))
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    head = "| impl | D | N | causal | idle | to main | busy | span | call host | kernels |"
    lines = [head, "|---|---|---|---|---|---|---|---|---|---|"]
    with (out / "bwd_timeline.jsonl").open("a") as f:
        for d in (int(x) for x in args.dims.split(",")):
            for n in (int(x) for x in args.seqlens.split(",")):
                for c in (x.strip() == "yes" for x in args.causal.split(",")):
                    for impl in args.impls.split(","):
                        r = one(impl, d, n, c, args.dtype, args.samples)
                        f.write(json.dumps(r) + "\n")
                        f.flush()
                        ks = ", ".join(f"{k['name'][:24]} {k['dur']}"
                                       for k in (r["last"] or {}).get("kernels", []))  # fmt: skip
                        lines.append(f"| {impl} | {d} | {n} | {c} | {r.get('idle_us')} | "
                                     f"{r.get('to_main_us')} | "
                                     f"{r.get('busy_us')} | {r.get('span_us')} | "
                                     f"{r.get('call_host_us')} | {ks} |")  # fmt: skip
                        print(lines[-1], flush=True)
    (out / "bwd_timeline.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
