"""Fake flash-attn-4, flash-attn and xFormers functions that compute issue 19's variants
(window, softcap, ALiBi, packed batches) in the packages' own layouts and spellings: NOT
the real kernels. FA4 spells an unbounded window side None, flash-attn -1; both take
packed (T, H, D) tensors with int32 cu_seqlens and max_seqlen through
`flash_attn_varlen_func`; xFormers expresses windows and packed batches with attn_bias
classes. Each checks its arguments as the package would (a -1 where FA4 wants None, wrong
cu_seqlens or max_seqlen, slopes not fp32 (H,), an unknown bias) and computes attention in
plain torch, so an adapter that passes the wrong keyword gets an error or a wrong answer.
`variant_modules()` is tests/peer_fakes.py's modules with these in place.
"""

from __future__ import annotations

import itertools
import math
import types

import peer_fakes
import torch


def _attend_bshd(q, k, v, causal, scale, left, right, softcap, slopes):
    """(B, S, H, D) attention with flash-attn's variant semantics (-1 = unbounded side)."""
    group = q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * (scale or 1.0 / math.sqrt(q.shape[-1]))
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    sq, sk = q.shape[1], k.shape[1]
    i = torch.arange(sq)[:, None] + (sk - sq)
    j = torch.arange(sk)[None, :]
    if slopes is not None:
        s = s - slopes[:, None, None] * (i - j).abs()
    right = 0 if causal else right
    keep = torch.ones(sq, sk, dtype=torch.bool)
    if left >= 0:
        keep &= j >= i - left
    if right >= 0:
        keep &= j <= i + right
    p = torch.softmax(s.masked_fill(~keep, float("-inf")), dim=-1).nan_to_num(0.0)
    return torch.einsum("bhqk,bkhd->bqhd", p, v).contiguous()


def _slopes(alibi_slopes, heads: int):
    if alibi_slopes is None:
        return None
    if alibi_slopes.dtype != torch.float32 or tuple(alibi_slopes.shape) != (heads,):
        raise ValueError(f"alibi_slopes must be fp32 ({heads},), got {alibi_slopes}")
    return alibi_slopes


def _per_document(attend, q, k, v, cu_q, cu_k, max_q, max_k):
    """(T, H, D) packed tensors, one call of `attend` per document (flash-attn's varlen)."""
    for cu, t, longest in ((cu_q, q, max_q), (cu_k, k, max_k)):
        lengths = cu.diff()
        if cu.dtype != torch.int32 or cu[0] != 0 or cu[-1] != t.shape[0] or (lengths < 0).any():
            raise ValueError(f"bad cu_seqlens {cu} for {t.shape[0]} tokens")
        if longest != int(lengths.max()):
            raise ValueError(f"max_seqlen {longest} is not the longest, {int(lengths.max())}")
    spans = zip(itertools.pairwise(cu_q.tolist()), itertools.pairwise(cu_k.tolist()), strict=True)
    outs = [attend(q[a:b][None], k[c:d][None], v[c:d][None])[0] for (a, b), (c, d) in spans]
    return torch.cat(outs)


def _fa4_window(window_size):
    if any(w is not None and w < 0 for w in window_size):
        raise ValueError(f"FA4 spells an unbounded side None, got {window_size}")
    return tuple(-1 if w is None else w for w in window_size)


def fa4_func(q, k, v, qv=None, softmax_scale=None, causal=False, window_size=(None, None),
             learnable_sink=None, softcap=0.0, num_splits=1, pack_gqa=None,
             deterministic=False, return_lse=False):  # fmt: skip
    """flash_attn.cute.flash_attn_func's keywords (no alibi_slopes), (out, lse)."""
    left, right = _fa4_window(window_size)
    return _attend_bshd(q, k, v, causal, softmax_scale, left, right, softcap, None), None


def fa4_varlen(q, k, v, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None,
               max_seqlen_k=None, seqused_q=None, seqused_k=None, page_table=None,
               softmax_scale=None, causal=False, window_size=(None, None),
               learnable_sink=None, softcap=0.0, num_splits=1, pack_gqa=None,
               deterministic=False, return_lse=False):  # fmt: skip
    left, right = _fa4_window(window_size)

    def attend(q, k, v):
        return _attend_bshd(q, k, v, causal, softmax_scale, left, right, softcap, None)

    return _per_document(attend, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                         max_seqlen_k), None  # fmt: skip


def _fa2_window(window_size):
    if any(w is None or w < -1 for w in window_size):
        raise ValueError(f"flash-attn spells an unbounded side -1, got {window_size}")
    return window_size


def fa2_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
             softcap=0.0, alibi_slopes=None, deterministic=False,
             return_attn_probs=False):  # fmt: skip
    left, right = _fa2_window(window_size)
    slopes = _slopes(alibi_slopes, q.shape[2])
    return _attend_bshd(q, k, v, causal, softmax_scale, left, right, softcap, slopes)


def fa2_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
               softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
               alibi_slopes=None, deterministic=False, return_attn_probs=False,
               block_table=None):  # fmt: skip
    left, right = _fa2_window(window_size)
    slopes = _slopes(alibi_slopes, q.shape[1])

    def attend(q, k, v):
        return _attend_bshd(q, k, v, causal, softmax_scale, left, right, softcap, slopes)

    return _per_document(attend, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                         max_seqlen_k)  # fmt: skip


class LocalAttentionFromBottomRightMask:
    def __init__(self, window_left: int, window_right: int) -> None:
        self.window_left, self.window_right = window_left, window_right


class BlockDiagonalMask:
    causal = False

    def __init__(self, lengths: list[int]) -> None:
        self.lengths = lengths

    @classmethod
    def from_seqlens(cls, q_seqlen, kv_seqlen=None):
        return cls(list(q_seqlen))


class BlockDiagonalCausalMask(BlockDiagonalMask):
    causal = True


def xformers_mea(query, key, value, attn_bias=None, p=0.0, scale=None, *, op=None,
                 output_dtype=None):  # fmt: skip
    """memory_efficient_attention with the bias classes the adapter may pick."""
    shape5 = query.shape if query.dim() == 5 else None
    q, k, v = (t.flatten(2, 3) if shape5 else t for t in (query, key, value))
    if isinstance(attn_bias, BlockDiagonalMask):
        if q.shape[0] != 1 or sum(attn_bias.lengths) != q.shape[1]:
            raise ValueError(f"block-diagonal bias over {attn_bias.lengths}, q {q.shape}")
        cu = torch.tensor([0, *itertools.accumulate(attn_bias.lengths)], dtype=torch.int32)
        longest = max(attn_bias.lengths)

        def attend(q, k, v):
            return _attend_bshd(q, k, v, attn_bias.causal, scale, -1, -1, 0.0, None)

        out = _per_document(attend, q[0], k[0], v[0], cu, cu, longest, longest)[None]
    elif isinstance(attn_bias, LocalAttentionFromBottomRightMask):
        left, right = attn_bias.window_left, attn_bias.window_right
        out = _attend_bshd(q, k, v, False, scale, left, right, 0.0, None)
    else:
        causal = isinstance(attn_bias, peer_fakes.LowerTriangularFromBottomRightMask)
        if attn_bias is not None and not causal:
            raise ValueError(f"unexpected attn_bias {attn_bias!r}")
        out = _attend_bshd(q, k, v, causal, scale, -1, -1, 0.0, None)
    return out.unflatten(2, shape5[2:4]) if shape5 else out


def variant_modules() -> dict[str, types.ModuleType]:
    """peer_fakes' modules by import name, with the variant-aware functions and classes."""
    mods = peer_fakes.fake_modules()
    cute = mods["flash_attn.cute"]
    cute.flash_attn_func, cute.flash_attn_varlen_func = fa4_func, fa4_varlen  # type: ignore[attr-defined]
    fa2 = mods["flash_attn.flash_attn_interface"]
    fa2.flash_attn_func, fa2.flash_attn_varlen_func = fa2_func, fa2_varlen  # type: ignore[attr-defined]
    bias = mods["xformers.ops.fmha.attn_bias"]
    for cls in (LocalAttentionFromBottomRightMask, BlockDiagonalMask, BlockDiagonalCausalMask):
        setattr(bias, cls.__name__, cls)
    mods["xformers.ops"].memory_efficient_attention = xformers_mea  # type: ignore[attr-defined]
    return mods
