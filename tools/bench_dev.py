"""Development benchmark of our Triton FlashAttention against SDPA flash and FlexAttention.

Not the official numbers (those come from `fa-bench run`). Timing: triton.testing.do_bench
median (it flushes L2 between calls); backward = `o.backward(do, retain_graph=True)` with
grads set to None between calls. FLOPs are the project's (fa_bench.models.case_flops), so
TFLOP/s compare with `fa-bench run`'s. Every implementation's forward output is checked
against the project's float64 reference (fa_bench.run.accuracy.check_accuracy, the rule
`fa-bench run` applies) before it is timed.

A developer tool, not installed with the package. On a CUDA machine, from the repo root:

    python tools/bench_dev.py --out results.json [--dims 128 64] [--seqs 4096 8192 16384]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

import torch
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

from fa_bench.case import Case
from fa_bench.kernels.flash_attention import flash_attention
from fa_bench.kernels.flash_config import FlashConfig, default_config
from fa_bench.models import case_flops
from fa_bench.run.accuracy import check_accuracy

AttnFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]

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
# The shapes keep the work per call constant: batch = TOKENS / N, heads = WIDTH / D.
TOKENS = 16384
WIDTH = 2048


def _sdpa_flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)


_FLEX: dict = {}


def _flex(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    if "fn" not in _FLEX:
        _FLEX["fn"] = torch.compile(flex_attention, dynamic=False)
    key = (q.shape, causal)
    if key not in _FLEX:
        mask = None
        if causal:
            n = q.shape[2]
            # a mask_mod takes (batch, head, q_idx, kv_idx)
            mask = create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, n, n)
        _FLEX[key] = mask
    return _FLEX["fn"](q, k, v, block_mask=_FLEX[key])


def _time_ms(fn: AttnFn, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mode: str) -> float:
    if mode == "fwd":
        with torch.no_grad():
            return triton.testing.do_bench(lambda: fn(q, k, v), return_mode="median")
    o = fn(q, k, v)
    do = torch.randn_like(o)
    return triton.testing.do_bench(
        lambda: o.backward(do, retain_graph=True), grad_to_none=[q, k, v], return_mode="median"
    )


def _impls(base: FlashConfig, causal: bool, flex: bool, variants: bool) -> dict[str, AttnFn]:
    def ours(cfg: FlashConfig) -> AttnFn:
        return lambda q, k, v: flash_attention(q, k, v, causal=causal, config=cfg)

    impls = {"triton": ours(base)}
    if variants:
        for name, over in VARIANTS.items():
            try:
                impls[name] = ours(FlashConfig(**{**base.__dict__, **over}))
            except ValueError:
                continue
    impls["sdpa_flash"] = lambda q, k, v: _sdpa_flash(q, k, v, causal)
    if flex:
        impls["flex"] = lambda q, k, v: _flex(q, k, v, causal)
    return impls


def _measure(
    name: str, fn: AttnFn, case: Case, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> dict:
    """One (impl, mode) row: accuracy (forward) then timing; errors are recorded."""
    row = dict(impl=name, d=case.head_dim, n=case.seqlen_q, b=case.batch, h=case.heads_q,
               causal=case.causal, mode=case.mode.value)  # fmt: skip
    try:
        if case.mode.value == "fwd":
            with torch.no_grad():
                acc = check_accuracy(case, q, k, v, fn(q, k, v))
            row["max_err_vs_reference"] = acc["max_abs_err"]
            if not acc["passed"]:
                raise RuntimeError(f"output mismatch: max err {acc['max_abs_err']}")
        t0 = time.time()
        ms = _time_ms(fn, q, k, v, case.mode.value)
        row.update(ms=ms, tflops=case_flops(case) / ms * 1e-9, wall_s=time.time() - t0)
    except Exception as exc:  # a dev script: record and go on
        row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    return row


def _shape_rows(d: int, n: int, causal: bool, args: argparse.Namespace) -> list[dict]:
    dev = torch.device("cuda")
    b, h = TOKENS // n, WIDTH // d
    torch.manual_seed(0)
    q, k, v = (
        torch.randn(b, h, n, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
        for _ in range(3)
    )
    base = default_config(d, torch.bfloat16, causal, torch.cuda.get_device_capability(dev), n)
    impls = _impls(base, causal, n in args.flex_seqs and d == 128, args.variants)
    rows = []
    for name, fn in impls.items():
        for mode in ("fwd", "bwd"):
            if name == "flex" and mode == "bwd":
                continue
            if mode == "bwd" and name.startswith("triton-") and name not in BWD:
                continue  # this variant differs in forward fields only
            case = Case(name, mode, "bf16", b, h, h, n, n, d, causal)
            rows.append(_measure(name, fn, case, q, k, v))
            print(json.dumps(rows[-1]), flush=True)
    del q, k, v
    torch.cuda.empty_cache()
    return rows


def _print_table(rows: list[dict]) -> None:
    print(f"{'impl':14} {'d':>4} {'n':>6} {'causal':>6} {'fwd':>7} {'bwd':>7}")
    table: dict[tuple, dict] = {}
    for r in rows:
        key = (r["impl"], r["d"], r["n"], r["causal"])
        table.setdefault(key, {})[r["mode"]] = r.get("tflops", float("nan"))
    for (impl, d, n, causal), m in table.items():
        print(
            f"{impl:14} {d:4} {n:6} {causal!s:>6} {m.get('fwd', float('nan')):7.1f} "
            f"{m.get('bwd', float('nan')):7.1f}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="bench_dev.json")
    ap.add_argument("--dims", type=int, nargs="+", default=[128, 64])
    ap.add_argument("--seqs", type=int, nargs="+", default=[4096, 8192, 16384])
    ap.add_argument("--flex-seqs", type=int, nargs="*", default=[16384])
    ap.add_argument("--variants", action="store_true", help="also time config variants")
    args = ap.parse_args()
    rows = []
    for d in args.dims:
        for n in args.seqs:
            for causal in (False, True):
                rows += _shape_rows(d, n, causal, args)
    meta = dict(
        date=time.strftime("%Y-%m-%d"),
        gpu=torch.cuda.get_device_name(0),
        torch=torch.__version__,
        triton=triton.__version__,
    )
    with open(args.out, "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=1)
    print(meta)
    _print_table(rows)


if __name__ == "__main__":
    main()
