"""decode_attention's argument checks (fa_bench.kernels.decode_attention): shapes, dtypes,
devices, the page size, the lengths and the block table, each a ValueError naming the
argument, its value and what is valid. Split out of decode_attention.py (its size)."""

from __future__ import annotations

import torch

from fa_bench.kernels.decode_config import MAX_SPLITS
from fa_bench.kernels.flash_attention import _interpreting
from fa_bench.kernels.flash_config import HEAD_DIM_MULTIPLE, MAX_HEAD_DIM

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_SEQ_Q = 16
PAGE_SIZE_MIN, PAGE_SIZE_MAX, PAGE_SIZE_STEP = 16, 256, 16


def _shape(t: object) -> str:
    return str(tuple(t.shape)) if isinstance(t, torch.Tensor) else type(t).__name__


def _check_tensors(q, k_cache, v_cache, cache_seqlens, block_table) -> None:
    """Shapes, dtypes and devices: everything that reads no tensor's values."""
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D, got shape {_shape(t)}")
    batch, seq_q, heads_q, head_dim = q.shape
    if q.dtype not in _DTYPES:
        raise ValueError(f"q has dtype {q.dtype}; valid: float16, bfloat16, float32")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if t.dtype != q.dtype:
            raise ValueError(f"{name} has dtype {t.dtype}, q has {q.dtype}: they must match")
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device}, q on {q.device}: they must match")
    if k_cache.shape != v_cache.shape:
        raise ValueError(
            f"k_cache {_shape(k_cache)} and v_cache {_shape(v_cache)} must have one shape"
        )
    if not 1 <= seq_q <= MAX_SEQ_Q:
        raise ValueError(f"q's Sq (dim 1) is {seq_q}; valid: 1 to {MAX_SEQ_Q}; q {_shape(q)}")
    if min(batch, heads_q) < 1:
        raise ValueError(f"q {_shape(q)} has an empty batch or head dimension")
    _, cap_or_page, heads_kv, cache_dim = k_cache.shape
    if cache_dim != head_dim:
        raise ValueError(f"k_cache's head_dim is {cache_dim}, q's {head_dim}: they must match")
    if head_dim % HEAD_DIM_MULTIPLE or not 0 < head_dim <= MAX_HEAD_DIM:
        raise ValueError(
            f"q's head_dim is {head_dim}; valid: a multiple of {HEAD_DIM_MULTIPLE} "
            f"up to {MAX_HEAD_DIM}"
        )
    if heads_kv < 1 or heads_q % heads_kv:
        raise ValueError(
            f"q's heads ({heads_q}) must be a multiple of k_cache's heads ({heads_kv})"
        )
    if block_table is None:
        if k_cache.shape[0] != batch:
            raise ValueError(
                f"k_cache's batch is {k_cache.shape[0]}, q's {batch}: they must match "
                "(or pass block_table for a paged cache)"
            )
        if cap_or_page < 1:
            raise ValueError(f"k_cache {_shape(k_cache)} holds no positions")
    else:
        _check_block_table(block_table, batch, cap_or_page, q.device)
    _check_seqlens(cache_seqlens, batch, q.device)
    if q.device.type == "cpu" and not _interpreting():
        raise ValueError("q is on the CPU: that needs the Triton interpreter (TRITON_INTERPRET=1)")
    if q.device.type not in ("cpu", "cuda"):
        raise ValueError(f"q is on {q.device}; valid devices: cuda, or cpu with the interpreter")


def _check_block_table(block_table, batch: int, page_size: int, device: torch.device) -> None:
    if not isinstance(block_table, torch.Tensor):
        raise ValueError(f"block_table must be a torch.Tensor, got {type(block_table).__name__}")
    if block_table.dtype != torch.int32 or block_table.dim() != 2:
        raise ValueError(
            f"block_table must be int32 (B, max_pages), got {block_table.dtype} "
            f"{_shape(block_table)}"
        )
    if block_table.shape[0] != batch or block_table.shape[1] < 1:
        raise ValueError(f"block_table {_shape(block_table)} must be ({batch}, max_pages >= 1)")
    if block_table.device != device:
        raise ValueError(f"block_table is on {block_table.device}, q on {device}")
    if page_size % PAGE_SIZE_STEP or not PAGE_SIZE_MIN <= page_size <= PAGE_SIZE_MAX:
        raise ValueError(
            f"page_size (k_cache's dim 1) is {page_size}; valid: a multiple of "
            f"{PAGE_SIZE_STEP} from {PAGE_SIZE_MIN} to {PAGE_SIZE_MAX}"
        )


def _check_seqlens(cache_seqlens, batch: int, device: torch.device) -> None:
    if not isinstance(cache_seqlens, torch.Tensor):
        raise ValueError(
            f"cache_seqlens must be a torch.Tensor, got {type(cache_seqlens).__name__}"
        )
    if cache_seqlens.dtype != torch.int32 or tuple(cache_seqlens.shape) != (batch,):
        raise ValueError(
            f"cache_seqlens must be int32 ({batch},), got {cache_seqlens.dtype} "
            f"{_shape(cache_seqlens)}"
        )
    if cache_seqlens.device != device:
        raise ValueError(f"cache_seqlens is on {cache_seqlens.device}, q on {device}")


def _check_values(
    seq_q: int, k_cache: torch.Tensor, cache_seqlens: torch.Tensor, block_table
) -> None:
    """The checks that read cache_seqlens and block_table (a device-to-host copy)."""
    lengths = cache_seqlens.cpu().long()
    if block_table is None:
        capacity = k_cache.shape[1]
    else:
        capacity = block_table.shape[1] * k_cache.shape[1]
    bad = ((lengths < seq_q) | (lengths > capacity)).nonzero()
    if len(bad):
        b = int(bad[0])
        raise ValueError(
            f"cache_seqlens[{b}] is {int(lengths[b])}; valid: Sq ({seq_q}) to the cache's "
            f"capacity ({capacity})"
        )
    if block_table is None:
        return
    page_size, num_pages = k_cache.shape[1], k_cache.shape[0]
    table = block_table.cpu().long()
    used = torch.arange(table.shape[1])[None, :] < ((lengths + page_size - 1) // page_size)[:, None]
    bad = (used & ((table < 0) | (table >= num_pages))).nonzero()
    if len(bad):
        b, i = (int(x) for x in bad[0])
        raise ValueError(
            f"block_table[{b}, {i}] is {int(table[b, i])}; valid: 0 to {num_pages - 1} "
            f"(k_cache holds {num_pages} pages)"
        )


def _check_options(scale, num_splits) -> None:
    if scale is not None and (
        isinstance(scale, bool) or not isinstance(scale, (int, float)) or not scale > 0
    ):
        raise ValueError(f"scale must be a positive number, got {scale!r}")
    if num_splits is not None and (
        isinstance(num_splits, bool)
        or not isinstance(num_splits, int)
        or not 1 <= num_splits <= MAX_SPLITS
    ):
        raise ValueError(
            f"num_splits must be None or an integer from 1 to {MAX_SPLITS}, got {num_splits!r}"
        )
