"""Registers the flash-attn package (FlashAttention-2, `flash_attn.flash_attn_func`) as
`flash-attn`: the library many clusters have installed, beside the copy of the same
algorithm inside torch (`sdpa-flash`).

What this adapter relies on (flash-attn 2.x's `flash_attn/flash_attn_interface.py`):
`flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, ...)` takes
(batch, seqlen, heads, head_dim) tensors with a contiguous last dimension (others are
copied by the package itself) and returns the output tensor; GQA natively (fewer K/V
heads); `causal` aligned bottom-right when seqlen_q != seqlen_k (since 2.1, as ours);
fp16/bf16, head_dim <= 256 (padded by the package to a multiple of 8); sm80 or newer.

The flash-attn-4 package shares the import name `flash_attn` (it installs only
`flash_attn/cute`): this one is found by its own module, `flash_attn.flash_attn_interface`.
"""

from __future__ import annotations

import torch

from fa_bench.case import Case, DType, Mode
from fa_bench.kernels import peers
from fa_bench.registry import Prepared, Unsupported, register

FA2 = peers.Peer(
    what="flash-attn (FlashAttention-2)",
    dist="flash-attn",
    module="flash_attn.flash_attn_interface",
    attr="flash_attn_func",
    extra="flash-attn",
    min_capability=(8, 0),
)


def _check(case: Case, device: object) -> str | None:
    if case.head_dim > 256:
        return f"flash-attn takes head_dim <= 256, got {case.head_dim}"
    return None


def build(case: Case, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Prepared:
    """The `flash-attn` builder: import, check the GPU, one call, return fn."""
    reason = peers.device_reason(FA2, q)
    if reason is not None:
        raise Unsupported(reason)
    func = peers.load(FA2)
    causal = case.causal

    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out = func(peers.bshd(q), peers.bshd(k), peers.bshd(v), causal=causal)
        return out.transpose(1, 2)

    peers.warm_up(fn, q, k, v, backward=case.mode is not Mode.FWD)
    return Prepared(fn, backend="flash_attn.flash_attn_func")


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
