"""Decode attention (FlashDecoding) in Triton: Sq = 1..16 new query tokens per sequence
against a KV cache, contiguous or paged, with ragged context lengths, GQA and split-KV.

The layout is flash-attn's `flash_attn_with_kvcache`: q (B, Sq, Hq, D); a contiguous cache
(B, S_max, Hkv, D), or a paged one (num_pages, page_size, Hkv, D) with block_table
(B, max_pages) int32 naming each sequence's pages in order; cache_seqlens (B,) int32, the
context length L_b of each sequence, which already counts its Sq new tokens. Query token t
of sequence b sees keys j <= L_b - Sq + t (bottom-right causal: Sq > 1 is speculative
decoding's verification step).

How it runs (the kernels are in fa_bench.kernels.decode_kernels):
- grid (B · Hkv · row blocks, num_splits). A program reads its split of one sequence's
  keys once, block by block, for all GROUP = Hq / Hkv query heads and all Sq tokens at
  once: its rows are the GROUP · Sq (token, head) pairs, padded to a power of two of at
  least 16 (`tl.dot`), at most `_MAX_ROWS` per row block (a wider group, e.g. MQA with 64
  heads and Sq 16, takes several row blocks, each reading the keys again);
- a split is a contiguous run of `cdiv(cdiv(L_b, BLOCK_N), num_splits)` key blocks of its
  own sequence (or, with DecodeConfig(interleave=True), every num_splits-th block), so
  short sequences of a ragged batch leave their last splits empty (lse = -inf, weight 0
  in the combine);
- one split: the program writes o and lse directly. Several: each writes an fp32 partial
  output and its lse into a workspace, and they are merged by their lse: by the last
  split program of each (sequence, KV head, row block) to finish, which an arrival
  counter tells (`Launch.fused_combine`: one launch), or by a second, combine kernel;
  either merges a row block's rows at once (`Launch.merge_tile`,
  fa_bench.kernels.decode_merge) or row by row;
- a paged key block lies in one page or covers whole pages (each key row then reads its
  page's table entry);
- the launch (key block, warps, stages, splits) is fa_bench.kernels.decode_config's
  heuristic, fitted to H200 measurements, for whatever `config` and `num_splits` leave
  open; splits are chosen against the cache's capacity (reading the actual lengths would
  cost a device sync). Under the interpreter the SM count is fixed (`_INTERPRETER_SMS`).
  fa_bench.kernels.decode_plan plans a call once and runs it with the host work left out.

Page sizes: multiples of 16 from 16 to 256 (any multiple of 16 tiles; 256 is the largest
the case model asks for). Head dims: multiples of 8 up to 256, padded to a power of two
inside. fp16/bf16, and fp32 for the interpreter.
"""

from __future__ import annotations

import functools
import math
from types import SimpleNamespace
from typing import Any

import torch

from fa_bench.kernels import device_props
from fa_bench.kernels.decode_checks import (  # noqa: F401  (re-exported: the limits)
    MAX_SEQ_Q,
    PAGE_SIZE_MAX,
    PAGE_SIZE_MIN,
    PAGE_SIZE_STEP,
    _check_options,
    _check_tensors,
    _check_values,
)
from fa_bench.kernels.decode_config import (  # noqa: F401  (re-exported: tests, tools)
    MAX_SPLITS,
    DecodeConfig,
    Launch,
    block_n_for,
    check_config,
    choose_num_splits,
    merge_chunk,
    resolve,
    row_tiles,
)
from fa_bench.kernels.flash_attention import _dot_precision, _interpreting, _last_dim_unit
from fa_bench.kernels.flash_config import pad_pow2

_LOG2E = 1.4426950408889634
_LN2 = 0.6931471805599453
_INTERPRETER_SMS = 4


@functools.cache
def _kernels() -> SimpleNamespace:
    """The `@triton.jit` kernels, imported (with triton) at the first launch: importing
    this module must not decide whether triton interprets (see the package docstring)."""
    from fa_bench.kernels import decode_kernels, decode_merge

    return SimpleNamespace(
        split=decode_kernels._decode_split_kernel,
        combine=decode_kernels._decode_combine_kernel,
        combine_tile=decode_merge._decode_combine_tile_kernel,
    )


def _cdiv(n: int, d: int) -> int:
    return (n + d - 1) // d


# ---------------------------------------------------------------------------------------
# Launch
# ---------------------------------------------------------------------------------------


def plan_launch(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    block_table: torch.Tensor | None,
    num_splits: int | None = None,
    config: DecodeConfig | None = None,
) -> Launch:
    """The launch decode_attention makes for these (valid) arguments: `config`'s and
    `num_splits`' set values, the heuristic's for the rest (fa_bench.kernels.decode_config)."""
    batch, seq_q, heads_q, _ = q.shape
    heads_kv = k_cache.shape[2]
    block_rows, row_blocks = row_tiles(heads_q // heads_kv, seq_q)
    sms = _INTERPRETER_SMS if _interpreting() else device_props.sm_count(q.device)
    if block_table is None:
        capacity, page_size = k_cache.shape[1], None
    else:
        capacity, page_size = block_table.shape[1] * k_cache.shape[1], k_cache.shape[1]
    return resolve(
        config,
        num_splits,
        programs=batch * heads_kv * row_blocks,
        capacity=capacity,
        page_size=page_size,
        sms=sms,
        block_rows=block_rows,
        head_dim=q.shape[-1],
        itemsize=k_cache.element_size(),
        seq_q=seq_q,
    )


def _launch_calls(q, k_cache, v_cache, cache_seqlens, block_table, scale: float, launch: Launch):
    """(o, lse2, calls): the outputs, allocated, and the kernel launches that fill them,
    each (jit function, grid, positional args, keyword args), not yet made."""
    batch, seq_q, heads_q, head_dim = q.shape
    heads_kv = k_cache.shape[2]
    group = heads_q // heads_kv
    paged = block_table is not None
    page_size = k_cache.shape[1] if paged else None
    block_n, num_splits = launch.block_n, launch.num_splits
    block_rows, row_blocks = row_tiles(group, seq_q)
    programs = batch * heads_kv * row_blocks
    o = torch.empty((batch, seq_q, heads_q, head_dim), device=q.device, dtype=q.dtype)
    lse2 = torch.empty((batch, heads_q, seq_q), device=q.device, dtype=torch.float32)
    split = num_splits > 1
    if split:
        o_part = torch.empty(
            (batch, seq_q, heads_q, num_splits, head_dim), device=q.device, dtype=torch.float32
        )
        lse_part = torch.empty(o_part.shape[:-1], device=q.device, dtype=torch.float32)
    else:
        o_part = lse_part = o  # unused: SPLIT=False never touches them
    fused = split and launch.fused_combine
    tile, chunk = launch.merge_tile, merge_chunk(num_splits, block_rows)
    pdl = split and not fused and launch.pdl and _pdl_ok(q.device)
    # the fused combine's arrival counters, one per split program's (sequence, KV head,
    # row block): zero here, and put back to zero by the launch that used them
    counters = torch.zeros(programs, device=q.device, dtype=torch.int32) if fused else o
    # paged: the page stride goes where the block's page is known; contiguous: the batch's
    ks, vs = k_cache.stride(), v_cache.stride()
    k_strides = (0, ks[0], ks[1], ks[2]) if paged else (ks[0], 0, ks[1], ks[2])
    v_strides = (0, vs[0], vs[1], vs[2]) if paged else (vs[0], 0, vs[1], vs[2])
    # the kernels index both with unit strides along their last dimension
    cache_seqlens = cache_seqlens.contiguous()
    table = block_table.contiguous() if paged else cache_seqlens  # a placeholder if contiguous
    pad = pad_pow2(head_dim)
    kernels = _kernels()
    split_args = (
        q, k_cache, v_cache, cache_seqlens, table, o, lse2, o_part, lse_part, counters,
        q.stride(0), q.stride(1), q.stride(2), *k_strides, *v_strides,
        table.stride(0), o.stride(0), o.stride(1), o.stride(2), lse2.stride(0), lse2.stride(1),
        heads_kv, row_blocks, scale * _LOG2E,
    )  # fmt: skip
    split_kw = dict(
        HEAD_DIM=head_dim, HEAD_DIM_PAD=pad, GROUP=group, SEQ_Q=seq_q,
        BLOCK_ROWS=block_rows, BLOCK_N=block_n,
        PAGED=paged, PAGE_SIZE=page_size or 0, SPLIT=split,
        DOT_PREC=_dot_precision(q.dtype), INTERLEAVE=launch.interleave,
        FUSED=fused, SPLITS_PAD=pad_pow2(num_splits) if fused else 1,
        PDL=pdl, ONE_LOOP=launch.one_loop,
        MERGE_TILE=tile and fused, CHUNK=chunk if tile and fused else 1,
        num_warps=launch.num_warps, num_stages=launch.num_stages,
    )  # fmt: skip
    calls: list[tuple[Any, tuple[int, ...], tuple, dict]] = [
        (kernels.split, (programs, num_splits), split_args, split_kw)
    ]
    if split and not fused:
        calls.append(_combine_call(kernels, (o_part, lse_part, o, lse2), split_kw, q.shape,
                                   heads_kv, row_blocks, num_splits, chunk, tile))  # fmt: skip
    return o, lse2, calls


def _combine_call(kernels, tensors, split_kw: dict, q_shape, heads_kv: int, row_blocks: int,
                  num_splits: int, chunk: int, tile: bool):  # fmt: skip
    """The combine kernel's launch after the split kernel's (`split_kw`): one program per
    row block (`tile`, fa_bench.kernels.decode_merge) or per output row."""
    _, _, o, lse2 = tensors
    batch, seq_q, heads_q, _ = q_shape
    pdl = split_kw["PDL"]
    strides = (o.stride(0), o.stride(1), o.stride(2), lse2.stride(0), lse2.stride(1))
    dims = dict(HEAD_DIM=split_kw["HEAD_DIM"], HEAD_DIM_PAD=split_kw["HEAD_DIM_PAD"])
    if tile:
        fn, grid = kernels.combine_tile, (batch * heads_kv * row_blocks,)
        args = (*tensors, *strides, heads_kv, row_blocks, num_splits)
        kw: dict[str, Any] = dict(
            **dims, GROUP=split_kw["GROUP"], SEQ_Q=seq_q, BLOCK_ROWS=split_kw["BLOCK_ROWS"],
            CHUNK=chunk, PDL=pdl,
        )  # fmt: skip
    else:
        fn, grid = kernels.combine, (batch * seq_q * heads_q,)
        args = (*tensors, *strides, heads_q, seq_q, num_splits)
        kw = dict(**dims, SPLITS_PAD=pad_pow2(num_splits), PDL=pdl)
    if pdl:  # the launch option (the combine starts before the split kernel ends)
        kw["launch_pdl"] = True
    return fn, grid, args, kw


def _pdl_ok(device: torch.device) -> bool:
    """Whether the combine can go by programmatic dependent launch on `device`: a compiled
    launch (not the interpreter's) on sm_90 or later."""
    if _interpreting() or device.type != "cuda":
        return False
    return torch.cuda.get_device_capability(device)[0] >= 9


def _launch(q, k_cache, v_cache, cache_seqlens, block_table, scale: float, launch: Launch):
    o, lse2, calls = _launch_calls(q, k_cache, v_cache, cache_seqlens, block_table, scale, launch)
    for fn, grid, args, kwargs in calls:
        fn[grid](*args, **kwargs)
    return o, lse2


# ---------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------


def checked(q, k_cache, v_cache, cache_seqlens, block_table, scale, num_splits, config,
            check_values: bool = True):  # fmt: skip
    """decode_attention's argument checks (ValueError naming the argument); (q, k_cache,
    v_cache, scale) as the kernels take them (unit last strides, the default scale)."""
    _check_tensors(q, k_cache, v_cache, cache_seqlens, block_table)
    _check_options(scale, num_splits)
    check_config(config, k_cache.shape[1] if block_table is not None else None)
    if check_values:
        _check_values(q.shape[1], k_cache, cache_seqlens, block_table)
    q, k_cache, v_cache = (_last_dim_unit(t) for t in (q, k_cache, v_cache))
    scale = float(scale) if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    return q, k_cache, v_cache, scale


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    *,
    cache_seqlens: torch.Tensor,
    block_table: torch.Tensor | None = None,
    scale: float | None = None,
    num_splits: int | None = None,
    return_lse: bool = False,
    check_values: bool = True,
    config: DecodeConfig | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Attention of Sq new tokens per sequence against a KV cache (forward only).

    q (B, Sq, Hq, D), 1 <= Sq <= 16; k_cache, v_cache contiguous (B, S_max, Hkv, D) or,
    with `block_table` (B, max_pages) int32, paged (num_pages, page_size, Hkv, D) with
    page_size a multiple of 16 from 16 to 256; `cache_seqlens` (B,) int32, each from Sq to
    the capacity (S_max, or max_pages · page_size). Hq a multiple of Hkv (GQA: query head
    h reads KV head h // (Hq / Hkv)); D a multiple of 8 up to 256; fp16, bf16 or fp32 (the
    interpreter); any strides whose last one is 1. `scale` defaults to 1/sqrt(D).
    Query token t of sequence b sees cache positions j <= cache_seqlens[b] - Sq + t;
    positions past a sequence's length are never read into the result.

    Returns o (B, Sq, Hq, D) in q's dtype, and with `return_lse=True` also the natural-log
    log-sum-exp of each row's scaled scores, (B, Hq, Sq) fp32. `num_splits` (1 to 128)
    overrides the split-KV heuristic (see the module docstring); `config` (a
    DecodeConfig) fixes any of the other launch parameters (key block, warps, pipeline
    stages, interleaved splits), the heuristic choosing the rest.

    Bad arguments raise ValueError naming them. `check_values=False` skips the two checks
    that read cache_seqlens' and block_table's values (a device-to-host copy and a sync on
    a GPU): for a caller that checked them once before timing repeated calls; a length
    beyond the cache or a page index outside it is then undefined behaviour.
    """
    q, k_cache, v_cache, scale = checked(
        q, k_cache, v_cache, cache_seqlens, block_table, scale, num_splits, config, check_values
    )
    launch = plan_launch(q, k_cache, block_table, num_splits, config)
    o, lse2 = _launch(q, k_cache, v_cache, cache_seqlens, block_table, scale, launch)
    if not return_lse:
        return o
    return o, lse2 * _LN2
