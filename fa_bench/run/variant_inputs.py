"""Inputs of a variant case (issue 19): cumulative lengths, masks and the ALiBi bias.

A packed (varlen) case hands every builder q (1, Hq, T, D) and k, v (1, Hkv, T, D): its
documents back to back, T = `Case.total_tokens`, each document its own self-attention
(Sq = Sk = its length, bottom-right causal per document). Any other variant case keeps
the (B, H, S, D) inputs of a dense case. Everything here is built by a builder, outside
the timed span.

The semantics (flash-attn's, `fa_bench.variants`): for query i and key j of one sequence
with offset o = Sk - Sq, key j is visible when i + o - left <= j <= i + o + right (-1 =
unbounded; causal bounds the right at 0); ALiBi subtracts m_h · |i + o - j| from the
score. A query with no visible key outputs 0 and has zero gradients.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from fa_bench.case import Case, alibi_slopes

if TYPE_CHECKING:
    import torch


def window_bounds(case: Case) -> tuple[int | None, int | None]:
    """(left, right) of the case's window, None where unbounded; causal bounds the right
    at 0 (flash-attn's causal is window_size=(left, 0))."""
    left = None if case.window_left == -1 else case.window_left
    right = 0 if case.causal else (None if case.window_right == -1 else case.window_right)
    return left, right


def visible(
    rows: torch.Tensor,
    cols: torch.Tensor,
    offset: int,
    left: int | None,
    right: int | None,
) -> torch.Tensor | None:
    """(len(rows), len(cols)) bool, True where key j is visible to query i; None when
    every key is (no window, not causal)."""
    if left is None and right is None:
        return None
    diag = rows[:, None] + offset  # the key each query is aligned with
    keep = None
    if left is not None:
        keep = cols[None, :] >= diag - left
    if right is not None:
        upper = cols[None, :] <= diag + right
        keep = upper if keep is None else keep & upper
    return keep


def cu_seqlens(case: Case, device: torch.device | str) -> torch.Tensor:
    """(B + 1,) int32 cumulative sequence lengths, flash-attn's `cu_seqlens`: 0, L1,
    L1 + L2, ..., T. For an equal-length case, multiples of seqlen_q."""
    import torch

    lengths = torch.tensor((0, *case.sequence_lengths()), dtype=torch.int64)
    return lengths.cumsum(0).to(device=device, dtype=torch.int32)


def _positions(case: Case, device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
    """A packed case's (document, position within it) for each of its T tokens."""
    import torch

    lengths = torch.tensor(case.sequence_lengths(), device=device)
    doc = torch.repeat_interleave(torch.arange(len(lengths), device=device), lengths)
    starts = cu_seqlens(case, device).long()[:-1]
    return doc, torch.arange(len(doc), device=device) - starts[doc]


def document_mask(case: Case, device: torch.device | str) -> torch.Tensor:
    """A packed case's (T, T) bool mask, True where query token i sees key token j: the
    same document (block diagonal), within the window and the causal bound."""
    doc, pos = _positions(case, device)
    left, right = window_bounds(case)
    same = doc[:, None] == doc[None, :]
    # Within one document Sq = Sk, so the offset is 0.
    keep = visible(pos, pos, 0, left, right)
    return same if keep is None else same & keep


def visibility(case: Case, device: torch.device | str) -> torch.Tensor | None:
    """The (Sq, Sk) bool mask of any variant case ((T, T) for a packed one), shared by
    the batch and heads; None when every key is visible."""
    import torch

    if case.varlen:
        return document_mask(case, device)
    rows = torch.arange(case.seqlen_q, device=device)
    cols = torch.arange(case.seqlen_k, device=device)
    return visible(rows, cols, case.seqlen_k - case.seqlen_q, *window_bounds(case))


def alibi_distance_bias(
    slopes: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, offset: int
) -> torch.Tensor:
    """(H, len(rows), len(cols)) in slopes' dtype: -m_h · |i + offset - j|."""
    dist = (rows[:, None] + offset - cols[None, :]).abs().to(slopes.dtype)
    return -slopes[:, None, None] * dist


def alibi_bias(case: Case, device: torch.device | str) -> torch.Tensor:
    """(Hq, Sq, Sk) float32 ALiBi bias of the case ((Hq, T, T) packed: within a document
    |i - j| of the packed positions is the in-document distance; pairs across documents
    are masked anyway)."""
    import torch

    slopes = torch.tensor(alibi_slopes(case.heads_q), dtype=torch.float32, device=device)
    if case.varlen:
        rows = cols = torch.arange(case.total_tokens, device=device)
        return alibi_distance_bias(slopes, rows, cols, 0)
    rows = torch.arange(case.seqlen_q, device=device)
    cols = torch.arange(case.seqlen_k, device=device)
    return alibi_distance_bias(slopes, rows, cols, case.seqlen_k - case.seqlen_q)


class VariantMask(NamedTuple):
    """What a masked implementation adds to its scores, built outside the timed span."""

    # (Sq, Sk) bool, True = visible; None when all are (or when `bias` carries the mask).
    mask: torch.Tensor | None
    # (1, Hq, Sq, Sk) additive ALiBi bias in the case dtype, -inf where masked; or None.
    bias: torch.Tensor | None
    # (Sq, 1) bool, True for queries with no visible key; None when every row has one.
    # Those rows are made fully visible in `mask`/`bias` (so no softmax over an all -inf
    # row yields NaN) and the implementation zeroes their output, which zeroes their
    # gradients too: the semantics' "a row with no visible key outputs 0".
    empty_rows: torch.Tensor | None


def variant_bias(case: Case, device: torch.device | str, dtype: torch.dtype) -> VariantMask:
    """The mask and the ALiBi bias of a variant case in `dtype` (see VariantMask)."""
    keep = visibility(case, device)
    empty = None
    if keep is not None:
        rows_empty = ~keep.any(dim=-1, keepdim=True)
        if bool(rows_empty.any()):
            empty = rows_empty
            keep = keep | rows_empty
    if not case.alibi:
        return VariantMask(keep, None, empty)
    bias = alibi_bias(case, device)
    if keep is not None:
        bias = bias.masked_fill(~keep, float("-inf"))
    return VariantMask(None, bias.to(dtype).unsqueeze(0), empty)


def input_shape(case: Case) -> tuple[int, int, int]:
    """(batch, seqlen_q, seqlen_k) of the input tensors: (1, T, T) for a packed case."""
    if case.varlen:
        return 1, case.total_tokens, case.total_tokens
    return case.batch, case.seqlen_q, case.seqlen_k
