"""Registers xFormers' `xformers.ops.memory_efficient_attention` as `xformers`.

What this adapter relies on (xformers' `ops/fmha/__init__.py` and `attn_bias.py`): the
inputs are (batch, seqlen, heads, head_dim) with a contiguous last dimension; GQA goes
through the 5-D form (batch, seqlen, groups, heads per group, head_dim) with K and V
*expanded* (stride 0, no copy) over the heads of a group; bottom-right causal is the
`LowerTriangularFromBottomRightMask` bias (equal to `LowerTriangularMask` when seqlen_q ==
seqlen_k). Variant cases (issue 19): windows and packed batches through their bias classes
(`_variant_bias`; a packed case's (1, H, T, D) inputs go in as (1, T, H, D) views);
softcap and ALiBi are unsupported with the reason. xFormers dispatches to one of its
kernels (cutlass, flash, ...); the one it picks for the forward is recorded as the backend
where its dispatcher says so.
"""

from __future__ import annotations

import importlib

import torch

from fa_bench.case import Case, DType, Mode
from fa_bench.kernels import peers
from fa_bench.registry import Prepared, Unsupported, register

XFORMERS = peers.Peer(
    what="xFormers",
    dist="xformers",
    module="xformers.ops",
    attr="memory_efficient_attention",
    extra="xformers",
    min_capability=(5, 0),
)


def _bias(case: Case) -> object | None:
    if case.is_variant:
        return _variant_bias(case)
    if not case.causal:
        return None
    attn_bias = importlib.import_module("xformers.ops.fmha.attn_bias")
    return attn_bias.LowerTriangularFromBottomRightMask()


def _variant_bias(case: Case) -> object | None:
    """The attn_bias class that expresses a variant case, or Unsupported naming what none
    does: `LocalAttentionFromBottomRightMask(left, right)` (key j visible when
    i + o − left ≤ j ≤ i + o + right, flash-attn's window; an unbounded side is Sk, causal
    right 0), `BlockDiagonal(Causal)Mask.from_seqlens` for a packed batch (each document
    square, so its causal diagonal is bottom-right too)."""
    if case.softcap:
        raise Unsupported("xFormers' memory_efficient_attention has no softcap")
    if case.alibi:
        raise Unsupported("xFormers takes ALiBi only as a dense bias tensor (not built here)")
    attn_bias = importlib.import_module("xformers.ops.fmha.attn_bias")
    if case.varlen:
        if case.has_window:
            raise Unsupported("no xFormers attn_bias class here for a window over a packed batch")
        lengths = list(case.sequence_lengths())
        cls = attn_bias.BlockDiagonalCausalMask if case.causal else attn_bias.BlockDiagonalMask
        return cls.from_seqlens(lengths)
    if not case.has_window:
        return attn_bias.LowerTriangularFromBottomRightMask() if case.causal else None
    unbounded = case.seqlen_q + case.seqlen_k  # past every key, whatever the offset
    left = unbounded if case.window_left < 0 else case.window_left
    right = unbounded if case.window_right < 0 else case.window_right
    if case.causal:
        right = 0
    return attn_bias.LocalAttentionFromBottomRightMask(window_left=left, window_right=right)


def _grouped(t: torch.Tensor, heads_kv: int, group: int, expand: bool) -> torch.Tensor:
    """(B, S, H, D) as xFormers' GQA form (B, S, heads_kv, group, D): q split, K/V
    expanded; views only."""
    if expand:
        return t.unsqueeze(3).expand(-1, -1, -1, group, -1)
    return t.unflatten(2, (heads_kv, group))


def _backend(inputs: tuple[torch.Tensor, ...], bias: object | None, grad: bool) -> str:
    """The kernel xFormers' dispatcher picks; its dispatcher is private, so best effort."""
    label = "xformers.ops.memory_efficient_attention"
    try:
        fmha = importlib.import_module("xformers.ops.fmha")
        op = fmha._dispatch_fw(fmha.Inputs(*inputs, attn_bias=bias), grad)
        return f"{label}:{getattr(op, 'NAME', None) or op.__name__}"
    except Exception:  # an older or newer xFormers: the label without the kernel
        return label


def build(case: Case, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Prepared:
    """The `xformers` builder: import, check the GPU, one call, return fn."""
    reason = peers.device_reason(XFORMERS, q)
    if reason is not None:
        raise Unsupported(reason)
    func = peers.load(XFORMERS)
    bias = _bias(case)
    group = case.heads_q // case.heads_kv
    hkv = case.heads_kv

    def inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, ...]:
        qb, kb, vb = peers.bshd(q), peers.bshd(k), peers.bshd(v)
        if group == 1:
            return qb, kb, vb
        kb, vb = (_grouped(t, hkv, group, expand=True) for t in (kb, vb))
        return _grouped(qb, hkv, group, expand=False), kb, vb

    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out = func(*inputs(q, k, v), attn_bias=bias)
        return (out.flatten(2, 3) if group > 1 else out).transpose(1, 2)

    grad = case.mode is not Mode.FWD
    # No kernel of xFormers' for these inputs: NotImplementedError("No operator found ...").
    peers.warm_up(fn, q, k, v, backward=grad, refusals=(AssertionError, NotImplementedError))
    return Prepared(fn, backend=_backend(inputs(q, k, v), bias, grad))


register(
    "xformers",
    description=(
        "xFormers memory_efficient_attention (its dispatcher's kernel is recorded), GQA "
        "through its 5-D form, bottom-right causal"
    ),
    modes=(Mode.FWD, Mode.BWD, Mode.FWD_BWD),
    dtypes=(DType.FP32, DType.FP16, DType.BF16),
    devices=("cuda",),
    availability=lambda: peers.availability(XFORMERS),
)(build)
