"""Our kernel's variants against its dense kernel, timed directly (do_bench, L2 flushed):
bf16, 32 query / 8 KV heads, head_dim 128. A sliding window of 4k at 32k causal (batch 2)
with the forward's key tile at 128 (the dense default) and 64 (no register spills on
sm_90, but 13% slower there on 2026-11-30); softcap 50 (tanh.approx.f32, libdevice's tanh,
tanh.approx.bf16x2) and ALiBi at 8k causal (batch 8); forward and backward. The dense
controls run the library's choice (the Gluon forward on sm_90) and our `tl` kernel, the
one the variants run. TFLOP/s count the attended pairs only
(fa_bench.variants.window_pairs), as `fa-bench run` does.

    python tools/gpu/variants_bench.py > variants_bench.md

A developer tool, not installed.
"""

from __future__ import annotations

import dataclasses
import sys

import torch
from triton.testing import do_bench

from fa_bench.case import alibi_slopes
from fa_bench.kernels import FlashConfig, flash_attention, flash_validate
from fa_bench.kernels.flash_config import heuristic_config
from fa_bench.variants import window_pairs

HQ, HKV, D = 32, 8, 128


def _tflops(flops: float, ms: float) -> float:
    return flops / ms / 1e9


def _one(batch: int, n: int, cfg: FlashConfig, mode: str, **kw: object) -> float:
    # the softcap's tanh: "approx" (tanh.approx.f32, the default), "precise" (libdevice),
    # "bf16x2" (two per instruction)
    tanh = kw.pop("tanh", "approx")
    flash_validate.FAST_TANH = tanh != "precise"
    flash_validate.PACKED_TANH = tanh == "bf16x2"
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn((batch, HQ, n, D), device="cuda", generator=g, dtype=torch.bfloat16)
    k = torch.randn((batch, HKV, n, D), device="cuda", generator=g, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    left = kw.get("window", (-1, -1))[0]  # type: ignore[index]
    pairs = window_pairs(n, n, True, left)
    flops = 4.0 * pairs * D * batch * HQ
    if mode == "fwd":
        ms = do_bench(lambda: flash_attention(q, k, v, causal=True, config=cfg, **kw))
        return _tflops(flops, ms)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    o = flash_attention(q, k, v, causal=True, config=cfg, **kw)
    do = torch.randn_like(o)
    ms = do_bench(lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True))
    return _tflops(2.5 * flops, ms)


def main() -> int:
    slopes = torch.tensor(alibi_slopes(HQ), dtype=torch.float32, device="cuda")
    # (name, batch, N, kwargs, forward key tiles): the dense tiles (128; the 2026-11-30
    # run had the variants at 64, which the window's 128 beat by 13%), the window at both
    rows = [
        ("dense causal", 2, 32768, {}, (128,)),
        ("window 4096", 2, 32768, dict(window=(4096, -1)), (64, 128)),
        ("dense causal", 8, 8192, {}, (128,)),
        ("softcap 50", 8, 8192, dict(softcap=50.0), (128,)),
        ("alibi", 8, 8192, dict(alibi_slopes=slopes), (128,)),
        ("softcap 50, libdevice tanh", 8, 8192, dict(softcap=50.0, tanh="precise"), (128,)),
        ("softcap 50, bf16x2 tanh", 8, 8192, dict(softcap=50.0, tanh="bf16x2"), (128,)),
    ]
    gpu = torch.cuda.get_device_name()
    print(f"torch {torch.__version__}, {gpu}; bf16, {HQ}/{HKV} heads, D {D}")
    print("\n| variant | B × N | fwd (key tile) | bwd |\n|---|---|---|---|")
    for name, batch, n, kw, tiles in rows:
        base = heuristic_config(D, torch.bfloat16, True, torch.device("cuda"), n)
        cells = []
        for bn in tiles:
            cfg = dataclasses.replace(base, block_n=bn)
            try:
                cells.append(f"{_one(batch, n, cfg, 'fwd', **kw):.1f} ({bn})")
            except Exception as e:  # a compile or launch failure is a result here
                cells.append(f"error {type(e).__name__}: {str(e)[:80]}")
        if not kw:  # the dense control also in our `tl` kernel (the variants' kernel)
            tl_cfg = dataclasses.replace(base, forward="tl")
            cells.append(f"{_one(batch, n, tl_cfg, 'fwd'):.1f} (tl)")
        try:
            bwd = f"{_one(batch, n, base, 'bwd', **kw):.1f}"
        except Exception as e:
            bwd = f"error {type(e).__name__}: {str(e)[:80]}"
        print(f"| {name} | {batch} × {n} | {', '.join(cells)} | {bwd} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
