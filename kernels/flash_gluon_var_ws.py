"""The warp-specialised Gluon forward with issue 19's variants (sm_90): window, softcap,
ALiBi and packed batches, any combination, selected by the VAR constexpr's bits
(kernels/flash_gluon_var.py).

The schedule is the dense "ws" kernel's (kernels/flash_gluon_ws.py: a producer warp
filling a K/V ring, two or three consumer warpgroups sharing every K/V tile, ping-pong)
with these differences:
- the CTA's key-block range is [lo, n_end): with a window, the blocks some row of the CTA
  sees (`_window_bounds`), so blocks outside the window are never loaded; the producer
  and every consumer step through the same range (ring index j − lo);
- each consumer applies the softcap / ALiBi to every block's scores and the mask only to
  the blocks its own rows do not see whole ([lo_full, n_full) pays none: the left window
  edge, the diagonal / right edge and the key tail are the masked ones);
- packed batches: programs over (sequence · head, query tile), the query tiles on the
  slow axis and, causal, from the last (every sequence's heaviest tiles first); a tile
  past its sequence's end returns at once; TMA row coordinates are offset by the
  sequence's start and O is stored through masked pointers.
The dense kernels are not touched, so their code is the same as before. A consumer's key
loop (its softmax forms among them) lives in kernels/flash_gluon_var_tile.py.
"""

# Gluon constexpr annotations inside the (untyped) jit functions are for triton, not mypy.
# mypy: disable-error-code="annotation-unchecked"

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    mbarrier,
    tma,
)

from fa_bench.kernels.flash_gluon_kernels import (
    _acc_layout,
    _kv_bounds,
)
from fa_bench.kernels.flash_gluon_var import (
    ALIBI,
    QSCALE,
    VARLEN,
    WINDOW,
    _var_epilogue,
    _window_bounds,
    scale_q,
)
from fa_bench.kernels.flash_gluon_var_tile import _var_tile
from fa_bench.kernels.flash_gluon_ws import _alloc_bars


@gluon.jit
def _var_producer(descs, smem, bars, coords):
    """One warp: the CTA's Q tiles, then K/V blocks [lo, n_end) into the ring."""
    q_desc, k_desc, v_desc = descs
    q_smem, k_bufs, v_bufs = smem
    q_bars, k_ready, k_empty, v_ready, v_empty, _turn = bars
    b, h, hk, q_row, k_row, lo, n_end = coords
    CONSUMERS: gl.constexpr = q_smem.shape[0]
    BLOCK_M: gl.constexpr = q_smem.shape[3]
    BLOCK_N: gl.constexpr = k_bufs.shape[3]
    STAGES: gl.constexpr = k_bufs.shape[0]
    for c in gl.static_range(CONSUMERS):
        mbarrier.expect(q_bars.index(c), q_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(
            q_desc, [b, h, q_row + c * BLOCK_M, 0], q_bars.index(c), q_smem.index(c)
        )
    for j in range(lo, n_end):
        i = j - lo
        slot = i % STAGES
        phase = (i // STAGES) & 1
        mbarrier.wait(k_empty.index(slot), phase ^ 1)
        mbarrier.expect(k_ready.index(slot), k_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(
            k_desc, [b, hk, k_row + j * BLOCK_N, 0], k_ready.index(slot), k_bufs.index(slot)
        )
        mbarrier.wait(v_empty.index(slot), phase ^ 1)
        mbarrier.expect(v_ready.index(slot), v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(
            v_desc, [b, hk, k_row + j * BLOCK_N, 0], v_ready.index(slot), v_bufs.index(slot)
        )


@gluon.jit
def _var_consumer(ME: gl.constexpr, out, smem, bars, coords, scalars, vr,
                  CAUSAL: gl.constexpr, PINGPONG: gl.constexpr, VAR: gl.constexpr):  # fmt: skip
    """Consumer warpgroup ME: rows [row0 + ME·BLOCK_M, +BLOCK_M) of the sequence."""
    q_smem = smem[0]
    h, row0, lo, n_end, lse_base, q_start = coords
    BLOCK_M: gl.constexpr = q_smem.shape[3]
    HEAD_DIM: gl.constexpr = q_smem.shape[4]
    o_layout: gl.constexpr = _acc_layout(HEAD_DIM, 4, q_smem.dtype.primitive_bitwidth)
    my_row0 = row0 + ME * BLOCK_M
    q_tile = q_smem.index(ME)
    mbarrier.wait(bars[0].index(ME), 0)
    if VAR & QSCALE:
        scale_q(q_tile, vr[2], BLOCK_M, HEAD_DIM)
    acc, m_i, l_i = _var_tile(q_tile.reshape([BLOCK_M, HEAD_DIM]), smem, bars, my_row0, lo,
                              n_end, scalars, vr, ME, CAUSAL, PINGPONG, VAR)  # fmt: skip
    _var_epilogue(acc, m_i, l_i, scalars[2], out, lse_base, h, my_row0, scalars[0], q_start,
                  q_tile, vr[3], BLOCK_M, HEAD_DIM, VAR, o_layout)  # fmt: skip


@gluon.jit
def _var_consumer0(out, smem, bars, coords, scalars, vr, CAUSAL: gl.constexpr,
                   PINGPONG: gl.constexpr, VAR: gl.constexpr):  # fmt: skip
    _var_consumer(0, out, smem, bars, coords, scalars, vr, CAUSAL, PINGPONG, VAR)


@gluon.jit
def _var_consumer1(out, smem, bars, coords, scalars, vr, CAUSAL: gl.constexpr,
                   PINGPONG: gl.constexpr, VAR: gl.constexpr):  # fmt: skip
    _var_consumer(1, out, smem, bars, coords, scalars, vr, CAUSAL, PINGPONG, VAR)


@gluon.jit
def _var_consumer2(out, smem, bars, coords, scalars, vr, CAUSAL: gl.constexpr,
                   PINGPONG: gl.constexpr, VAR: gl.constexpr):  # fmt: skip
    _var_consumer(2, out, smem, bars, coords, scalars, vr, CAUSAL, PINGPONG, VAR)


@gluon.jit
def _fwd_ws_var(q_desc, k_desc, v_desc, o_desc, lse_ptr, heads_q, group, seq_q, seq_k, sc,
                win_left, win_right, cap_mul, slopes_ptr, stride_slope_b, alibi_mul,
                cu_q, cu_k, o_ptr, stride_os, stride_oh,
                BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
                STAGES: gl.constexpr, CAUSAL: gl.constexpr, NUM_WARPS: gl.constexpr,
                PINGPONG: gl.constexpr, PRODUCER_REGS: gl.constexpr,
                CONSUMER_REGS: gl.constexpr, CONSUMERS: gl.constexpr,
                VAR: gl.constexpr):  # fmt: skip
    """_fwd_ws with the variants of VAR (its bits from the sixth on: the softmax's code,
    GluonConfig.softmax_code(): the exp2 split, tree reductions). sc is the softmax's log2 factor
    (scale · log2(e), or c · log2(e) with a softcap), cap_mul = scale / c, alibi_mul =
    log2(e) / sc; the arguments of a variant that is off are None. VARLEN: seq_q / seq_k
    are the packed totals, the grid is (sequences · heads_q, query tiles of the longest
    sequence)."""
    gl.static_assert(NUM_WARPS == 4, "each consumer is one warpgroup")
    gl.static_assert(BLOCK_M == 64, "wgmma: 4 warps × 16 rows")
    gl.static_assert(CONSUMERS == 2 or not PINGPONG, "ping-pong takes two consumers")
    dtype: gl.constexpr = q_desc.dtype
    ROWS: gl.constexpr = CONSUMERS * BLOCK_M
    if VAR & VARLEN:
        bh = gl.program_id(0)
        pid = gl.program_id(1)
        if CAUSAL:  # heaviest tiles first: every sequence's last tiles lead
            pid = gl.num_programs(1) - 1 - pid
        b = bh // heads_q
        h = bh % heads_q
        lse_base = h.to(gl.int64) * seq_q
        q_start = gl.load(cu_q + b)
        k_start = gl.load(cu_k + b)
        seq_q = gl.load(cu_q + b + 1) - q_start
        seq_k = gl.load(cu_k + b + 1) - k_start
        lse_base += q_start
        tb = 0  # the (1, H, T, D) views' batch coordinate
    else:
        bh = gl.program_id(1)
        pid = gl.program_id(0)
        if CAUSAL:
            pid = gl.num_programs(0) - 1 - pid
        b = bh // heads_q
        h = bh % heads_q
        lse_base = bh.to(gl.int64) * seq_q
        q_start = 0
        k_start = 0
        tb = b
    row0 = pid * ROWS
    if row0 >= seq_q:  # a packed sequence shorter than this tile's start
        return
    if VAR & WINDOW:
        lo, _lo_full, _n_full, n_end = _window_bounds(row0, ROWS, seq_q, seq_k, win_left,
                                                      win_right, BLOCK_N)  # fmt: skip
    else:
        _n_full, n_end = _kv_bounds(row0, ROWS, seq_q, seq_k, BLOCK_N, CAUSAL)
        lo = 0
    if VAR & ALIBI:
        alibi_k = gl.load(slopes_ptr + b * stride_slope_b + h) * alibi_mul
    else:
        alibi_k = 0.0
    q_smem = gl.allocate_shared_memory(dtype, [CONSUMERS] + q_desc.block_type.shape, q_desc.layout)  # noqa: RUF005
    k_bufs = gl.allocate_shared_memory(dtype, [STAGES] + k_desc.block_type.shape, k_desc.layout)  # noqa: RUF005
    v_bufs = gl.allocate_shared_memory(dtype, [STAGES] + v_desc.block_type.shape, v_desc.layout)  # noqa: RUF005
    bars = _alloc_bars(STAGES, CONSUMERS)
    # the argument tuples are written inline: an assignment would turn constexprs in
    # them into tensors (triton 3.6's code generator)
    if CONSUMERS == 2:
        gl.warp_specialize(
            [
                (
                    _var_consumer0,
                    (
                        (o_desc, lse_ptr, o_ptr, stride_os, stride_oh, tb),
                        (q_smem, k_bufs, v_bufs),
                        bars,
                        (h, row0, lo, n_end, lse_base, q_start),
                        (seq_q, seq_k, sc),
                        (win_left, win_right, cap_mul, alibi_k),
                        CAUSAL,
                        PINGPONG,
                        VAR,
                    ),
                ),
                (
                    _var_consumer1,
                    (
                        (o_desc, lse_ptr, o_ptr, stride_os, stride_oh, tb),
                        (q_smem, k_bufs, v_bufs),
                        bars,
                        (h, row0, lo, n_end, lse_base, q_start),
                        (seq_q, seq_k, sc),
                        (win_left, win_right, cap_mul, alibi_k),
                        CAUSAL,
                        PINGPONG,
                        VAR,
                    ),
                ),
                (
                    _var_producer,
                    (
                        (q_desc, k_desc, v_desc),
                        (q_smem, k_bufs, v_bufs),
                        bars,
                        (tb, h, h // group, q_start + row0, k_start, lo, n_end),
                    ),
                ),
            ],
            [4, 1],
            [CONSUMER_REGS, PRODUCER_REGS],
        )
    else:
        gl.warp_specialize(
            [
                (_var_consumer0, ((o_desc, lse_ptr, o_ptr, stride_os, stride_oh, tb),
                                  (q_smem, k_bufs, v_bufs), bars,
                                  (h, row0, lo, n_end, lse_base, q_start), (seq_q, seq_k, sc),
                                  (win_left, win_right, cap_mul, alibi_k), CAUSAL, PINGPONG,
                                  VAR)),
                (_var_consumer1, ((o_desc, lse_ptr, o_ptr, stride_os, stride_oh, tb),
                                  (q_smem, k_bufs, v_bufs), bars,
                                  (h, row0, lo, n_end, lse_base, q_start), (seq_q, seq_k, sc),
                                  (win_left, win_right, cap_mul, alibi_k), CAUSAL, PINGPONG,
                                  VAR)),
                (_var_consumer2, ((o_desc, lse_ptr, o_ptr, stride_os, stride_oh, tb),
                                  (q_smem, k_bufs, v_bufs), bars,
                                  (h, row0, lo, n_end, lse_base, q_start), (seq_q, seq_k, sc),
                                  (win_left, win_right, cap_mul, alibi_k), CAUSAL, PINGPONG,
                                  VAR)),
                (_var_producer, ((q_desc, k_desc, v_desc), (q_smem, k_bufs, v_bufs), bars,
                                 (tb, h, h // group, q_start + row0, k_start, lo, n_end))),
            ],
            [4, 4, 1],
            [CONSUMER_REGS, CONSUMER_REGS, PRODUCER_REGS],
        )  # fmt: skip
