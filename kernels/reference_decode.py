"""The reference implementations' decode cases: naive, the SDPA backends and FlexAttention.

A decode case (fa_bench.case, Mode.DECODE) hands every builder q (B, Hq, Sq, D) and the
dense cache k, v (B, Hkv, S_max, D), sequence b valid below L_b (`Case.context_lengths()`)
and padded with large values past it (fa_bench.run.decode_inputs). Query t of sequence b
sees keys j < L_b - Sq + t + 1. What each one times, and what it builds beforehand:

- naive: a contiguous case attends the dense cache; a paged case gathers its pages through
  the block table inside the timed call (the issue's "gather the pages, matmul, softmax,
  matmul": the gather is part of the naive work), then matmul, masked softmax, matmul in
  the case dtype. The length mask is built beforehand.
- sdpa (every backend): the dense cache with a boolean length mask, both made outside the
  timed span; for a paged case the dense cache stands for the copy gathered from the
  pages, which is what the backend label says.
- flex: a block mask from the lengths (built beforehand); a paged case runs through
  torch's PagedAttention (torch.nn.attention.experimental) over a (1, Hkv, pages · size, D)
  physical cache, its block mask converted to physical pages. Unsupported with the reason
  where this torch lacks it.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import torch

from fa_bench.case import Case
from fa_bench.kernels import sdpa_probe
from fa_bench.registry import Prepared, Unsupported
from fa_bench.run.decode_inputs import gather_pages, page_counts, paged_cache

AttnFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def length_mask(case: Case, device: torch.device, capacity: int | None = None) -> torch.Tensor:
    """(B, 1, Sq, capacity) bool, True where query t of sequence b sees key j: j < L_b -
    Sq + t + 1. `capacity` defaults to S_max (a gathered paged cache may be longer)."""
    capacity = capacity or case.seqlen_k
    lengths = torch.tensor(case.context_lengths(), device=device)
    last = lengths[:, None] - case.seqlen_q + torch.arange(case.seqlen_q, device=device)
    return (torch.arange(capacity, device=device)[None, None, :] <= last[:, :, None])[:, None]


def _cache_label(case: Case) -> str:
    return "contiguous" if case.page_size == 0 else f"page {case.page_size}"


# ---------------------------------------------------------------------------------------
# naive


def naive_decode(case: Case, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Prepared:
    """Eager attention in the case dtype. GQA: q viewed as (B, Hkv, G·Sq, D), row g·Sq + t,
    so each KV head's cache is one matmul operand, never repeated per group (a broadcast
    matmul against a (B, Hkv, 1, S, D) view would copy it G times)."""
    batch, heads_kv, group = case.batch, case.heads_kv, case.heads_q // case.heads_kv
    sq, scale = case.seqlen_q, 1.0 / math.sqrt(case.head_dim)
    pages = None
    if case.page_size:
        k_pages, v_pages, table = paged_cache(case, k, v)
        pages = (k_pages, v_pages, table)
    capacity = k.shape[2] if pages is None else pages[2].shape[1] * case.page_size
    # (B, 1, G·Sq, S): the (B, 1, Sq, S) mask repeated for each head of the group.
    masked = ~length_mask(case, q.device, capacity).repeat(1, 1, group, 1)

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        rows = q.reshape(batch, heads_kv, group * sq, -1)
        s = (rows @ k.transpose(-2, -1)) * scale
        p = torch.softmax(s.masked_fill(masked, float("-inf")), dim=-1)
        return (p @ v).reshape(q.shape)

    if pages is None:
        return Prepared(attend, backend="naive: contiguous cache, length mask")
    k_pages, v_pages, table = pages

    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # The dense k, v are ignored: the pages are the cache of a paged case.
        return attend(q, gather_pages(k_pages, table), gather_pages(v_pages, table))

    return Prepared(fn, backend=f"naive: {_cache_label(case)}, pages gathered in the timed call")


# ---------------------------------------------------------------------------------------
# SDPA


def sdpa_decode(
    case: Case,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    pin: Callable[[Callable[..., Any]], Callable[..., Any]],
) -> Prepared:
    """SDPA on the dense cache with a boolean length mask. `pin` wraps a call so that
    only the builder's backend is enabled (identity for the default dispatch); a backend
    without a kernel for the case is Unsupported with PyTorch's reasons."""
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    mask = length_mask(case, q.device)
    gqa = case.heads_q != case.heads_kv

    def call(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return sdpa(q, k, v, attn_mask=mask, enable_gqa=gqa)

    fn = pin(call)

    sdpa_probe.first_call(fn, q, k, v)

    def probe(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> str:
        return sdpa_probe.masked_backend(q, k, v, mask, gqa)

    copy = "" if case.page_size == 0 else " (the dense copy of the pages)"
    backend = (
        f"{pin(probe)(q, k, v)}: dense cache{copy} + boolean length mask, "
        "made outside the timed span"
    )
    return Prepared(fn, backend=backend)


# ---------------------------------------------------------------------------------------
# FlexAttention


def _paged_attention_class() -> type | None:
    try:
        from torch.nn.attention.experimental._paged_attention import PagedAttention
    except ImportError:
        return None
    return PagedAttention


def flex_decode(
    case: Case,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    flex: Callable[..., torch.Tensor],
    block_mask_fn: Callable[..., object],
) -> Prepared:
    """FlexAttention with a block mask from the lengths. `flex` is flex_attention
    (compiled on a GPU, eager in the CPU tests) and `block_mask_fn` create_block_mask."""
    sq = case.seqlen_q
    lengths = torch.tensor(case.context_lengths(), device=q.device)

    def bottom_right(b, h, q_idx, kv_idx):  # flex mask_mod signature
        return kv_idx <= q_idx + lengths[b] - sq

    gqa = case.heads_q != case.heads_kv
    if case.page_size == 0:
        block_mask = block_mask_fn(bottom_right, case.batch, None, sq, case.seqlen_k,
                                   device=q.device)  # fmt: skip
        cache = None
        label = "contiguous cache, block mask from the lengths"
    else:
        block_mask, cache = _flex_paged(case, q, k, v, bottom_right, lengths, block_mask_fn)
        label = f"page {case.page_size} through PagedAttention (its physical block mask)"
    return _flex_prepared(flex, block_mask, cache, gqa, q, k, v, label)


def _flex_paged(
    case: Case,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask_mod: Callable,
    lengths: torch.Tensor,
    block_mask_fn: Callable[..., object],
) -> tuple[object, tuple[torch.Tensor, torch.Tensor]]:
    """The physical block mask and the (1, Hkv, pages · size, D) caches flex reads."""
    paged_cls = _paged_attention_class()
    if paged_cls is None:
        raise Unsupported(
            f"FlexAttention paged decoding needs torch.nn.attention.experimental."
            f"_paged_attention.PagedAttention, which torch {torch.__version__} lacks"
        )
    size = case.page_size
    k_pages, v_pages, table = paged_cache(case, k, v)
    n_pages = k_pages.shape[0]
    paged = paged_cls(n_pages, size, case.batch, device=q.device)
    # The tables PagedAttention.reserve would fill, set to paged_cache's shuffled pages.
    for b, n in enumerate(page_counts(case)):
        physical = table[b, :n].long()
        paged.page_table[b, :n] = physical
        paged.physical_to_logical[b, physical] = torch.arange(n, device=q.device)
        paged.capacity[b] = n * size
    logical = block_mask_fn(mask_mod, case.batch, None, case.seqlen_q, table.shape[1] * size,
                            device=q.device, BLOCK_SIZE=(128, size))  # fmt: skip
    physical_mask = paged.convert_logical_block_mask(logical, kv_len=lengths)

    def flat(pages: torch.Tensor) -> torch.Tensor:
        # (pages, size, Hkv, D) -> (1, Hkv, pages · size, D): PagedAttention's cache.
        return pages.permute(2, 0, 1, 3).reshape(1, case.heads_kv, n_pages * size, -1)

    return physical_mask, (flat(k_pages), flat(v_pages))


def _flex_prepared(
    flex: Callable[..., torch.Tensor],
    block_mask: object,
    cache: tuple[torch.Tensor, torch.Tensor] | None,
    gqa: bool,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    label: str,
) -> Prepared:
    """Try flex's kernels in turn (as the prefill builder does: AUTO's decoding kernel
    may find no valid config), compiling outside the timed span."""
    attempts: list[tuple[str, dict | None]] = [
        ("AUTO", None),
        ("TRITON", {"BACKEND": "TRITON"}),
        ("TRITON", {"FORCE_USE_FLEX_ATTENTION": True}),
    ]
    errors: list[str] = []
    for name, options in attempts:
        fn = functools.partial(_flex_call, flex, block_mask, cache, gqa, options)
        try:
            fn(q, k, v)
        except Exception as err:  # inductor's error types move between torch versions
            if not errors and "NoValidChoices" not in str(err):
                raise
            errors.append(f"{name} {options}: {str(err).splitlines()[0]}")
            continue
        return Prepared(fn, backend=f"{name}: {label}")
    raise Unsupported("FlexAttention found no kernel for this case: " + "; ".join(errors))


def _flex_call(
    flex: Callable[..., torch.Tensor],
    block_mask: object,
    cache: tuple[torch.Tensor, torch.Tensor] | None,
    gqa: bool,
    options: dict | None,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
) -> torch.Tensor:
    if cache is not None:
        k, v = cache  # a paged case reads its physical pages, not the dense inputs
    kwargs = {} if options is None else {"kernel_options": options}
    return flex(q, k, v, block_mask=block_mask, enable_gqa=gqa, **kwargs)
