"""The packed dK/dV kernel's clamped loads (flash_validate.PACKED_CLAMP) compiled on a
GPU (bf16/fp16): at the variants suite's 16k-token packed batch, the clamped loads'
gradients (CLAMP 1) bit for bit those of the masked loads, the default (CLAMP 2, whole
row blocks unmasked) bit for bit on a second run; within the accuracy rule of the float64 reference
with lengths 1, whole blocks, ragged and a ragged last sequence, in tensors whose rows
past the packed tokens are NaN (a load past the tensor's end poisons the gradients).

`-m gpu` on a CUDA machine (tools/gpu/variants_bwd.sh PACKED=1 runs them); skipped on a
CPU. The interpreter's versions: tests/test_flash_varlen_clamp.py.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def _cu(lengths) -> torch.Tensor:
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=torch.int32, device="cuda")


def _nan_padded(t: torch.Tensor, pad: int = 256) -> torch.Tensor:
    buf = torch.full((t.shape[0] + pad, *t.shape[1:]), float("nan"), dtype=t.dtype, device="cuda")
    buf[: t.shape[0]] = t
    return buf[: t.shape[0]]


def _run(lengths, hq, hk, d, dtype, kw, seed=0):
    from fa_bench.kernels import flash_attention_varlen

    g = torch.Generator(device="cuda").manual_seed(seed)
    t = sum(lengths)
    q, k, v = (
        _nan_padded(torch.randn((t, h, d), generator=g, device="cuda").to(dtype)).requires_grad_()
        for h in (hq, hk, hk)
    )
    cu = _cu(lengths)
    o = flash_attention_varlen(q, k, v, cu, cu, max(lengths), max(lengths), **kw)
    do = _nan_padded(torch.randn(o.shape, generator=g, device="cuda").to(dtype))
    return (q, k, v, do, cu), (o, *torch.autograd.grad(o, (q, k, v), do))


def _rule(inputs, ours, kw) -> None:
    """Each sequence's float64 reference and same-dtype baseline, packed, under the rule."""
    from fa_bench.run.accuracy import _tensor_report
    from fa_bench.run.variant_reference import variant_attention

    q, k, v, do, cu = inputs
    parts: dict = {torch.float64: [], q.dtype: []}
    for b in range(cu.numel() - 1):
        cut = slice(int(cu[b]), int(cu[b + 1]))
        one = [x[cut].detach().transpose(0, 1).unsqueeze(0) for x in (q, k, v, do)]
        for dtype, out in parts.items():
            r = variant_attention(*(x.to(dtype) for x in one[:3]), do=one[3].to(dtype), **kw)
            out.append([r.o, r.dq, r.dk, r.dv])
    terms = int((cu[1:] - cu[:-1]).max())
    for i, name in enumerate(("o", "dq", "dk", "dv")):
        assert torch.isfinite(ours[i]).all(), f"{name}: a load read past the tensor's end"
        ref, base = (torch.cat([p[i][0].transpose(0, 1) for p in parts[t]]) for t in parts)
        report = _tensor_report(ours[i], ours[i], ref, base, terms)
        assert report["passed"], (name, report)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_clamped_loads_at_16k_tokens(monkeypatch, dtype):
    """CLAMP 1 bit for bit the masked loads; CLAMP 2 (the default) bit for bit itself."""
    from fa_bench.kernels import flash_validate
    from fa_bench.variants import varlen_lengths

    lengths = varlen_lengths("uniform:256-3840", 8)  # the variants suite's packed batch
    runs = {}
    for clamp in (1, 0, 2):
        monkeypatch.setattr(flash_validate, "PACKED_CLAMP", clamp)
        runs[clamp] = _run(lengths, 32, 8, 128, dtype, dict(causal=True))[1]
    again = _run(lengths, 32, 8, 128, dtype, dict(causal=True))[1]
    for a, b, c, d in zip(runs[1], runs[0], runs[2], again, strict=True):
        assert torch.equal(a, b) and torch.equal(c, d)


@pytest.mark.parametrize(
    "kw",
    [
        dict(causal=True),
        dict(causal=False),
        dict(causal=True, window=(300, -1), softcap=30.0),
    ],
)
def test_clamped_loads_within_the_rule(kw):
    # length 1, whole blocks (128, 1024), ragged, the last sequence ragged at the end
    lengths = [1, 700, 128, 33, 1024, 5, 401]
    inputs, ours = _run(lengths, 8, 2, 128, torch.bfloat16, kw)
    _rule(inputs, ours, kw)
