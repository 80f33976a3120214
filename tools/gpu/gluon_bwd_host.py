"""Issue 18, session 8: the Gluon backward's host time and what `fa-bench run` times of
it. For `fa-bench run`'s triton-onepass adapter (the Gluon backward) with its launches
planned (kernels/flash_gluon_bwd_plan.py) and unplanned (triton's JIT and fresh
descriptors every call, as before), beside sdpa-cudnn, at the standard suite's bwd shapes
(16k tokens, hidden 2048, bf16): host µs of one backward call (enqueued behind a GPU
sleep, so no launch waits), then `timing.measure`'s median and minimum exactly as
`fa-bench run --mode bwd` takes them (the backward replayed on one forward's graph, per-call
CUDA events, the L2 flushed by a read before each call, batches of 20 ms), the TFLOP/s
and ÷ sdpa-cudnn of that median, and the first samples (the first of each batch waits
for the host).

    python tools/gpu/gluon_bwd_host.py [--dims 128,64] [--seqlens 16384,4096]
        [--roles64 ws-pss-early,ws-s6] [--out DIR]

Writes DIR/gluon_bwd_host.jsonl (a line per row, as it goes) and prints the markdown
table; the first row's planned and unplanned calls also get a cProfile (host_prof.txt).
A developer tool, not installed.
"""

from __future__ import annotations

import argparse
import cProfile
import importlib
import io
import json
import math
import os
import pstats
import sys
import time
from pathlib import Path

import torch

from fa_bench import models, registry
from fa_bench.case import Case
from fa_bench.kernels import flash_gluon_bwd_plan
from fa_bench.run import timing
from fa_bench.run.execute import _timed_call, make_inputs

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bwd_case import standard_bwd

ROLE_ENV = "FA_BENCH_GLUON_BWD_ROLE"


def host_us(closure, before, n: int) -> float:
    """Median host µs of one backward call, the GPU kept busy ahead of it."""
    times = []
    torch.cuda._sleep(int(1.5e8))  # ~75+ ms of GPU work ahead of the launches
    for _ in range(n):
        before()
        t0 = time.perf_counter()
        closure()
        times.append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    times.sort()
    return times[len(times) // 2]


def profile(case: Case, q, k, v, do, n: int = 10) -> str:
    """cProfile of n backward calls of our kernel module, called directly: through
    autograd the backward runs on the engine's device thread, which cProfile does not see."""
    # the module: fa_bench.kernels exports the function under the same name
    fa = importlib.import_module("fa_bench.kernels.flash_attention")
    from fa_bench.kernels.flash_config import FlashConfig

    cfg, scale = FlashConfig(backward="auto"), case.head_dim**-0.5  # triton-onepass's
    o, lse2 = fa._forward(q, k, v, case.causal, scale, cfg, None)
    fa._backward(do, q, k, v, o, lse2, case.causal, scale, cfg, False)  # planned, if it is
    pr = cProfile.Profile()
    torch.cuda._sleep(int(1.5e8))
    pr.enable()
    for _ in range(n):
        fa._backward(do, q, k, v, o, lse2, case.causal, scale, cfg, False)
    pr.disable()
    torch.cuda.synchronize()
    buf = io.StringIO()
    pstats.Stats(pr, stream=buf).sort_stats("cumulative").print_stats(25)
    return buf.getvalue()


def autograd_profile(closure, before, n: int = 10) -> tuple[float, float, str]:
    """(host µs of one call with autograd's device threads, without them, and a cProfile
    of n calls without them): with multithreading off the backward runs in this thread,
    where cProfile sees it (the whole path: autograd's node, our Python, the launches)."""
    threaded = host_us(closure, before, n)
    with torch.autograd.set_multithreading_enabled(False):
        inline = host_us(closure, before, n)
        pr = cProfile.Profile()
        torch.cuda._sleep(int(1.5e8))
        for _ in range(n):
            before()
            pr.enable()
            closure()
            pr.disable()
        torch.cuda.synchronize()
    buf = io.StringIO()
    pstats.Stats(pr, stream=buf).sort_stats("tottime").print_stats(30)
    return threaded, inline, buf.getvalue()


def autograd_rows(out: Path, dev, dtype: str, shapes: list[tuple[int, int, bool]]) -> None:
    """`--autograd-prof`: autograd_profile of triton-onepass and sdpa-cudnn per shape
    (head_dim, N, causal), written to out/host_autograd.txt."""
    text = []
    for head_dim, n, causal in shapes:
        for impl_name in ("triton-onepass", "sdpa-cudnn"):
            # compiled and planned by three calls
            closure, before, keep = standard_bwd(impl_name, dtype, head_dim, n, causal,
                                                 device=dev)  # fmt: skip
            threaded, inline, prof = autograd_profile(closure, before)
            line = f"{keep[0].id}: host µs threaded {threaded:.0f}, in this thread {inline:.0f}"
            print(line, flush=True)
            text.append(f"## {line}\n\n```\n{prof}\n```\n")
            del closure, before, keep
            torch.cuda.empty_cache()
    (out / "host_autograd.txt").write_text("\n".join(text))


def row(label: str, case: Case, args, dev, prof: list) -> dict:
    """One implementation at one shape: host µs and fa-bench run's timing."""
    impl = registry.get(case.impl)
    q, k, v, do = make_inputs(case, dev)
    prep = impl.prepare(case, q, k, v, None)
    closure, before = _timed_call(case, impl, prep.fn, q, k, v, do)
    h = host_us(closure, before, n=8 if case.seqlen_q >= 16384 else 16)
    if prof is not None:
        text = profile(case, q, k, v, do)
        prof.append(f"## {label} {case.id}\n\n```\n{text}\n```\n")
    cfg = timing.TimingConfig(max_time_s=args.max_time, warmup_ms=args.warmup_ms,
                              min_time_s=min(0.05, args.max_time))  # fmt: skip
    t = timing.measure(closure, device=dev, config=cfg, before=before)
    st = t.stats()
    flops = models.case_flops(case)
    out = dict(label=label, head_dim=case.head_dim, n=case.seqlen_q, causal=case.causal,
               host_us=round(h, 1), median_ms=st["median"], min_ms=st["min"],
               tflops=flops / (st["median"] * 1e-3) / 1e12,
               tflops_min=flops / (st["min"] * 1e-3) / 1e12, n_samples=len(t.samples_ms),
               first=[round(x, 3) for x in t.samples_ms[:8]], backend=prep.backend or "",
               plan_hits=flash_gluon_bwd_plan.hits,
               plan_reason=flash_gluon_bwd_plan.last_reason)  # fmt: skip
    del closure, before, prep, q, k, v, do
    torch.cuda.empty_cache()
    return out


def _labels(head_dim: int, roles64: list[str]) -> list[tuple[str, str, str, bool]]:
    """(label, impl, role override, planned) in the order measured."""
    roles = roles64 if head_dim == 64 and roles64 else [""]
    out = []
    for role in roles:
        tag = f" {role}" if role else ""
        out.append((f"planned{tag}", "triton-onepass", role, True))
    out.append((f"unplanned{' ' + roles[0] if roles[0] else ''}", "triton-onepass", roles[0],
                False))  # fmt: skip
    out.append(("sdpa-cudnn", "sdpa-cudnn", "", True))
    return out


def pick(rows: list[dict]) -> str:
    """$FA_BENCH_GLUON_BWD_PLAN for the run that follows the A/B: "0" when the unplanned
    launches' median was over 1% faster than the planned ones' (geometric mean over the
    shapes where both were timed), else "1" (the default: planned)."""
    by = {}
    for r in rows:
        if "median_ms" in r:
            kind = r["label"].split()[0]
            by.setdefault((r["head_dim"], r["n"], r["causal"]), {}).setdefault(kind, r["median_ms"])
    ratios = [
        t["planned"] / t["unplanned"] for t in by.values() if {"planned", "unplanned"} <= set(t)
    ]
    if not ratios:
        return "1"
    return "0" if math.prod(ratios) ** (1 / len(ratios)) > 1.01 else "1"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pick", help="print pick() of this jsonl and exit")
    ap.add_argument("--dims", default="128,64")
    ap.add_argument("--seqlens", default="16384,4096")
    ap.add_argument("--causal", default="no,yes")
    ap.add_argument("--roles64", default="")
    ap.add_argument("--max-time", type=float, default=0.25)
    ap.add_argument("--warmup-ms", type=float, default=250.0)
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--out", default=os.environ.get("OUT", "fa-bench-out/out"))
    ap.add_argument("--device", default="cuda", help="cpu: the tests' dry run")
    ap.add_argument("--autograd-prof", action="store_true",
                    help="profile the backward through autograd (in this thread) per shape "
                    "of --dims x --seqlens x --causal, ours and cuDNN, then exit")  # fmt: skip
    args = ap.parse_args()
    if args.pick:
        text = Path(args.pick).read_text() if Path(args.pick).exists() else ""
        print(pick([json.loads(x) for x in text.splitlines() if x.strip()]))
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    lines, prof = out / "gluon_bwd_host.jsonl", []
    dev = torch.device(args.device)
    registry.load()
    if args.autograd_prof:
        shapes = [(int(d), int(n), c == "yes") for d in args.dims.split(",")
                  for n in args.seqlens.split(",") for c in args.causal.split(",")]  # fmt: skip
        autograd_rows(out, dev, args.dtype, shapes)
        return
    roles64 = [r for r in args.roles64.split(",") if r]
    print("| D | N | causal | label | host µs | median ms | TFLOP/s | ÷ cuDNN | min ms | "
          "samples | first samples ms | backend |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    # causal outermost, then head_dim, then N: both N reuse one compiled kernel set
    for causal in (c == "yes" for c in args.causal.split(",")):
        for head_dim in (int(x) for x in args.dims.split(",")):
            heads = 2048 // head_dim
            for n in (int(x) for x in args.seqlens.split(",")):
                rows = []
                for label, impl, role, planned in _labels(head_dim, roles64):
                    os.environ[ROLE_ENV] = role
                    flash_gluon_bwd_plan.ENABLED = planned
                    case = Case(impl, "bwd", args.dtype, 16384 // n, heads, heads, n, n,
                                head_dim, causal)  # fmt: skip
                    mine = prof if impl == "triton-onepass" else None
                    try:
                        r = row(label, case, args, dev, mine)
                    except Exception as e:  # a row that fails names why; the rest go on
                        r = dict(label=label, head_dim=head_dim, n=n, causal=causal,
                                 error=f"{type(e).__name__}: {e}"[:300])  # fmt: skip
                    with lines.open("a") as f:
                        f.write(json.dumps(r) + "\n")
                    rows.append(r)
                _print(rows)
                if prof:
                    (out / "host_prof.txt").write_text("\n".join(prof))
                prof = None  # the first shape only
    flash_gluon_bwd_plan.ENABLED = True
    os.environ.pop(ROLE_ENV, None)


def _print(rows: list[dict]) -> None:
    cudnn = next((r for r in rows if r["label"] == "sdpa-cudnn" and "tflops" in r), None)
    for r in rows:
        head = f"| {r['head_dim']} | {r['n'] // 1024}k | {'yes' if r['causal'] else 'no'} | "
        if "error" in r:
            print(f"{head}{r['label']} | {r['error']} |" + " |" * 7, flush=True)
            continue
        ratio = f"{r['tflops'] / cudnn['tflops']:.3f}" if cudnn else "–"
        print(f"{head}{r['label']} | {r['host_us']:.0f} | {r['median_ms']:.3f} | "
              f"{r['tflops']:.1f} | {ratio} | {r['min_ms']:.3f} | {r['n_samples']} | "
              f"{' '.join(map(str, r['first']))} | {r['backend']} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
