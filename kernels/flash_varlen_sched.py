"""The packed (varlen) backward's work order: a precomputed table of (sequence, block)
pairs, heaviest first, for the dK/dV and dQ kernels (issue 19).

Why: a packed batch's programs differ in cost by the length of their sequence and, under
causal or a window, by where their block sits. The dense-style grid (the block index
times the sequences) starts the programs in index order, so a long document's heavy
blocks can trail the grid while the other SMs idle, and it launches a program for every
block index of the longest sequence in every sequence (those past a sequence's end
return at once). Here the host asks the device for a table instead (torch ops on the
cumulative lengths, no copy to the host, so no sync): every real (sequence, block) pair
once, sorted by its number of visible (query row or key) positions, descending, so the
longest work starts first and the last wave is the lightest (LPT scheduling). The grid
is (heads, table entries): a pair's heads run side by side, so a GQA group's query heads
(dQ) read the same K/V blocks close in time. Each program reads its two table entries:
no search over the sequences.

The table is built once per forward call and kept on its `Varlen` (a backward replayed on
one graph, as the benchmark times it, builds it once). Entries past the real pairs are -1
(their programs return). The order changes no result: each program owns its output
rows, so the backward stays bitwise reproducible.
"""

from __future__ import annotations

import torch

# int64 "unbounded" for the window's sides: beyond any index difference of a real batch
_UNBOUNDED = 1 << 40


def table_len(batch: int, longest: int, total: int, block: int) -> int:
    """Entries enough for every (sequence, block) pair: at most one partial block per
    sequence beyond total / block, and never more than batch × the longest's blocks."""
    return max(1, min(batch * -(-longest // block), -(-total // block) + batch))


def _visible(lo: torch.Tensor, hi: torch.Tensor, length: torch.Tensor) -> torch.Tensor:
    """|[lo, hi] ∩ [0, length)| elementwise (0 when empty)."""
    return (torch.minimum(hi, length - 1) - torch.clamp(lo, min=0) + 1).clamp(min=0)


def _order(cost: torch.Tensor, valid: torch.Tensor, entries: int, bin_rows: int) -> torch.Tensor:
    """(2, entries) int32: the valid pairs' (sequence, block), heaviest first, then -1.

    With bin_rows > 1 the costs are compared in bins of that many positions, and inside
    a bin a sequence's pairs stay together (heaviest first): programs that run side by
    side then stream the same sequence's rows or keys, which L2 keeps, at the price of
    ordering by at most bin_rows of work."""
    per_seq = cost.shape[1]
    key = torch.where(valid, cost, torch.full_like(cost, -1)).flatten()
    # stable sorts from the least significant key: cost, then sequence, then the bin
    order = torch.sort(key, descending=True, stable=True).indices
    if bin_rows > 1:
        seq_of = order // per_seq
        order = order[torch.sort(seq_of, stable=True).indices]
        bins = torch.div(key[order], bin_rows, rounding_mode="floor")  # -1 stays last
        order = order[torch.sort(bins, descending=True, stable=True).indices]
    order = order[:entries]
    keep = key[order] >= 0
    seq = torch.where(keep, order // per_seq, -1)
    blk = torch.where(keep, order % per_seq, -1)
    out = torch.stack([seq, blk]).to(torch.int32)
    if out.shape[1] < entries:  # fewer pairs than entries: pad with -1
        pad = torch.full((2, entries - out.shape[1]), -1, dtype=torch.int32, device=out.device)
        out = torch.cat([out, pad], dim=1)
    return out


def build_schedule(
    cu_q: torch.Tensor,
    cu_k: torch.Tensor,
    max_q: int,
    max_k: int,
    total_q: int,
    total_k: int,
    block: int,
    window: tuple[int, int] | None,
    causal: bool,
    bin_blocks: int = 1,
) -> torch.Tensor:
    """(4, E) int32 on cu_q's device: rows (sequence, key block) of the dK/dV kernel's
    programs, then (sequence, query-row block) of the dQ kernel's, heaviest first, -1
    past the real pairs; E = the larger table_len of the two.

    `window` is the kernels' (left, right) (both >= 0; causal already folded into
    right = 0) or None; without one, `causal` bounds the keys at the diagonal.
    `bin_blocks` > 1 compares costs in bins of that many blocks' positions (see _order)."""
    batch = cu_q.numel() - 1
    entries = max(table_len(batch, max_k, total_k, block), table_len(batch, max_q, total_q, block))
    if window is not None:
        left, right = window
    else:
        left, right = _UNBOUNDED, 0 if causal else _UNBOUNDED
    len_q = (cu_q[1:] - cu_q[:-1]).to(torch.int64)[:, None]
    len_k = (cu_k[1:] - cu_k[:-1]).to(torch.int64)[:, None]
    off = len_k - len_q  # bottom-right alignment, per sequence
    dev = cu_q.device
    # dK/dV: key block [n0, n1] is seen by rows [n0 - o - right, n1 - o + left]
    n0 = torch.arange(0, -(-max_k // block), device=dev, dtype=torch.int64)[None, :] * block
    n1 = torch.minimum(n0 + block, len_k) - 1
    rows = _visible(n0 - off - right, n1 - off + left, len_q)
    bin_rows = bin_blocks * block if bin_blocks > 1 else 1
    dkdv = _order(rows, n0 < len_k, entries, bin_rows)
    # dQ: row block [m0, m1] sees keys [m0 + o - left, m1 + o + right]
    m0 = torch.arange(0, -(-max_q // block), device=dev, dtype=torch.int64)[None, :] * block
    m1 = torch.minimum(m0 + block, len_q) - 1
    keys = _visible(m0 + off - left, m1 + off + right, len_k)
    dq = _order(keys, m0 < len_q, entries, bin_rows)
    return torch.cat([dkdv, dq])
