"""Issue 19's softcap forward on the H200, session 7 (SC): the MUFU's rates and the
candidates beside the default and the dense kernel.

    python tools/gpu/variants_gluon_s7.py mufu            # MUFU.TANH / MUFU.EX2 / FFMA rates
    python tools/gpu/variants_gluon_s7.py speed [--quick] # the candidates' TFLOP/s
    python tools/gpu/variants_gluon_s7.py summary RESULTS_JSON  # a fa-bench run's ratios

`mufu`: a plain Triton kernel running long dependent chains of one PTX op per element
(8 independent chains per thread, 16 CTAs of 4 warps per SM): tanh.approx.f32,
ex2.approx.ftz.f32 of a negated input, both in turn, F2FP (cvt.rn.bf16x2.f32, P's
conversion) with a LOP3 back, and fma.rn.f32 as the clock's
yardstick (128 lanes per clock per SM on sm_90), so each MUFU op's results per clock per
SM = its rate / (FFMA's rate / 128). The softcap's diagnosis rests on MUFU.TANH running
at MUFU.EX2's rate (16 per clock per SM); this measures it.

`speed`: forward TFLOP/s over the attended pairs (fa_bench.variants.window_pairs;
triton.testing.do_bench, L2 flushed), bf16, 32 query / 8 KV heads, head_dim 128, causal,
softcap 50 with and without a 4k window, at 8 × 8k and 2 × 16k: each candidate
(`CANDIDATES`: the default, the packed bf16 row sums (with P rounded on the ALU too), no
ping-pong, ring depth 2, 64-key blocks, three consumers) timed twice in turn with the
dense Gluon kernel of the same shape, and its output's largest difference from the
default's (a smoke check; the GPU tests apply the accuracy
rule). Candidates' kernels are compiled first in parallel worker processes.

`summary`: from a `fa-bench run` of tools/gpu/variants_gluon_s7.toml (with the plugin's
candidates), each softcap case ÷ its dense control of the same implementation, with the
SM clock and the energy per call NVML read: the H200 runs these kernels at its power cap,
so a kernel's TFLOP/s follow its energy per call as much as its clocks per block.

Writes $OUT/variants_gluon_s7_{mufu,speed}.{md,json} (OUT defaults to fa-bench-out/out).
A developer tool, not installed.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import multiprocessing as mp
import os
import sys
import time

import torch

HQ, HKV, D, CAP = 32, 8, 128, 50.0
# name -> (flash_gluon_varhost switches turned on, FlashConfig gluon_* fields)
SUM = ("SOFTCAP_SUM_BF16",)
CANDIDATES: dict[str, tuple[tuple[str, ...], dict]] = {
    "default": ((), {}),
    "sum-bf16": (SUM, {}),
    "nopp": ((), dict(gluon_pingpong=False)),
    "sum-bf16 nopp": (SUM, dict(gluon_pingpong=False)),
    # P rounded on the integer ALU, not by F2FP (in case F2FP shares the MUFU's pipe)
    "sum-bf16 palu": ((*SUM, "SOFTCAP_P_ALU"), {}),
    "s2": ((), dict(gluon_stages=2)),
    # the SASS's three fewest instructions per score together (5.5 against the default's 6.1)
    "sum-bf16 nopp s2": (SUM, dict(gluon_pingpong=False, gluon_stages=2)),
    "n64 s4": ((), dict(gluon_block_n=64, gluon_stages=4)),
    # three consumer warpgroups (192 rows, no ping-pong) over 64-key blocks: 160 registers
    # each, no spills (the 128-key form spilled in session 6); variant_config turns a
    # three-consumer launch into the plain one, so this runs through variant_forward
    "c3 n64 s4": ((), dict(consumers=3, block_n=64, stages=4, pingpong=False)),
}
# candidates launched directly with these GluonConfig fields (not FlashConfig's)
DIRECT = {"c3 n64 s4": dict(consumer_regs=160)}
# (batch, N, window left or None, the candidates timed there)
SHAPES = (
    (8, 8192, None, tuple(CANDIDATES)),
    (2, 16384, None, ("default", "sum-bf16", "nopp", "sum-bf16 palu")),
    (8, 8192, 4096, ("default", "sum-bf16", "nopp", "sum-bf16 palu")),
    (2, 16384, 4096, ("default", "sum-bf16", "nopp", "sum-bf16 palu")),
)


def _out(name: str) -> str:
    folder = os.environ.get("OUT", "fa-bench-out/out")
    os.makedirs(folder, exist_ok=True)
    return os.path.join(folder, name)


# --- the MUFU's rates -------------------------------------------------------------------

_OPS = {
    "tanh": "tanh.approx.f32 $0, $1;",
    "ex2": "{ .reg .f32 t; neg.f32 t, $1; ex2.approx.ftz.f32 $0, t; }",
    "tanh+ex2": "{ .reg .f32 t; tanh.approx.f32 t, $1; ex2.approx.ftz.f32 $0, t; }",
    "ffma": "fma.rn.f32 $0, $1, 0f3F7FFFFF, 0f33800000;",
    # F2FP (cvt.rn.bf16x2.f32, P's conversion) then a LOP3 back to fp32: ~16 if F2FP
    # issues on the MUFU's pipe, more if on the ALU's
    "f2fp+lop3": "{ .reg .b32 p; cvt.rn.bf16x2.f32 p, $1, $1; and.b32 $0, p, 0xffff0000; }",
}


def _mufu_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def chain(x_ptr, ASM: tl.constexpr, ITERS: tl.constexpr, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + offs)
        for _ in range(ITERS):
            for _u in tl.static_range(8):
                x = tl.inline_asm_elementwise(ASM, "=r,r", [x], dtype=tl.float32,
                                              is_pure=True, pack=1)  # fmt: skip
        tl.store(x_ptr + offs, x)

    return chain


def mufu() -> list[dict]:
    """Each op's results per second, and per clock per SM against FFMA's 128."""
    from triton.testing import do_bench

    chain = _mufu_kernel()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    block, ctas, iters = 1024, sms * 16, 512
    x = torch.rand(block * ctas, device="cuda") * 0.5 + 0.25
    rows = []
    for name, asm in _OPS.items():
        fn = lambda asm=asm: chain[(ctas,)](x, ASM=asm, ITERS=iters, BLOCK=block, num_warps=4)  # noqa: E731
        fn()
        torch.cuda.synchronize()
        ms = do_bench(fn, warmup=25, rep=200)
        ops = block * ctas * iters * 8 * (2 if name == "tanh+ex2" else 1)
        rows.append(dict(op=name, ms=ms, gops=ops / ms / 1e6))
    ffma = next(r["gops"] for r in rows if r["op"] == "ffma")
    for r in rows:
        r["per_clock_per_sm"] = 128.0 * r["gops"] / ffma
    return rows


def _mufu_md(rows: list[dict]) -> str:
    lines = [
        "| op (dependent chains) | ms | Gop/s | per clock per SM (FFMA = 128) |",
        "|---|---|---|---|",
    ]
    lines += [f"| {r['op']} | {r['ms']:.3f} | {r['gops']:.0f} | {r['per_clock_per_sm']:.1f} |"
              for r in rows]  # fmt: skip
    return "\n".join(lines) + "\n"


# --- the candidates' speed ----------------------------------------------------------------


def _call(name: str, q, k, v, window):
    """The forward of candidate `name` (None: the dense Gluon kernel)."""
    from fa_bench.kernels import FlashConfig, flash_attention

    if name is None:
        return lambda: flash_attention(q, k, v, causal=True)
    switches, fields = CANDIDATES[name]
    if name in DIRECT:
        return _direct(q, k, v, window, switches, dict(fields, **DIRECT[name]))
    cfg = FlashConfig(forward="gluon", **fields)
    kw = dict(causal=True, softcap=CAP, config=cfg)
    if window is not None:
        kw["window"] = (window, -1)
    return lambda: _switched(switches, lambda: flash_attention(q, k, v, **kw))


def _switched(switches: tuple[str, ...], fn):
    """fn() with these flash_gluon_varhost switches on, the old values back after."""
    from fa_bench.kernels import flash_gluon_varhost as vh

    saved = {n: getattr(vh, n) for n in switches}
    for n in switches:
        setattr(vh, n, True)
    try:
        return fn()
    finally:
        for n, value in saved.items():
            setattr(vh, n, value)


def _direct(q, k, v, window, switches: tuple[str, ...], fields: dict):
    """A launch the dispatch would not take, run by flash_gluon_varhost.variant_forward."""
    from fa_bench.kernels import flash_gluon_varhost as vh
    from fa_bench.kernels.flash_gluon import GluonConfig
    from fa_bench.kernels.flash_validate import make_variant

    b, _h, n, d = q.shape
    variant = make_variant(q, causal=True, window=(-1, -1) if window is None else (window, -1),
                           alibi_slopes=None, softcap=CAP, batch=b, seq_q=n, seq_k=n)  # fmt: skip
    cfg = GluonConfig(**fields)
    return lambda: _switched(
        switches, lambda: vh.variant_forward(q, k, v, True, d**-0.5, cfg, variant)[0]
    )


def _inputs(b: int, n: int, seed: int = 0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return tuple(
        torch.randn((b, h, n, D), generator=g, device="cuda").to(torch.bfloat16)
        for h in (HQ, HKV, HKV)
    )


def _warm(job: tuple) -> str:
    """A worker process: compile candidate `job[0]` (with window `job[1]`) by one small call
    (the kernels specialise on no shape here: lengths divisible by 16, none equal to 1)."""
    name, window = job
    q, k, v = _inputs(2, 1024)
    _call(name, q, k, v, window)()
    torch.cuda.synchronize()
    return f"{name} window={window}"


def warm(workers: int) -> None:
    jobs = sorted({(c, w) for _b, _n, w, cands in SHAPES for c in cands}, key=str)
    jobs += [(None, None)]
    ctx = mp.get_context("spawn")
    with cf.ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
        for done in pool.map(_warm, jobs):
            print(f"compiled {done}", flush=True)


def _bench(fn) -> float:
    from triton.testing import do_bench

    return do_bench(fn, warmup=25, rep=100)


def speed(quick: bool, deadline: float) -> list[dict]:
    """One row per (shape, candidate): TFLOP/s of the candidate and the dense kernel, each
    the mean of two timings taken in turn, and max |o − o_default|."""
    from fa_bench.variants import window_pairs

    rows = []
    for b, n, window, cands in SHAPES[:1] if quick else SHAPES:
        q, k, v = _inputs(b, n)
        flops = 4.0 * window_pairs(n, n, True, -1 if window is None else window) * D * b * HQ
        dense_flops = 4.0 * window_pairs(n, n, True) * D * b * HQ
        ref = _call("default", q, k, v, window)()
        dense = _call(None, q, k, v, None)
        for name in cands:
            if time.time() > deadline:
                print(f"time budget spent before {name} at {b} x {n}", flush=True)
                return rows
            fn = _call(name, q, k, v, window)
            diff = (fn().float() - ref.float()).abs().max().item()
            t_c, t_d = [], []
            for _ in range(2):
                t_d.append(_bench(dense))
                t_c.append(_bench(fn))
            tf_c = flops / (sum(t_c) / 2) / 1e9
            tf_d = dense_flops / (sum(t_d) / 2) / 1e9
            row = dict(shape=f"{b} x {n}", window=window, candidate=name, tflops=tf_c,
                       dense=tf_d, ratio=tf_c / tf_d, max_diff_vs_default=diff)  # fmt: skip
            print(row, flush=True)
            rows.append(row)
            _write("speed", rows, _speed_md(rows))  # as it goes: a step cap may cut it
    return rows


def _speed_md(rows: list[dict]) -> str:
    lines = [
        "| shape | window | candidate | TFLOP/s | dense | ÷ dense | max |o − o_default| |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['shape']} | {r['window'] or '–'} | {r['candidate']} | {r['tflops']:.1f} | "
            f"{r['dense']:.1f} | {r['ratio']:.3f} | {r['max_diff_vs_default']:.2e} |"
        )
    return "\n".join(lines) + "\n"


def summary(path: str) -> str:
    """Markdown: per implementation and shape, the softcap case beside its control."""
    with open(path) as f:
        cases = json.load(f)["cases"]
    lines = [
        "| impl | case | status | acc | TFLOP/s | ÷ control | SM MHz (timing) | J per call | "
        "backend |",
        "|---|---|---|---|---|---|---|---|---|",
    ]

    def shape(r: dict) -> tuple:
        return (r["impl"], r["mode"], r["dtype"], r["batch"], r["seqlen_q"])

    def dense(r: dict) -> bool:
        variant = ("softcap", "alibi", "varlen")
        return not any(r.get(k) for k in variant) and r.get("window_left", -1) == -1

    controls = {shape(r): r for r in cases if dense(r)}
    for r in sorted(cases, key=lambda r: (r["impl"], r["seqlen_q"], bool(r.get("softcap")))):
        ctrl = controls.get(shape(r)) if r.get("softcap") else None
        t, c = r.get("tflops"), (ctrl or {}).get("tflops")
        clock = ((r.get("timing") or {}).get("sm_clock_mhz") or {}).get("mean")
        joules = (r.get("telemetry") or {}).get("energy_j_per_call")
        lines.append(
            f"| {r['impl']} | {r['id'].split('/', 1)[1]} | {r['status']} | "
            f"{(r.get('accuracy') or {}).get('passed')} | {f'{t:.1f}' if t else '–'} | "
            f"{f'{t / c:.3f}' if t and c else '–'} | {f'{clock:.0f}' if clock else '–'} | "
            f"{f'{joules:.3f}' if joules else '–'} | {r.get('backend') or ''} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=("mufu", "speed", "summary"))
    ap.add_argument("results", nargs="?", help="summary: a fa-bench run's results.json")
    ap.add_argument("--quick", action="store_true", help="speed: 8 x 8k without a window only")
    ap.add_argument(
        "--budget", type=float, default=60.0, help="speed: seconds from the start to stop timing"
    )
    ap.add_argument("--workers", type=int, default=8, help="speed: compile processes")
    args = ap.parse_args()
    if args.what == "summary":
        print(summary(args.results))
        return 0
    deadline = time.time() + args.budget  # from the start: compiling counts too
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}", flush=True)
    if args.what == "mufu":
        rows = mufu()
        text = _mufu_md(rows)
    else:
        warm(args.workers)
        rows = speed(args.quick, deadline)
        text = _speed_md(rows)
    print(text, flush=True)
    _write(args.what, rows, text)
    return 0


def _write(what: str, rows: list[dict], text: str) -> None:
    with open(_out(f"variants_gluon_s7_{what}.md"), "w") as f:
        f.write(text)
    with open(_out(f"variants_gluon_s7_{what}.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
