"""Development benchmark of our Triton FlashAttention against SDPA flash and FlexAttention.

Not the official numbers (those come from `fa-bench run`). Timing: triton.testing.do_bench
median (it flushes L2 between calls); backward = `o.backward(do, retain_graph=True)` with
grads set to None between calls. FLOPs = 4·B·H·N²·D, halved for causal, backward 2.5×.
Every implementation's output is checked against SDPA math in fp32 before it is timed.

    python kernels/bench_dev.py --out results.json [--dims 128 64] [--seqs 4096 8192 16384]
"""

from __future__ import annotations

import argparse
import json
import math
import time

import torch
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

from fa_bench.kernels.flash_attention import flash_attention
from fa_bench.kernels.flash_config import FlashConfig, default_config

# Config variants timed with --variants (overrides of the default config's fields).
VARIANTS = {
    "triton-tma": {"use_tma": True},
    "triton-notma": {"use_tma": False},
    "triton-bn64": {"block_n": 64},
    "triton-bn128": {"block_n": 128, "num_warps": 8},
    "triton-s2": {"num_stages": 2},
    "triton-b-s3": {"bwd_num_stages": 3},
    "triton-b-m32": {"bwd_block_m": 32},
    "triton-b-m32s3": {"bwd_block_m": 32, "bwd_num_stages": 3},
}
BWD = ("triton-b-s3", "triton-b-m32", "triton-b-m32s3")


def _flops(batch, heads, n, d, causal, mode):
    f = 4 * batch * heads * n * n * d / (2 if causal else 1)
    return f * (2.5 if mode == "bwd" else 1.0)


def _sdpa_flash(q, k, v, causal):
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)


_FLEX = {}


def _flex(q, k, v, causal):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    if "fn" not in _FLEX:
        _FLEX["fn"] = torch.compile(flex_attention, dynamic=False)
    key = (q.shape, causal)
    if key not in _FLEX:
        mask = None
        if causal:
            n = q.shape[2]
            mask = create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, n, n)
        _FLEX[key] = mask
    return _FLEX["fn"](q, k, v, block_mask=_FLEX[key])


def _time(fn, q, k, v, mode):
    if mode == "fwd":
        with torch.no_grad():
            return triton.testing.do_bench(lambda: fn(q, k, v), return_mode="median")
    o = fn(q, k, v)
    do = torch.randn_like(o)
    return triton.testing.do_bench(
        lambda: o.backward(do, retain_graph=True), grad_to_none=[q, k, v], return_mode="median"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench_dev.json")
    ap.add_argument("--dims", type=int, nargs="+", default=[128, 64])
    ap.add_argument("--seqs", type=int, nargs="+", default=[4096, 8192, 16384])
    ap.add_argument("--flex-seqs", type=int, nargs="*", default=[16384])
    ap.add_argument("--variants", action="store_true", help="also time config variants")
    args = ap.parse_args()
    dev = torch.device("cuda")
    cap = torch.cuda.get_device_capability(dev)
    rows = []
    for d in args.dims:
        for n in args.seqs:
            for causal in (False, True):
                b, h = 16384 // n, 2048 // d
                torch.manual_seed(0)
                q, k, v = (
                    torch.randn(b, h, n, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
                    for _ in range(3)
                )
                base = default_config(d, torch.bfloat16, causal, cap, "fwd_bwd", n)
                impls = {
                    "triton": lambda q, k, v, c=base, cz=causal: flash_attention(
                        q, k, v, causal=cz, config=c
                    )
                }
                if args.variants:
                    for name, over in VARIANTS.items():
                        try:
                            c = FlashConfig(**{**base.__dict__, **over})
                        except ValueError:
                            continue
                        impls[name] = lambda q, k, v, c=c, cz=causal: flash_attention(
                            q, k, v, causal=cz, config=c
                        )
                impls["sdpa_flash"] = lambda q, k, v, cz=causal: _sdpa_flash(q, k, v, cz)
                if n in args.flex_seqs and d == 128:
                    impls["flex"] = lambda q, k, v, cz=causal: _flex(q, k, v, cz)
                with torch.no_grad():
                    ref = _sdpa_flash(q, k, v, causal).float()
                for name, fn in impls.items():
                    for mode in ("fwd", "bwd"):
                        if name == "flex" and mode == "bwd":
                            continue
                        if mode == "bwd" and name.startswith("triton-") and name not in BWD:
                            continue  # this variant differs in forward fields only
                        row = dict(impl=name, d=d, n=n, b=b, h=h, causal=causal, mode=mode)
                        try:
                            if mode == "fwd":
                                with torch.no_grad():
                                    err = (fn(q, k, v).float() - ref).abs().max().item()
                                row["max_err_vs_sdpa"] = err
                                if not math.isfinite(err) or err > 0.05:
                                    raise RuntimeError(f"output mismatch: max err {err}")
                            t0 = time.time()
                            ms = _time(fn, q, k, v, mode)
                            row.update(
                                ms=ms,
                                tflops=_flops(b, h, n, d, causal, mode) / ms * 1e-9,
                                wall_s=time.time() - t0,
                            )
                        except Exception as exc:  # a dev script: record and go on
                            row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                        rows.append(row)
                        print(json.dumps(row), flush=True)
                del q, k, v
                torch.cuda.empty_cache()
    meta = dict(
        date=time.strftime("%Y-%m-%d"),
        gpu=torch.cuda.get_device_name(dev),
        torch=torch.__version__,
        triton=triton.__version__,
    )
    with open(args.out, "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=1)
    print(meta)
    print(f"{'impl':14} {'d':>4} {'n':>6} {'causal':>6} {'fwd':>7} {'bwd':>7}")
    table = {}
    for r in rows:
        table.setdefault((r["impl"], r["d"], r["n"], r["causal"]), {})[r["mode"]] = r.get(
            "tflops", float("nan")
        )
    for (impl, d, n, causal), m in table.items():
        print(
            f"{impl:14} {d:4} {n:6} {causal!s:>6} {m.get('fwd', float('nan')):7.1f} "
            f"{m.get('bwd', float('nan')):7.1f}"
        )


if __name__ == "__main__":
    main()
