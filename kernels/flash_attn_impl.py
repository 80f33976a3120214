"""Registers the flash-attn package (FlashAttention-2, `flash_attn.flash_attn_func`) as
`flash-attn`: the library many clusters have installed, beside the copy of the same
algorithm inside torch (`sdpa-flash`).

What this adapter relies on (flash-attn 2.x's `flash_attn/flash_attn_interface.py`):
`flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, ...)` takes
(batch, seqlen, heads, head_dim) tensors with a contiguous last dimension (others are
copied by the package itself) and returns the output tensor; GQA natively (fewer K/V
heads); `causal` aligned bottom-right when seqlen_q != seqlen_k (since 2.1, as ours);
fp16/bf16, head_dim <= 256 (padded by the package to a multiple of 8); sm80 or newer.

Variant cases (issue 19) use its own keywords: `window_size=(left, right)` with -1 for
unbounded (our convention too; causal makes right 0 inside flash-attn), `softcap`, and
`alibi_slopes` fp32 (heads_q,) from `fa_bench.case.alibi_slopes`; a packed case's
(1, H, T, D) inputs go to `flash_attn_varlen_func` as (T, H, D) views with int32
cu_seqlens and the longest document as max_seqlen (made outside the timed span).

The flash-attn-4 package shares the import name `flash_attn` (it installs only
`flash_attn/cute`): this one is found by its own module, `flash_attn.flash_attn_interface`.
"""

from __future__ import annotations

import dataclasses

import torch

from fa_bench.case import Case, DType, Mode, alibi_slopes
from fa_bench.kernels import peers
from fa_bench.registry import Prepared, Unsupported, register
from fa_bench.run.variant_inputs import cu_seqlens

FA2 = peers.Peer(
    what="flash-attn (FlashAttention-2)",
    dist="flash-attn",
    module="flash_attn.flash_attn_interface",
    attr="flash_attn_func",
    extra="flash-attn",
    min_capability=(8, 0),
)
FA2_VARLEN = dataclasses.replace(FA2, attr="flash_attn_varlen_func")


def _check(case: Case, device: object) -> str | None:
    if case.head_dim > 256:
        return f"flash-attn takes head_dim <= 256, got {case.head_dim}"
    return None


def variant_kwargs(case: Case, device: torch.device) -> dict:
    """flash-attn's keywords for a variant case's window, softcap and ALiBi (none for a
    plain case, which is called as before)."""
    kwargs: dict = {}
    if case.window_left >= 0 or case.window_right >= 0:
        kwargs["window_size"] = (case.window_left, case.window_right)
    if case.softcap:
        kwargs["softcap"] = float(case.softcap)
    if case.alibi:
        slopes = alibi_slopes(case.heads_q)
        kwargs["alibi_slopes"] = torch.tensor(slopes, dtype=torch.float32, device=device)
    return kwargs


def build(case: Case, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Prepared:
    """The `flash-attn` builder: import, check the GPU, one call, return fn."""
    reason = peers.device_reason(FA2, q)
    if reason is not None:
        raise Unsupported(reason)
    kwargs = {"causal": case.causal, **variant_kwargs(case, q.device)}
    if case.varlen:
        func = peers.load(FA2_VARLEN)
        cu, longest = cu_seqlens(case, q.device), max(case.sequence_lengths())

        def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            packed = (t[0].transpose(0, 1) for t in (q, k, v))
            out = func(*packed, cu, cu, longest, longest, **kwargs)
            return out.transpose(0, 1).unsqueeze(0)

    else:
        func = peers.load(FA2)

        def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            out = func(peers.bshd(q), peers.bshd(k), peers.bshd(v), **kwargs)
            return out.transpose(1, 2)

    peers.warm_up(fn, q, k, v, backward=case.mode is not Mode.FWD)
    spec = FA2_VARLEN if case.varlen else FA2
    return Prepared(fn, backend=f"flash_attn.{spec.attr}")


register(
    "flash-attn",
    description=(
        "the flash-attn package (FlashAttention-2, flash_attn.flash_attn_func), GQA native, "
        "bottom-right causal"
    ),
    modes=(Mode.FWD, Mode.BWD, Mode.FWD_BWD),
    dtypes=(DType.FP16, DType.BF16),
    devices=("cuda",),
    check=_check,
    availability=lambda: peers.availability(FA2),
)(build)
