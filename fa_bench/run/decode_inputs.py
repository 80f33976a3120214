"""Inputs of a decode case: the dense KV cache's padding, and its paged layout.

Every builder receives a decode case's cache dense, in SDPA layout: k, v (B, Hkv, S_max, D)
with sequence b valid below its context length L_b (`Case.context_lengths()`). Positions
at or past L_b are padding that no implementation may read; `fill_padding` writes large
finite values there, so an implementation that misses the length mask fails the accuracy
check by orders of magnitude instead of passing by luck (finite, not inf: a correct
implementation multiplies them by an exact 0, and 0 · inf would be NaN).

`paged_cache` builds flash-attn's paged layout (`flash_attn_with_kvcache`, vLLM) from the
dense cache, outside the timed span: pages (num_pages, page_size, Hkv, D) holding only
the ceil(L_b / page_size) pages each sequence uses, placed in a shuffled order, and a
block table (B, max_pages) int32 mapping each sequence's logical page to its physical one.
"""

from __future__ import annotations

import math
import random
from typing import TYPE_CHECKING

from fa_bench.case import Case, Mode

if TYPE_CHECKING:
    import torch

# Padding keys are N(0, 1) scaled by this: their scores (a few hundred) swamp the valid
# ones wherever a mask is missing, yet stay far from fp16's 65504 (a score overflowing to
# inf would turn a correct additive -inf mask into NaN).
PAD_KEY_SCALE = 32.0
# Padding values: a constant far from any valid value (|N(0, 1)| < 6), exact in fp16/bf16.
PAD_VALUE = 1024.0
# Unused block-table entries point at page 0: a valid page (some sequence's data), as
# vLLM pads its tables; a kernel that reads past ceil(L_b / page_size) pages reads real
# but wrong keys, which the accuracy check catches.
UNUSED_PAGE = 0
# The page order's seed: fixed, so the layout depends on the case alone.
_PAGE_SEED = 0xB10C


def _check_decode(case: Case) -> None:
    if case.mode is not Mode.DECODE:
        raise ValueError(f"case {case.id} is not a decode case (mode {case.mode.value})")


def fill_padding(case: Case, k: torch.Tensor, v: torch.Tensor) -> None:
    """Write the padding of the dense cache k, v (B, Hkv, S_max, D) in place: keys at
    positions >= L_b get PAD_KEY_SCALE · N(0, 1) (torch's global generator, so seeded as
    the rest of the case's inputs), values PAD_VALUE."""
    import torch

    _check_decode(case)
    for b, length in enumerate(case.context_lengths()):
        if length >= k.shape[2]:
            continue
        tail = k[b, :, length:]
        tail.copy_(torch.randn(tail.shape, dtype=torch.float32, device=k.device) * PAD_KEY_SCALE)
        v[b, :, length:] = PAD_VALUE


def page_counts(case: Case) -> tuple[int, ...]:
    """Pages each sequence uses: ceil(L_b / page_size)."""
    return tuple(math.ceil(length / case.page_size) for length in case.context_lengths())


def page_order(case: Case) -> list[int]:
    """The physical page of each used logical page, in (sequence, page) order: a fixed
    shuffle of 0..num_pages-1, so pages of one sequence are scattered and out of order."""
    order = list(range(sum(page_counts(case))))
    random.Random(_PAGE_SEED + len(order)).shuffle(order)
    return order


def paged_cache(
    case: Case, k: torch.Tensor, v: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The paged layout of the dense cache k, v (B, Hkv, S_max, D) of a paged decode case:
    (k_pages, v_pages, block_table), pages (num_pages, page_size, Hkv, D) in k's dtype and
    device, block_table (B, ceil(S_max / page_size)) int32. Entries past a sequence's
    ceil(L_b / page_size) pages are UNUSED_PAGE (0). Page slots past L_b hold the dense
    cache's padding; slots past S_max (when page_size does not divide it) hold padding
    too (PAD_KEY_SCALE · N(0, 1) from a fixed generator, PAD_VALUE). Deterministic."""
    import torch

    _check_decode(case)
    if case.page_size <= 0:
        raise ValueError(f"case {case.id} has a contiguous cache (page_size 0), not pages")
    batch, heads_kv, s_max, head_dim = k.shape
    if (batch, heads_kv, s_max, head_dim) != (
        case.batch, case.heads_kv, case.seqlen_k, case.head_dim
    ) or v.shape != k.shape:  # fmt: skip
        raise ValueError(
            f"k {tuple(k.shape)} / v {tuple(v.shape)} is not the dense cache of {case.id} "
            f"({case.batch}, {case.heads_kv}, {case.seqlen_k}, {case.head_dim})"
        )
    size = case.page_size
    counts = page_counts(case)
    order = page_order(case)
    shape = (len(order), size, heads_kv, head_dim)
    k_pages = torch.empty(shape, dtype=k.dtype, device=k.device)
    v_pages = torch.empty(shape, dtype=v.dtype, device=v.device)
    table = torch.full((batch, math.ceil(s_max / size)), UNUSED_PAGE, dtype=torch.int32)
    pad = torch.Generator(device="cpu").manual_seed(_PAGE_SEED)
    first = 0
    for b, n in enumerate(counts):
        physical = order[first : first + n]
        first += n
        table[b, :n] = torch.tensor(physical, dtype=torch.int32)
        index = torch.tensor(physical, device=k.device)
        k_pages[index] = _as_pages(k[b], n, size, pad, PAD_KEY_SCALE, None)
        v_pages[index] = _as_pages(v[b], n, size, pad, None, PAD_VALUE)
    return k_pages, v_pages, table.to(k.device)


def _as_pages(
    x: torch.Tensor,
    n: int,
    size: int,
    pad: torch.Generator,
    scale: float | None,
    value: float | None,
) -> torch.Tensor:
    """One sequence's first n pages from its dense (Hkv, S_max, D) cache, as (n, size,
    Hkv, D); slots past S_max filled with padding (scale · N(0, 1), or `value`)."""
    import torch

    heads_kv, s_max, head_dim = x.shape
    used = min(n * size, s_max)
    out = torch.empty(n * size, heads_kv, head_dim, dtype=x.dtype, device=x.device)
    out[:used] = x[:, :used].transpose(0, 1)
    if used < n * size:
        rest = out[used:]
        if scale is not None:
            rest.copy_(torch.randn(rest.shape, generator=pad) * scale)
        else:
            rest.fill_(value if value is not None else 0.0)
    return out.view(n, size, heads_kv, head_dim)


def gather_pages(k_pages: torch.Tensor, block_table: torch.Tensor) -> torch.Tensor:
    """The dense (B, Hkv, max_pages · page_size, D) view of a paged cache, through the
    whole block table (unused entries included: positions past each L_b are junk to be
    masked). The inverse of `paged_cache` on every sequence's valid prefix."""
    gathered = k_pages[block_table.long()]  # (B, max_pages, page_size, Hkv, D)
    batch, pages, size, heads_kv, head_dim = gathered.shape
    return gathered.reshape(batch, pages * size, heads_kv, head_dim).transpose(1, 2)
