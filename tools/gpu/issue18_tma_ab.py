"""The one-pass backward's dQ adds: pointer atomics against the TMA reduce-add
(`FlashConfig(use_tma=True)`), and the two-kernel backward (the default) for scale, timed with
`triton.testing.do_bench` (median, L2 flushed) on the heuristic's tiles; bf16, 16k tokens,
hidden 2048 (the standard suite's shapes). Backward only: the forward runs once per shape
and the timed call is `torch.autograd.grad` with a retained graph.

    python tools/gpu/issue18_tma_ab.py

A developer tool, not installed; needs a CUDA GPU (TMA: sm_90+).
"""

from __future__ import annotations

import dataclasses

import torch
from triton.testing import do_bench

from fa_bench.kernels.flash_attention import flash_attention
from fa_bench.kernels.flash_config import heuristic_config
from fa_bench.models import case_flops


def main() -> None:
    from fa_bench.case import Case

    print("| D | N | causal | one-pass atomics | one-pass TMA reduce-add | two-kernel |")
    print("|---|---|---|---|---|---|")
    for d, n, causal in [(128, 16384, False), (128, 16384, True), (64, 4096, False)]:
        b, h = 16384 // n, 2048 // d
        q, k, v = (
            torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            for _ in range(3)
        )
        do = torch.randn_like(q)
        base = heuristic_config(d, q.dtype, causal, q.device, n)
        case = Case("triton", "bwd", "bf16", b, h, h, n, n, d, causal)
        work = case_flops(case)
        cells = []
        for cfg, det in ((base, False), (dataclasses.replace(base, use_tma=True), False),
                         (base, True)):  # fmt: skip
            o = flash_attention(q, k, v, causal=causal, config=cfg, deterministic=det)

            def step(o=o, inputs=(q, k, v), do=do) -> None:
                torch.autograd.grad(o, inputs, do, retain_graph=True)

            ms = do_bench(step, warmup=25, rep=200)
            cells.append(f"{work / ms / 1e9:.1f} TFLOP/s ({ms:.3f} ms)")
        print(f"| {d} | {n} | {'yes' if causal else 'no'} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
