"""Helpers of the packed (varlen) backward's GPU tests (tests/test_flash_varlen_clamp_gpu.py,
tests/test_flash_varlen_sched_gpu.py): a packed batch's forward and gradients, and each
sequence's float64 reference under the accuracy rule. Imported as `from packed_gpu import
...`, as the tests import conftest."""

from __future__ import annotations

import torch


def cu_seqlens(lengths) -> torch.Tensor:
    """The cumulative lengths (int32, on the GPU) of a packed batch."""
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=torch.int32, device="cuda")


def nan_padded(t: torch.Tensor, pad: int = 256) -> torch.Tensor:
    """t as the head of a buffer whose rows past it are NaN: a load past t's end shows."""
    buf = torch.full((t.shape[0] + pad, *t.shape[1:]), float("nan"), dtype=t.dtype, device="cuda")
    buf[: t.shape[0]] = t
    return buf[: t.shape[0]]


def run_packed(lengths, hq, hk, d, dtype, kw, seed=0, nan_pad=False):
    """flash_attention_varlen's output and gradients for random packed inputs:
    ((q, k, v, do, cu), (o, dq, dk, dv)); nan_pad: every tensor NaN past its end."""
    from fa_bench.kernels import flash_attention_varlen

    pad = nan_padded if nan_pad else (lambda t: t)
    g = torch.Generator(device="cuda").manual_seed(seed)
    t = sum(lengths)
    q, k, v = (
        pad(torch.randn((t, h, d), generator=g, device="cuda").to(dtype)).requires_grad_()
        for h in (hq, hk, hk)
    )
    cu = cu_seqlens(lengths)
    o = flash_attention_varlen(q, k, v, cu, cu, max(lengths), max(lengths), **kw)
    do = pad(torch.randn(o.shape, generator=g, device="cuda").to(dtype))
    return (q, k, v, do, cu), (o, *torch.autograd.grad(o, (q, k, v), do))


def assert_within_rule(inputs, ours, kw) -> None:
    """Each sequence's float64 reference and same-dtype baseline, packed, under the rule;
    every output finite (a load read past a tensor's end would poison it)."""
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
