"""Our kernel's variants (issue 19) compiled on a GPU, bf16 and fp16 at realistic sizes,
forward and gradients, against the float64 reference under the project's accuracy rule
(fa_bench.run.accuracy): a 4k sliding window at 16k causal, softcap 50 with a window,
ALiBi causal, a packed batch of 16k tokens from mixed lengths; the pointer and the TMA
descriptor paths; a bitwise-deterministic variant backward.

`-m gpu` on a CUDA machine (tools/gpu/variants_check.sh runs them); skipped on a CPU.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

DTYPES = [torch.bfloat16, torch.float16]
TMA = [False, True]


def _kernels():
    from fa_bench.kernels import FlashConfig, flash_attention, flash_attention_varlen

    return FlashConfig, flash_attention, flash_attention_varlen


def _inputs(b, hq, hk, sq, sk, d, dtype, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)

    def one(h, s):
        return torch.randn((b, h, s, d), generator=g, device="cuda").to(dtype).requires_grad_()

    return one(hq, sq), one(hk, sk), one(hk, sk)


def _slopes(heads: int) -> torch.Tensor:
    from fa_bench.case import alibi_slopes

    return torch.tensor(alibi_slopes(heads), dtype=torch.float32, device="cuda")


def _rule(ours, ref, base, terms: int) -> None:
    from fa_bench.run.accuracy import _tensor_report

    for name, x, r, b in zip(("o", "dq", "dk", "dv"), ours, ref, base, strict=True):
        report = _tensor_report(x, x, r, b, terms)
        assert report["passed"], (name, report)


def _config(dtype, causal: bool, seqlen: int, tma: bool):
    """The config the library would pick, with the TMA descriptor path on or off."""
    import dataclasses

    from fa_bench.kernels.flash_config import heuristic_config

    cfg = heuristic_config(128, dtype, causal, torch.device("cuda"), seqlen)
    return dataclasses.replace(cfg, use_tma=tma)


def _dense_case(dtype, *, sq, causal, window=(-1, -1), alibi=False, softcap=0.0, tma=False):
    """Ours against variant_attention in float64 (reference) and in `dtype` (baseline)."""
    from fa_bench.run.variant_reference import variant_attention

    _, flash_attention, _ = _kernels()
    q, k, v = _inputs(1, 4, 1, sq, sq, 128, dtype)
    slopes = _slopes(4) if alibi else None
    kw = dict(causal=causal, window=window, softcap=softcap)
    cfg = _config(dtype, causal, sq, tma)
    o = flash_attention(q, k, v, alibi_slopes=slopes, config=cfg, **kw)
    do = torch.randn_like(o)
    grads = torch.autograd.grad(o, (q, k, v), do)
    ref = variant_attention(*(t.detach().double() for t in (q, k, v)), alibi_slopes=slopes,
                            do=do.double(), **kw)  # fmt: skip
    base = variant_attention(*(t.detach() for t in (q, k, v)), alibi_slopes=slopes, do=do, **kw)
    _rule((o, *grads), (ref.o, ref.dq, ref.dk, ref.dv), (base.o, base.dq, base.dk, base.dv), sq)


@pytest.mark.parametrize("tma", TMA)
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_sliding_window_4k_at_16k_causal(dtype, tma):
    _dense_case(dtype, sq=16384, causal=True, window=(4096, -1), tma=tma)


@pytest.mark.parametrize("tma", TMA)
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_softcap_50_with_a_window(dtype, tma):
    _dense_case(dtype, sq=4096, causal=True, window=(1024, -1), softcap=50.0, tma=tma)


@pytest.mark.parametrize("dtype", [*DTYPES, torch.float32])
def test_gpu_softcap_50_alone_non_causal(dtype):
    """fp16/bf16 run the hardware's tanh.approx.f32, fp32 libdevice's."""
    _dense_case(dtype, sq=2048 + 77, causal=False, softcap=50.0)


@pytest.mark.parametrize("tma", TMA)
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_alibi_causal(dtype, tma):
    _dense_case(dtype, sq=4096, causal=True, alibi=True, tma=tma)


@pytest.mark.parametrize("tma", TMA)
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_packed_16k_tokens_mixed_lengths(dtype, tma):
    """About 16k tokens of documents from 1 to 3840 tokens (flash-attn's layout), causal,
    against each document's float64 reference (fa_bench.run.variant_reference)."""
    import random

    from fa_bench.run.variant_reference import varlen_attention

    _, _, flash_attention_varlen = _kernels()
    rng = random.Random(19)
    lengths = [1, 7, *(rng.randint(256, 3840) for _ in range(7))]
    total = sum(lengths)
    q, k, v = (t[0].transpose(0, 1) for t in _inputs(1, 4, 1, total, total, 128, dtype))
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32,
                      device="cuda")  # fmt: skip
    longest = max(lengths)
    cfg = _config(dtype, True, longest, tma)
    o = flash_attention_varlen(q, k, v, cu, cu, longest, longest, causal=True, config=cfg)
    do = torch.randn_like(o)
    grads = torch.autograd.grad(o, (q, k, v), do)

    def sdpa(t):  # (T, H, D) -> (1, H, T, D)
        return t.detach().transpose(0, 1).unsqueeze(0)

    ref = varlen_attention(*(sdpa(t).double() for t in (q, k, v)), tuple(lengths),
                           do=sdpa(do).double(), causal=True)  # fmt: skip
    base = varlen_attention(*(sdpa(t) for t in (q, k, v)), tuple(lengths), do=sdpa(do),
                            causal=True)  # fmt: skip
    ours = [sdpa(t) for t in (o, *grads)]
    _rule(ours, (ref.o, ref.dq, ref.dk, ref.dv), (base.o, base.dq, base.dk, base.dv), longest)


def test_gpu_variant_backward_is_bitwise_deterministic():
    """deterministic=True (the two-kernel backward); the default backward's dQ (the Gluon
    kernel's reduce-adds) is not bitwise reproducible."""
    _, flash_attention, _ = _kernels()
    q, k, v = _inputs(2, 8, 2, 4096, 4096, 128, torch.bfloat16)
    kw = dict(causal=True, window=(1024, -1), alibi_slopes=_slopes(8), softcap=50.0,
              deterministic=True)  # fmt: skip
    runs = []
    for _ in range(3):
        o = flash_attention(q, k, v, **kw)
        runs.append(torch.autograd.grad(o, (q, k, v), torch.ones_like(o)))
    for other in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(runs[0], other, strict=True))
