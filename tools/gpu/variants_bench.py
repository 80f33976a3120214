"""Our kernel's variants against its dense kernel, timed directly (do_bench, L2 flushed):
bf16, 32 query / 8 KV heads, head_dim 128. A sliding window of 4k at 32k causal (batch 2),
softcap 50 and ALiBi at 8k causal (batch 8), each with the forward's key tile at 128 (the
dense default) and 64 (no register spills with the variants on sm_90, see
tools/kernel_ir.py), forward and backward. TFLOP/s count the attended pairs only
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
    # precise: the softcap's libdevice tanh instead of tanh.approx.f32
    flash_validate.FAST_TANH = not kw.pop("precise", False)
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
    rows = [
        ("dense causal", 2, 32768, {}),
        ("window 4096", 2, 32768, dict(window=(4096, -1))),
        ("dense causal", 8, 8192, {}),
        ("softcap 50", 8, 8192, dict(softcap=50.0)),
        ("softcap 50, libdevice tanh", 8, 8192, dict(softcap=50.0, precise=True)),
        ("alibi", 8, 8192, dict(alibi_slopes=slopes)),
        ("window 4096 + softcap 50", 2, 32768, dict(window=(4096, -1), softcap=50.0)),
    ]
    gpu = torch.cuda.get_device_name()
    print(f"torch {torch.__version__}, {gpu}; bf16, {HQ}/{HKV} heads, D {D}")
    print("\n| variant | B × N | fwd bn128 | fwd bn64 | bwd |\n|---|---|---|---|---|")
    for name, batch, n, kw in rows:
        kw = dict(kw)
        base = heuristic_config(D, torch.bfloat16, True, torch.device("cuda"), n)
        cells = []
        for bn in (128, 64):
            cfg = dataclasses.replace(base, block_n=bn)
            try:
                cells.append(f"{_one(batch, n, cfg, 'fwd', **kw):.1f}")
            except Exception as e:  # a compile or launch failure is a result here
                cells.append(f"error {type(e).__name__}: {str(e)[:80]}")
        try:
            cells.append(f"{_one(batch, n, base, 'bwd', **kw):.1f}")
        except Exception as e:
            cells.append(f"error {type(e).__name__}: {str(e)[:80]}")
        print(f"| {name} | {batch} × {n} | " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
