"""The eager reference implementations' variant cases (issue 19): naive and SDPA.

A variant case (`Case.is_variant`: a window, ALiBi, softcap or a packed batch) reaches
these builders from kernels/reference.py. Inputs are (B, H, S, D) as for dense cases, or
packed (1, H, T, D) for a varlen case (fa_bench.run.variant_inputs). What each one
times, and what it builds beforehand (outside the timed span):

- naive: matmul, softcap (tanh, in the timed graph), + ALiBi bias or masked_fill with the
  boolean mask, softmax, matmul, all in the case dtype, materialising the (Sq × Sk) or
  packed (T × T) scores: a block-diagonal document mask for a packed batch. Memory
  failures are `oom` records.
- SDPA (default dispatch, math, efficient, cuDNN): `attn_mask` = the mask as an additive
  0/-inf tensor or, with ALiBi, the bias with -inf where masked, in the case dtype (not a
  boolean mask: SDPA would convert it in every timed call), its rows 16-element aligned
  (else the memory-efficient backend pads a copy in every call); the backend that ran is
  recorded. SDPA has no softcap (it transforms no score before its softmax), and
  sdpa-flash takes no mask or bias at all: both `unsupported` with the reason.

A query with no visible key (a window or causal bound with Sq > Sk) outputs 0 and has zero
gradients: its row of the mask is made fully visible (no all -inf softmax, whose NaN each
SDPA backend handles its own way) and its output row is zeroed in the timed call, which
zeroes its gradients too. Only cases with such rows pay that masked_fill.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from fa_bench.case import Case
from fa_bench.kernels import sdpa_probe
from fa_bench.registry import Prepared, Unsupported
from fa_bench.run.variant_inputs import VariantMask, variant_bias

AttnFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]

SOFTCAP_REASON = (
    "SDPA has no logit softcapping: it applies no function to the scores before its "
    "softmax (flex's score_mod and our kernel do)"
)
FLASH_REASON = (
    "sdpa-flash takes no attention mask or bias (only is_causal), so it cannot run a "
    "window, ALiBi or a packed batch"
)


def sdpa_check(case: Case, device: object) -> str | None:
    """Why an SDPA backend (not flash) cannot run this case, or None: softcap."""
    return SOFTCAP_REASON if case.softcap else None


def sdpa_flash_check(case: Case, device: object) -> str | None:
    """Why sdpa-flash cannot run this case, or None: any variant."""
    if case.softcap:
        return SOFTCAP_REASON
    return FLASH_REASON if case.is_variant else None


def _describe(case: Case, masks: VariantMask, mask_kind: str = "boolean mask") -> str:
    """What a masked implementation was given, for its backend label."""
    parts = []
    if masks.bias is not None:
        parts.append("ALiBi bias (-inf where masked)")
    elif masks.mask is not None:
        parts.append(mask_kind)
    if case.varlen:
        parts.append(f"block-diagonal over {case.batch} packed documents")
    text = ", ".join(parts) + ", made outside the timed span" if parts else "no mask"
    if case.softcap:
        text += f"; softcap {case.softcap:g} (tanh) in the call"
    if masks.empty_rows is not None:
        text += "; rows with no visible key zeroed in the call"
    return text


# The memory-efficient backend wants a bias whose strides are multiples of 8 elements
# (aten's attention.cpp: preprocess_mask checks aligned_tensor<8>, else pad_bias copies it
# inside every call); 16 meets that with room.
MEM_ALIGN = 16


def aligned(bias: torch.Tensor) -> torch.Tensor:
    """`bias` as a view of a tensor whose last dimension is padded to a multiple of
    MEM_ALIGN (the padding never read): SDPA then uses it as it is."""
    last = bias.shape[-1]
    if last % MEM_ALIGN == 0:
        return bias
    padded = bias.new_zeros(*bias.shape[:-1], -(-last // MEM_ALIGN) * MEM_ALIGN)
    padded[..., :last] = bias
    return padded[..., :last]


def naive_variant(case: Case, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Prepared:
    """Eager attention with the case's variants, in the case dtype."""
    group = case.heads_q // case.heads_kv
    scale = 1.0 / math.sqrt(case.head_dim)
    cap = case.softcap
    masks = variant_bias(case, q.device, q.dtype)
    masked = None if masks.mask is None else ~masks.mask
    bias, empty = masks.bias, masks.empty_rows

    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if group > 1:
            k = k.repeat_interleave(group, dim=1)
            v = v.repeat_interleave(group, dim=1)
        s = (q @ k.transpose(-2, -1)) * scale
        if cap:
            s = cap * torch.tanh(s / cap)
        if bias is not None:
            s = s + bias
        elif masked is not None:
            s = s.masked_fill(masked, float("-inf"))
        p = torch.softmax(s, dim=-1)
        if empty is not None:
            # masked_fill's backward zeroes these rows' grads as well.
            p = p.masked_fill(empty, 0.0)
        return p @ v

    return Prepared(fn, backend=f"naive: {_describe(case, masks)}")


def sdpa_variant(
    case: Case,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    pin: Callable[[Callable[..., Any]], Callable[..., Any]],
) -> Prepared:
    """SDPA with the case's mask or ALiBi bias as attn_mask. `pin` enables only the
    builder's backend (identity for the default dispatch); a backend without a kernel for
    the case is Unsupported with PyTorch's reasons."""
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    reason = sdpa_check(case, q.device)
    if reason:
        raise Unsupported(reason)
    masks = variant_bias(case, q.device, q.dtype)
    attn_mask = masks.bias
    if attn_mask is None and masks.mask is not None:
        # Additive (0 / -inf) in the case dtype, made here: SDPA converts a boolean mask to
        # this form inside every call, which would time an O(Sq·Sk) conversion.
        attn_mask = torch.zeros(masks.mask.shape, dtype=q.dtype, device=q.device)
        attn_mask = attn_mask.masked_fill(~masks.mask, float("-inf"))
    attn_mask = None if attn_mask is None else aligned(attn_mask)
    empty = masks.empty_rows
    gqa = case.heads_q != case.heads_kv

    def call(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        o = sdpa(q, k, v, attn_mask=attn_mask, enable_gqa=gqa)
        return o if empty is None else o.masked_fill(empty, 0.0)

    fn = pin(call)
    sdpa_probe.first_call(fn, q, k, v)

    def probe(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> str:
        return sdpa_probe.masked_backend(q, k, v, attn_mask, gqa)

    label = _describe(case, masks, "additive 0/-inf mask")
    return Prepared(fn, backend=f"{pin(probe)(q, k, v)}: {label}")
