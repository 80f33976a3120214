"""The float64 reference attention, dense and with the variants (issue 19).

`variant_attention` is the specification over (B, H, S, D) inputs with GQA, forward and
analytic backward, chunked over query rows so that even a 128k-token case needs only
O(chunk × Sk) memory; with no window, ALiBi or softcap it is the dense reference
(`accuracy.reference_attention` calls it so). `varlen_attention` runs it document by
document over a packed (1, H, T, D) batch.

With s = scale · q·kᵀ for query i and key j (o = Sk − Sq):

    softcap c > 0:  s ← c · tanh(s / c)
    ALiBi m_h:      s ← s − m_h · |i + o − j|
    window (l, r):  j visible when i + o − l ≤ j ≤ i + o + r (−1 unbounded; causal: r = 0)

then softmax over the visible keys; a row with no visible key outputs 0, lse −inf and zero
gradients. The backward differentiates through the tanh (ds ← ds · (1 − tanh²)); ALiBi
is a constant.

Called on low-precision tensors it is the accuracy rule's baseline, "plain PyTorch
attention in that dtype", exactly as for dense cases; `accuracy.check_accuracy` calls
`case_reference` for a variant case, and its rule is unchanged.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from fa_bench.case import Case, alibi_slopes
from fa_bench.run.variant_inputs import alibi_distance_bias, visible

# As accuracy's: one (heads × chunk × Sk) float64 score block near this many elements.
_SCORE_BLOCK_ELEMENTS = 1 << 27


class RefResult(NamedTuple):
    o: torch.Tensor
    lse: torch.Tensor  # natural-log sum-exp of the scaled scores; -inf for rows with no key
    dq: torch.Tensor | None
    dk: torch.Tensor | None
    dv: torch.Tensor | None


def _check_shapes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[int, int]:
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError("q, k, v must be (batch, heads, seqlen, head_dim)")
    batch, heads_q, _, head_dim = q.shape
    if k.shape[0] != batch or v.shape[0] != batch or k.shape[-1] != head_dim:
        raise ValueError(f"incompatible shapes q {tuple(q.shape)}, k {tuple(k.shape)}")
    if k.shape[:3] != v.shape[:3]:
        raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} differ in batch/heads/seqlen")
    heads_kv = k.shape[1]
    if heads_q % heads_kv:
        raise ValueError(f"q heads ({heads_q}) must be a multiple of kv heads ({heads_kv})")
    return heads_kv, heads_q // heads_kv


def variant_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool,
    window: tuple[int, int] = (-1, -1),
    alibi_slopes: torch.Tensor | None = None,
    softcap: float = 0.0,
    scale: float | None = None,
    do: torch.Tensor | None = None,
    chunk_rows: int = 1024,
) -> RefResult:
    """Exact attention with the variants in q's dtype; with `do`, also dq, dk, dv.

    `alibi_slopes`: (Hq,) per q head (any float dtype). GQA: q head h uses kv
    head h // group."""
    heads_kv, group = _check_shapes(q, k, v)
    batch, heads_q, seqlen_q, head_dim = q.shape
    seqlen_k = k.shape[2]
    if chunk_rows < 1:
        raise ValueError(f"chunk_rows must be positive, got {chunk_rows}")
    if do is not None and do.shape != (*q.shape[:3], v.shape[-1]):
        raise ValueError(f"do {tuple(do.shape)} does not match the output shape")
    if alibi_slopes is not None and tuple(alibi_slopes.shape) != (heads_q,):
        raise ValueError(f"alibi_slopes must have shape ({heads_q},), got "
                         f"{tuple(alibi_slopes.shape)}")  # fmt: skip
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    offset = seqlen_k - seqlen_q
    left = None if window[0] == -1 else window[0]
    right = 0 if causal else (None if window[1] == -1 else window[1])
    acc_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    # The bias in float32 (float64 for the reference), rounded once to q's dtype: what a
    # user's bias tensor holds, so the low-precision baseline is no worse than naive's.
    slopes = None if alibi_slopes is None else alibi_slopes.to(acc_dtype)

    with torch.no_grad():
        qg = q.reshape(batch, heads_kv, group, seqlen_q, head_dim)
        kt, vg = k.unsqueeze(2).transpose(-1, -2), v.unsqueeze(2)
        dog = None if do is None else do.reshape(batch, heads_kv, group, seqlen_q, -1)
        o = torch.empty(*qg.shape[:-1], v.shape[-1], dtype=q.dtype, device=q.device)
        lse = torch.empty(qg.shape[:-1], dtype=q.dtype, device=q.device)
        if dog is not None:
            dq = torch.empty_like(qg)
            dk = torch.zeros(k.shape, dtype=acc_dtype, device=k.device)
            dv = torch.zeros(v.shape, dtype=acc_dtype, device=v.device)
        cols = torch.arange(seqlen_k, device=q.device)
        for start in range(0, seqlen_q, chunk_rows):
            rows = torch.arange(start, min(start + chunk_rows, seqlen_q), device=q.device)
            q_c = qg[..., rows[0] : rows[-1] + 1, :]
            s = (q_c @ kt) * scale
            tanh = None
            if softcap:
                tanh = torch.tanh(s / softcap)
                s = softcap * tanh
            if slopes is not None:
                bias = alibi_distance_bias(slopes, rows, cols, offset).to(q.dtype)
                s = s + bias.reshape(heads_kv, group, len(rows), seqlen_k)
            keep = visible(rows, cols, offset, left, right)
            if keep is not None:
                s = s.masked_fill(~keep, float("-inf"))
            p = torch.softmax(s, dim=-1)
            lse[..., rows[0] : rows[-1] + 1] = torch.logsumexp(s, dim=-1)
            if keep is not None:
                # softmax of an all -inf row is NaN; such a query attends nothing: 0.
                p = p.masked_fill(~keep.any(dim=-1, keepdim=True), 0.0)
            o[..., rows[0] : rows[-1] + 1, :] = p @ vg
            if dog is None:
                continue
            do_c = dog[..., rows[0] : rows[-1] + 1, :]
            dq_c, dk_c, dv_c = _grads(p, tanh, q_c, do_c, kt, vg, scale, acc_dtype)
            dq[..., rows[0] : rows[-1] + 1, :] = dq_c
            dk += dk_c
            dv += dv_c

    o = o.reshape(batch, heads_q, seqlen_q, -1)
    lse = lse.reshape(batch, heads_q, seqlen_q)
    if dog is None:
        return RefResult(o, lse, None, None, None)
    return RefResult(o, lse, dq.reshape(q.shape), dk.to(k.dtype), dv.to(v.dtype))


def _grads(
    p: torch.Tensor,
    tanh: torch.Tensor | None,
    q_c: torch.Tensor,
    do_c: torch.Tensor,
    kt: torch.Tensor,
    vg: torch.Tensor,
    scale: float,
    acc_dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One query chunk's dq and its parts of dk, dv (summed over the group)."""
    dv_c = (p.transpose(-1, -2) @ do_c).sum(dim=2, dtype=acc_dtype)
    dp = do_c @ vg.transpose(-1, -2)
    p_a, dp_a = p.to(acc_dtype), dp.to(acc_dtype)
    ds = p_a * (dp_a - (p_a * dp_a).sum(dim=-1, keepdim=True))
    if tanh is not None:
        # d(c · tanh(s / c)) / ds = 1 − tanh²(s / c)
        ds = ds * (1 - tanh.to(acc_dtype) ** 2)
    ds = ds.to(p.dtype)
    dq_c = (ds @ kt.transpose(-1, -2)) * scale
    dk_c = (ds.transpose(-1, -2) @ q_c).sum(dim=2, dtype=acc_dtype) * scale
    return dq_c, dk_c, dv_c


def varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lengths: tuple[int, ...],
    *,
    do: torch.Tensor | None = None,
    **variants: object,
) -> RefResult:
    """`variant_attention` of each document of a packed batch q (1, Hq, T, D), k, v
    (1, Hkv, T, D), lengths summing to T; the results packed the same way."""
    if q.shape[0] != 1 or sum(lengths) != q.shape[2] or k.shape[2] != q.shape[2]:
        raise ValueError(f"packed q {tuple(q.shape)}, k {tuple(k.shape)} do not hold "
                         f"documents of lengths summing to {sum(lengths)}")  # fmt: skip
    parts, start = [], 0
    for n in lengths:
        cut = slice(start, start + n)
        parts.append(variant_attention(
            q[:, :, cut], k[:, :, cut], v[:, :, cut],
            do=None if do is None else do[:, :, cut], **variants,  # type: ignore[arg-type]
        ))  # fmt: skip
        start += n

    def cat(tensors: list[torch.Tensor | None]) -> torch.Tensor | None:
        return None if tensors[0] is None else torch.cat(tensors, dim=2)  # type: ignore[arg-type]

    o, lse = torch.cat([r.o for r in parts], dim=2), torch.cat([r.lse for r in parts], dim=2)
    return RefResult(o, lse, *(cat([getattr(r, g) for r in parts]) for g in ("dq", "dk", "dv")))


def case_reference(
    case: Case,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    do: torch.Tensor | None,
    heads: int | None = None,
) -> RefResult:
    """The case's attention on a slice of its inputs (the first `heads` q heads, default
    all), in q's dtype."""
    heads = case.heads_q if heads is None else heads
    slopes = None
    if case.alibi:
        # fp32, as every implementation gets them (flash-attn's alibi_slopes dtype).
        slopes = torch.tensor(alibi_slopes(case.heads_q)[:heads], dtype=torch.float32)
    chunk = max(1, min(1024, _SCORE_BLOCK_ELEMENTS // max(1, heads * case.seqlen_k)))
    kw = dict(causal=case.causal, window=(case.window_left, case.window_right),
              alibi_slopes=None if slopes is None else slopes.to(q.device),
              softcap=case.softcap, chunk_rows=chunk)  # fmt: skip
    if case.varlen:
        return varlen_attention(q, k, v, case.sequence_lengths(), do=do, **kw)
    return variant_attention(q, k, v, do=do, **kw)  # type: ignore[arg-type]
