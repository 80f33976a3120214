"""The speed half of tools/gpu/variants_gluon.py: forward TFLOP/s over the attended
pairs (fa_bench.variants.window_pairs; triton.testing.do_bench, L2 flushed), bf16, 32
query / 8 KV heads, head_dim 128, each variant in the Gluon variant kernel ("gluon"), our
`tl` variant kernel ("tl"), beside the dense Gluon kernel of the same shape and flex
(torch.compile'd flex_attention with a block mask) while the time budget lasts. A
developer tool, not installed; run through variants_gluon.py.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Iterator

import torch

from fa_bench.kernels import FlashConfig, flash_attention, flash_attention_varlen
from fa_bench.kernels import flash_gluon_varhost as vh
from fa_bench.variants import alibi_slopes, varlen_lengths, window_pairs

GLUON = FlashConfig(forward="gluon")


def _tl(n: int) -> FlashConfig:
    """Our `tl` kernel with the tiles the library picks for this shape (the variants run
    the dense config of their shape: flash_attention._resolve_config), forced to tl."""
    import dataclasses

    from fa_bench.kernels.flash_config import heuristic_config

    cfg = heuristic_config(D, torch.bfloat16, True, torch.device("cuda"), n)
    return dataclasses.replace(cfg, forward="tl")


def _rand(shape, dtype, g):
    return torch.randn(shape, generator=g, device=g.device).to(dtype)


def _cumulative(lengths: list[int]) -> list[int]:
    total, out = 0, [0]
    for n in lengths:
        total += n
        out.append(total)
    return out


def _slopes(heads: int) -> torch.Tensor:
    return torch.tensor(alibi_slopes(heads), dtype=torch.float32, device="cuda")


HQ, HKV, D = 32, 8, 128


def _bench_qkv(b, n, g):
    dt = torch.bfloat16
    return _rand((b, HQ, n, D), dt, g), _rand((b, HKV, n, D), dt, g), _rand((b, HKV, n, D), dt, g)


def _timed(fn) -> float:
    from triton.testing import do_bench

    fn()
    torch.cuda.synchronize()
    return do_bench(fn)


def _flex(q, k, v, window=None, softcap=0.0, slopes=None, doc=None):
    """A compiled flex_attention call with the block mask of the (causal) window or the
    packed documents and the score_mod of the softcap / ALiBi."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    n = q.shape[2]

    def mask(b, h, i, j):
        keep = j <= i
        if window is not None:
            keep = keep & (i - j <= window)
        if doc is not None:
            keep = keep & (doc[i] == doc[j])
        return keep

    def score(s, b, h, i, j):
        if softcap:
            s = softcap * torch.tanh(s / softcap)
        if slopes is not None:
            s = s - slopes[h] * (i - j).abs()
        return s

    bm = create_block_mask(mask, None, None, n, n, device="cuda")
    fx = torch.compile(flex_attention)
    mod = score if (softcap or slopes is not None) else None
    return lambda: fx(q, k, v, score_mod=mod, block_mask=bm, enable_gqa=True)


# Warm-up mode (a worker process of variants_gluon.py): each timed call runs once, so
# triton compiles it into its on-disk cache for the timing process; nothing is timed.
WARM = False


def _specs() -> list[tuple]:
    """(name, batch, N, flash_attention kwargs, flex kwargs) of every row."""
    slopes = _slopes(HQ)
    return [
        ("window 4096 causal", 2, 32768, dict(window=(4096, -1)), dict(window=4096)),
        ("softcap 50 causal", 8, 8192, dict(softcap=50.0), dict(softcap=50.0)),
        ("alibi causal", 8, 8192, dict(alibi_slopes=slopes), dict(slopes=slopes)),
        ("packed", 0, 0, {}, {}),
        # development modes (flash_gluon_varhost's switches): ALiBi's session 5 form
        # (|i + o − j| per score) beside the default per-column bias
        ("alibi causal [abs]", 8, 8192, dict(alibi_slopes=slopes), {}),
        # softcap as session 5 ran it (no switch: neither of the default's pair), with a
        # fixed offset for the row max (no max, no rescale), and with Q scaled once per
        # tile too (the default since call B)
        ("softcap 50 causal [plain]", 8, 8192, dict(softcap=50.0), {}),
        ("softcap 50 causal [fixed]", 8, 8192, dict(softcap=50.0), {}),
        ("softcap 50 causal [fixed, qscale]", 8, 8192, dict(softcap=50.0), {}),
        # ... with tree-shaped row sums (no row max left to tree)
        ("softcap 50 causal [fixed, qscale, tree]", 8, 8192, dict(softcap=50.0), {}),
        # ... and every 4th / 8th exp2 on the FMA pipes: with fewer instructions per score
        # the two MUFU ops per score (tanh, exp2) may be the limit again
        ("softcap 50 causal [fixed, qscale, emu 4]", 8, 8192, dict(softcap=50.0), {}),
        ("softcap 50 causal [fixed, qscale, emu 8]", 8, 8192, dict(softcap=50.0), {}),
        ("softcap 50 causal [fixed, qscale, emu 2]", 8, 8192, dict(softcap=50.0), {}),
        # tree-shaped row reductions
        ("softcap 50 causal [tree]", 8, 8192, dict(softcap=50.0), {}),
        ("alibi causal [tree]", 8, 8192, dict(alibi_slopes=slopes), {}),
        ("window 4096 causal [tree]", 2, 32768, dict(window=(4096, -1)), {}),
        ("softcap 50 causal [qscale]", 8, 8192, dict(softcap=50.0), {}),
        ("softcap 50 causal [qscale, tree]", 8, 8192, dict(softcap=50.0), {}),
        ("softcap 50 causal [tanh f16x2]", 8, 8192, dict(softcap=50.0), {}),
        ("softcap 50 causal [emu 2]", 8, 8192, dict(softcap=50.0), {}),
        ("softcap 50 causal [emu 4]", 8, 8192, dict(softcap=50.0), {}),
        ("softcap 50 causal [tanh f16x2, emu 4]", 8, 8192, dict(softcap=50.0), {}),
    ]


_SWITCHES = (
    "TREE", "QSCALE", "TANH_F16X2", "ALIBI_ABS", "FIXED_MAX", "SOFTCAP_EMU", "SOFTCAP_FAST",
)  # fmt: skip
N_SPECS = 21  # len(_specs()), without building it (it needs CUDA)
N_MAIN = 4  # the first rows: the targets' shapes (the rest are development modes)


def speed(flex: bool, deadline: float, only: int | None = None) -> Iterator[dict]:
    """Forward TFLOP/s over the attended pairs of each shape and kernel, row by row (a
    row that fails to run is a row with the error); `only`: that row alone."""
    g = torch.Generator(device="cuda").manual_seed(0)
    specs = _specs()
    assert len(specs) == N_SPECS, (len(specs), N_SPECS)
    for name, b, n, kw, fkw in specs if only is None else specs[only : only + 1]:
        try:
            if name == "packed":
                row = _packed_speed(g, flex and time.time() < deadline)
            else:
                row = _shape_speed(g, name, b, n, kw, fkw, flex and time.time() < deadline)
        except Exception as e:  # a launch failure is a result here
            traceback.print_exc()
            error = f"error {type(e).__name__}: {str(e)[:160]}"
            row = {"variant": name, "shape": f"{b} x {n}", "gluon": error}
        print(row, flush=True)
        yield row


def _tflops(flops: float, fn) -> float:
    if WARM:
        fn()
        torch.cuda.synchronize()
        return 0.0
    return flops / _timed(fn) / 1e9


def _shape_speed(g, name: str, b: int, n: int, kw: dict, fkw: dict, flex: bool) -> dict:
    """One (B, N) causal shape: the variant in each kernel and the dense Gluon kernel."""
    q, k, v = _bench_qkv(b, n, g)
    left = kw.get("window", (-1, -1))[0]
    flops = 4.0 * window_pairs(n, n, True, left) * D * b * HQ
    dense_flops = 4.0 * window_pairs(n, n, True) * D * b * HQ
    row: dict = {"variant": name, "shape": f"{b} x {n}"}
    row["dense gluon"] = _tflops(dense_flops, lambda: flash_attention(q, k, v, causal=True))
    dev = name.endswith("]")  # a development mode: "[tanh f16x2, emu N]", "[tree]"
    saved = {n: getattr(vh, n) for n in _SWITCHES}
    if dev:  # the tag says all that runs (SOFTCAP_FAST, the default's pair, off)
        vh.SOFTCAP_FAST = False
        vh.TREE = "tree" in name
        vh.QSCALE = "qscale" in name
        vh.TANH_F16X2 = "tanh f16x2" in name
        vh.ALIBI_ABS = "abs" in name
        vh.FIXED_MAX = "fixed" in name
        vh.SOFTCAP_EMU = int(name.split("emu ")[1].rstrip("]")) if "emu " in name else 0
    try:
        row["gluon"] = _tflops(
            flops, lambda: flash_attention(q, k, v, causal=True, config=GLUON, **kw)
        )
    finally:  # the defaults back for the next row
        for n, value in saved.items():
            setattr(vh, n, value)
    if dev:  # the other columns are the softcap row's
        return row
    tl = _tl(n)
    row["tl"] = _tflops(flops, lambda: flash_attention(q, k, v, causal=True, config=tl, **kw))
    if flex:
        try:
            row["flex"] = _tflops(flops, _flex(q, k, v, **fkw))
        except Exception as e:
            row["flex"] = f"error {type(e).__name__}: {str(e)[:120]}"
    return row


def _packed_speed(g, flex: bool) -> dict:
    """16k tokens as 8 uniform:256-3840 documents against 8 x 2048 equal sequences."""
    lens = list(varlen_lengths("uniform:256-3840", 8))
    t = sum(lens)
    q, k, v = (_rand((t, h, D), torch.bfloat16, g) for h in (HQ, HKV, HKV))
    cu = torch.tensor(_cumulative(lens), dtype=torch.int32, device="cuda")
    flops = 4.0 * sum(window_pairs(n, n, True) for n in lens) * D * HQ
    row: dict = {"variant": f"packed {t} tokens uniform:256-3840", "shape": f"{lens}"}
    for label, cfg in (("gluon", GLUON), ("tl", _tl(max(lens)))):

        def fn(cfg: FlashConfig = cfg) -> object:
            return flash_attention_varlen(
                q, k, v, cu, cu, max(lens), max(lens), causal=True, config=cfg, check_values=False
            )

        row[label] = _tflops(flops, fn)
    qe, ke, ve = _bench_qkv(8, 2048, g)
    eq_flops = 4.0 * window_pairs(2048, 2048, True) * D * 8 * HQ
    row["dense gluon"] = _tflops(eq_flops, lambda: flash_attention(qe, ke, ve, causal=True))
    if flex:
        try:
            doc = torch.repeat_interleave(
                torch.arange(len(lens), device="cuda"), torch.tensor(lens, device="cuda")
            )
            four = [x.transpose(0, 1).unsqueeze(0) for x in (q, k, v)]
            row["flex"] = _tflops(flops, _flex(*four, doc=doc))
        except Exception as e:
            row["flex"] = f"error {type(e).__name__}: {str(e)[:120]}"
    return row
