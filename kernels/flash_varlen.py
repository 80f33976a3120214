"""`flash_attention_varlen`: our FlashAttention over packed variable-length batches
(flash-attn's `flash_attn_varlen_func` layout), forward and backward.

q (total_q, Hq, D), k and v (total_k, Hkv, D): the sequences back to back, sequence b's
tokens [cu_seqlens[b], cu_seqlens[b + 1]). Each sequence attends only to itself, with
bottom-right causal alignment and the variants (window, ALiBi, softcap) per sequence.

No copy and no second kernel: the packed tensors go to the dense kernels as
(1, H, total, D) views, with a VARLEN flag that reads each program's sequence bounds from
the cumulative lengths; the grid covers the longest sequence (max_seqlen) times the
sequence count, and the programs past their sequence's end return at once. The saved
lse2 and the public lse are (H, total_q) (flash-attn's layout).
"""

from __future__ import annotations

import itertools

import torch

from fa_bench.kernels.flash_attention import _run
from fa_bench.kernels.flash_config import FlashConfig
from fa_bench.kernels.flash_validate import Varlen, check_inputs, make_variant


def _packed(name: str, t: object) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != 3:
        raise ValueError(
            f"{name} must be 3-D (total_tokens, heads, head_dim), got shape {tuple(t.shape)}"
        )
    return t


def check_cu_seqlens(
    name: str, cu: object, total: int, device: torch.device, check_values: bool = True
) -> list[int]:
    """Check cumulative lengths: int32 (B + 1,) on q's device, from 0, non-decreasing, up
    to `total` (the tensor's tokens). Returns the lengths (empty without check_values)."""
    if not isinstance(cu, torch.Tensor):
        raise ValueError(f"{name} must be an int32 torch.Tensor, got {type(cu).__name__}")
    if cu.dtype != torch.int32:
        raise ValueError(f"{name} must be int32, got {cu.dtype}")
    if cu.dim() != 1 or cu.numel() < 2:
        raise ValueError(f"{name} must be 1-D with at least 2 entries, got shape {tuple(cu.shape)}")
    if cu.device != device:
        raise ValueError(f"{name} must be on {device} (with q), got {cu.device}")
    if not check_values:
        return []
    values = cu.tolist()  # a host copy: check_values=False skips it
    if values[0] != 0:
        raise ValueError(f"{name} must start at 0, got {name}[0] = {values[0]}")
    lengths = [b - a for a, b in itertools.pairwise(values)]
    if min(lengths) < 0:
        at = lengths.index(min(lengths))
        raise ValueError(
            f"{name} must not decrease, got {values[at]} then {values[at + 1]} at index {at}"
        )
    if values[-1] != total:
        raise ValueError(
            f"{name} ends at {values[-1]} but the packed tensor has {total} tokens; they must agree"
        )
    return lengths


def _max_seqlen(name: str, value: object, lengths: list) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    if lengths and max(lengths) > value:
        raise ValueError(f"{name} ({value}) is below the longest sequence ({max(lengths)})")
    return value


def flash_attention_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    *,
    causal: bool = False,
    scale: float | None = None,
    window: tuple[int, int] = (-1, -1),
    alibi_slopes: torch.Tensor | None = None,
    softcap: float = 0.0,
    return_lse: bool = False,
    config: FlashConfig | None = None,
    deterministic: bool | None = None,
    check_values: bool = True,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Attention over a packed batch, each sequence on its own; differentiable in q, k, v.

    q: (total_q, heads_q, head_dim), k, v: (total_k, heads_kv, head_dim), any strides
    whose last one is 1; `cu_seqlens_q`/`cu_seqlens_k`: int32 (B + 1,) cumulative lengths
    (0, L1, L1 + L2, ..., total) on q's device; `max_seqlen_q`/`max_seqlen_k`: at least the
    longest sequence (they size the grid). Sequence b's query i and key j follow
    `flash_attention`'s semantics with o = Sk_b - Sq_b (bottom-right causal per
    sequence); `alibi_slopes` is (heads_q,) or (B, heads_q) fp32. Returns o (total_q,
    heads_q, head_dim) in q's layout; with `return_lse`, also the natural-log lse,
    (heads_q, total_q) fp32 (flash-attn's layout).

    Bad arguments raise ValueError/TypeError naming the argument and its value. The
    value checks of the cumulative lengths (from 0, non-decreasing, ending at the token
    count, within max_seqlen) copy them to the host, a sync on a GPU:
    `check_values=False` skips them for a caller that checked once (the benchmark's
    adapter does, outside its timed span).
    """
    q, k, v = _packed("q", q), _packed("k", k), _packed("v", v)
    # (1, H, total, D) views: the dense kernels' layout, no copy
    q4, k4, v4 = (t.unsqueeze(0).transpose(1, 2) for t in (q, k, v))
    check_inputs(q4, k4, v4, scale)
    len_q = check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, q.shape[0], q.device, check_values)
    len_k = check_cu_seqlens("cu_seqlens_k", cu_seqlens_k, k.shape[0], q.device, check_values)
    if cu_seqlens_q.numel() != cu_seqlens_k.numel():
        raise ValueError(
            f"cu_seqlens_q ({cu_seqlens_q.numel()} entries) and cu_seqlens_k "
            f"({cu_seqlens_k.numel()}) must describe the same number of sequences"
        )
    max_q = _max_seqlen("max_seqlen_q", max_seqlen_q, len_q)
    max_k = _max_seqlen("max_seqlen_k", max_seqlen_k, len_k)
    packed = Varlen(cu_seqlens_q, cu_seqlens_k, max_q, max_k)
    causal = bool(causal)
    variant = make_variant(
        q4, causal=causal, window=window, alibi_slopes=alibi_slopes, softcap=softcap,
        batch=packed.batch, seq_q=max_q, seq_k=max_k, varlen=packed,
    )  # fmt: skip
    out = _run(q4, k4, v4, causal, scale, config, deterministic, variant, return_lse)
    if not return_lse:
        return out[0].transpose(0, 1)
    o, lse = out
    return o[0].transpose(0, 1), lse[0]
