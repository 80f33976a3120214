"""A/B of the fp8 forward's launch choices on the GPU (issue 21, item 3), beside our bf16
forward: tiles and stages, the descriptor (TMA) path, and V K-major (prepared once)
against V in the ordinary layout (the kernel then reads it row-major and the compiler
transposes it for wgmma). The first run (2026-11-30) is in docs/kernel.md.

    python tools/gpu/fp8_bench.py OUT.md [--json OUT.json]

16k tokens per shape (batch = 16384 / N), hidden 2048 (heads = 2048 / D); `do_bench`
medians with triton's default L2 flush, TFLOP/s from fa_bench.models (the FLOPs every
dtype is counted with). A development tool, not installed.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
import triton.testing

from fa_bench import models
from fa_bench.case import Case
from fa_bench.kernels import flash_fp8
from fa_bench.kernels.flash_attention import flash_attention
from fa_bench.kernels.flash_config import FlashConfig
from fa_bench.kernels.flash_fp8 import flash_attention_fp8, fp8_v_layout, quantize_fp8

# (label, FlashConfig fields or None = the default heuristic) per head_dim
VARIANTS = {
    128: [
        ("default", None),
        ("128x128 w8 s3 (bf16 tiles)", dict(block_m=128, block_n=128, num_warps=8, num_stages=3)),
        ("128x128 w8 s4", dict(block_m=128, block_n=128, num_warps=8, num_stages=4)),
        ("128x64 w4 s4", dict(block_m=128, block_n=64, num_warps=4, num_stages=4)),
        ("tma 128x64 w4 s3", dict(block_m=128, block_n=64, num_warps=4, num_stages=3,
                                  use_tma=True)),
    ],
    64: [
        ("default", None),
        ("128x128 w8 s3", dict(block_m=128, block_n=128, num_warps=8, num_stages=3)),
        ("128x64 w4 s4", dict(block_m=128, block_n=64, num_warps=4, num_stages=4)),
    ],
}  # fmt: skip


def _tflops(case: Case, ms: float) -> float:
    return models.tflops(models.case_flops(case), ms)


def _shape_rows(d: int, n: int, causal: bool) -> list[dict]:
    b, h = 16384 // n, 2048 // d
    case = Case(impl="triton", mode="fwd", dtype="bf16", batch=b, heads_q=h, heads_kv=h,
                seqlen_q=n, seqlen_k=n, head_dim=d, causal=causal)  # fmt: skip
    q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    (q8, qd), (k8, kd), (v8, vd) = (quantize_fp8(t) for t in (q, k, v))
    vt = fp8_v_layout(v8)
    scales = dict(q_descale=qd, k_descale=kd, v_descale=vd)
    rows = []

    def bench(label: str, fn) -> None:
        try:
            ms = triton.testing.do_bench(fn, warmup=25, rep=100)
            rows.append(dict(d=d, n=n, causal=causal, variant=label, ms=ms,
                             tflops=_tflops(case, ms)))  # fmt: skip
        except Exception as exc:  # a config that does not fit is a finding, not a stop
            rows.append(dict(d=d, n=n, causal=causal, variant=label, error=str(exc)[:200]))

    bench("bf16 (flash_attention)", lambda: flash_attention(q, k, v, causal=causal))
    for label, fields in VARIANTS[d]:
        cfg = FlashConfig(**fields) if fields else None
        bench(f"fp8 {label}", lambda cfg=cfg: flash_attention_fp8(
            q8, k8, vt, **scales, causal=causal, config=cfg))  # fmt: skip
    # V in the ordinary layout, straight to the launcher (the API would copy it first)
    cfg = flash_fp8.default_fp8_config(q8, n, causal)
    scale = 1.0 / d**0.5
    bench("fp8 default, V row-major", lambda: flash_fp8._forward_fp8(
        q8, k8, v8, scales, causal, scale, cfg))  # fmt: skip
    return rows


def _markdown(rows: list[dict]) -> str:
    lines = [
        "| D | N | causal | variant | ms | TFLOP/s | ÷ bf16 |",
        "|---|---|---|---|---|---|---|",
    ]
    base: dict[tuple, float] = {}
    for r in rows:
        key = (r["d"], r["n"], r["causal"])
        if "error" in r:
            lines.append(f"| {r['d']} | {r['n']} | {r['causal']} | {r['variant']} | error: "
                         f"{r['error'][:80]} | | |")  # fmt: skip
            continue
        if r["variant"].startswith("bf16"):
            base[key] = r["tflops"]
        ratio = r["tflops"] / base[key] if key in base else float("nan")
        lines.append(f"| {r['d']} | {r['n']} | {r['causal']} | {r['variant']} | {r['ms']:.3f} "
                     f"| {r['tflops']:.1f} | {ratio:.3f} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_md")
    parser.add_argument("--json")
    parser.add_argument("--head-dims", default="128,64")
    parser.add_argument("--seqlens", default="4096,16384")
    args = parser.parse_args(argv)
    rows: list[dict] = []
    for d in (int(x) for x in args.head_dims.split(",")):
        for n in (int(x) for x in args.seqlens.split(",")):
            for causal in (False, True):
                rows.extend(_shape_rows(d, n, causal))
                with open(args.out_md, "w") as f:  # written as it goes: a timeout keeps rows
                    f.write(f"# fp8 forward A/B ({torch.cuda.get_device_name()})\n\n")
                    f.write(_markdown(rows))
                if args.json:
                    with open(args.json, "w") as f:
                        json.dump(rows, f, indent=1)
    print(_markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
