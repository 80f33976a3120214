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
The dense kernels are not touched, so their code is the same as before.
"""

# Gluon constexpr annotations inside the (untyped) jit functions are for triton, not mypy.
# mypy: disable-error-code="annotation-unchecked"

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    mbarrier,
    tma,
    warpgroup_mma_wait,
)

from fa_bench.kernels.flash_gluon_kernels import (
    _acc_layout,
    _kv_bounds,
    _p_layout,
    _softmax,
)
from fa_bench.kernels.flash_gluon_var import (
    ALIBI,
    ALIBI_COL,
    FIXED_MAX,
    HEADROOM,
    LAZY,
    LAZY_WARP,
    QSCALE,
    SOFTCAP,
    VARLEN,
    WINDOW,
    _needs_mask,
    _var_epilogue,
    _var_mask,
    _var_scores,
    _window_bounds,
    alibi_positions,
    alibi_shift,
    fixed_p,
    lazy_rescale,
    scale_q,
    softmax_fixed,
    softmax_lazy,
)
from fa_bench.kernels.flash_gluon_var_fp16 import SUMCHECK, softmax_sumcheck, warp_mul
from fa_bench.kernels.flash_gluon_var_sum import lazy_sum, p_bf16, sum_levels
from fa_bench.kernels.flash_gluon_ws import _alloc_bars, _pv, _qk


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
def _var_s(s, rows, j, lo_full, n_full, scalars, vr, CAUSAL: gl.constexpr, VAR: gl.constexpr,
           layout: gl.constexpr):  # fmt: skip
    """Block j's scores: softcap, ALiBi, then the mask where the block needs one."""
    seq_q, seq_k, _sc = scalars
    win_left, win_right, cap_mul, alibi_k, posf, colf = vr
    BLOCK_N: gl.constexpr = s.shape[1]
    if VAR & (SOFTCAP | ALIBI):
        s = _var_scores(s, j, cap_mul, alibi_k, posf, colf, BLOCK_N, VAR)
    if _needs_mask(j, lo_full, n_full, VAR):
        s = _var_mask(s, rows, j, seq_q, seq_k, win_left, win_right, BLOCK_N, CAUSAL, VAR,
                      layout)  # fmt: skip
    return s


@gluon.jit
def _var_step(j, i, q2, acc, m_i, l_i, p, smem, bars, rows, lo_full, n_full, scalars, vr,
              ME: gl.constexpr, CAUSAL: gl.constexpr, PINGPONG: gl.constexpr,
              VAR: gl.constexpr):  # fmt: skip
    """Key block j (ring index i = j − lo ≥ 1, turn i − 1): flash_gluon_ws._ws_step with
    the variant scores."""
    q_smem, k_bufs, v_bufs = smem
    k_ready, k_empty, v_ready, v_empty, turn = bars[1], bars[2], bars[3], bars[4], bars[5]
    BLOCK_M: gl.constexpr = q_smem.shape[3]
    STAGES: gl.constexpr = k_bufs.shape[0]
    BLOCK_N: gl.constexpr = k_bufs.shape[3]
    dtype: gl.constexpr = k_bufs.dtype
    s_layout: gl.constexpr = _acc_layout(BLOCK_N, 4, dtype.primitive_bitwidth)
    o_layout: gl.constexpr = _acc_layout(k_bufs.shape[4], 4, dtype.primitive_bitwidth)
    p_layout: gl.constexpr = _p_layout(k_bufs.shape[4], 4, dtype.primitive_bitwidth)
    mbarrier.wait(k_ready.index(i % STAGES), (i // STAGES) & 1)
    if PINGPONG:
        mbarrier.wait(turn.index(ME), (i - 1 + 1 - ME) & 1)
    s = _qk(q2, k_bufs, i, gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout))
    acc = _pv(p, v_bufs, v_ready, i - 1, acc)
    if PINGPONG:
        mbarrier.arrive(turn.index(1 - ME), count=1)
    if sum_levels(VAR, BLOCK_N) > 0:  # P_{j−1}'s row sums while S_j and PV_{j−1} run
        l_i = lazy_sum(p, l_i, s_layout, sum_levels(VAR, BLOCK_N))
    s = warpgroup_mma_wait(1, deps=[s])  # S_j done; PV_{j-1} may still run
    mbarrier.arrive(k_empty.index(i % STAGES), count=1)
    s = _var_s(s, rows, j, lo_full, n_full, scalars, vr, CAUSAL, VAR, s_layout)
    SOFTMAX: gl.constexpr = (VAR >> 6) & 31  # GluonConfig.softmax_code() (kernels/gluon_exp2.py)
    if VAR & FIXED_MAX:  # a fixed offset: no row max, nothing to rescale
        if sum_levels(VAR, BLOCK_N) > 0:  # P only: its sums come in the next step
            p_next = gl.convert_layout(p_bf16(fixed_p(s, scalars[2], SOFTMAX), VAR), p_layout)
        else:
            l_i, p_next = softmax_fixed(s, l_i, scalars[2], dtype, p_layout, SOFTMAX)
        acc, p = warpgroup_mma_wait(0, deps=[acc, p])
        mbarrier.arrive(v_empty.index((i - 1) % STAGES), count=1)
    elif VAR & SUMCHECK:  # m (log2 units) moves where a block's sum says: no row max
        m_i, l_i, p_next, alpha, flag = softmax_sumcheck(s, m_i, l_i, scalars[2], dtype,
                                                         p_layout, SOFTMAX)  # fmt: skip
        acc, p = warpgroup_mma_wait(0, deps=[acc, p])
        mbarrier.arrive(v_empty.index((i - 1) % STAGES), count=1)
        acc = warp_mul(acc, alpha, flag, o_layout)
    elif VAR & LAZY:  # m moves past LAZY_TAU only: most steps rescale nothing
        if VAR & ALIBI_COL:
            shift = alibi_shift(j, vr[3], vr[4], BLOCK_N)
        else:
            shift = 0.0
        m_in = m_i - shift
        m_new, sums, p_next = softmax_lazy(s, m_in, l_i, scalars[2], dtype, p_layout, SOFTMAX)
        acc, p = warpgroup_mma_wait(0, deps=[acc, p])
        mbarrier.arrive(v_empty.index((i - 1) % STAGES), count=1)
        acc, l_i = lazy_rescale(acc, l_i, m_in, m_new, scalars[2], o_layout, VAR & LAZY_WARP)
        l_i = l_i + sums
        m_i = m_new + shift
    else:
        if VAR & ALIBI_COL:  # scores relative to the block's ALiBi offset (alibi_shift)
            shift = alibi_shift(j, vr[3], vr[4], BLOCK_N)
            m_i, alpha, l_i, p_next = _softmax(s, m_i - shift, l_i, scalars[2], dtype,
                                               p_layout, SOFTMAX)  # fmt: skip
            m_i = m_i + shift
        else:
            m_i, alpha, l_i, p_next = _softmax(s, m_i, l_i, scalars[2], dtype, p_layout,
                                               SOFTMAX)  # fmt: skip
        acc, p = warpgroup_mma_wait(0, deps=[acc, p])
        mbarrier.arrive(v_empty.index((i - 1) % STAGES), count=1)
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, o_layout)), 1)
    return acc, m_i, l_i, p_next


@gluon.jit
def _var_tile(q2, smem, bars, my_row0, lo, n_end, scalars, vr, ME: gl.constexpr,
              CAUSAL: gl.constexpr, PINGPONG: gl.constexpr, VAR: gl.constexpr):  # fmt: skip
    """One consumer's BLOCK_M rows against key blocks [lo, n_end): (acc, m_i, l_i)."""
    q_smem, k_bufs, v_bufs = smem
    k_ready, k_empty, v_ready, v_empty = bars[1], bars[2], bars[3], bars[4]
    seq_q, seq_k, sc = scalars
    BLOCK_M: gl.constexpr = q_smem.shape[3]
    HEAD_DIM: gl.constexpr = q_smem.shape[4]
    BLOCK_N: gl.constexpr = k_bufs.shape[3]
    STAGES: gl.constexpr = k_bufs.shape[0]
    dtype: gl.constexpr = q_smem.dtype
    s_layout: gl.constexpr = _acc_layout(BLOCK_N, 4, dtype.primitive_bitwidth)
    o_layout: gl.constexpr = _acc_layout(HEAD_DIM, 4, dtype.primitive_bitwidth)
    p_layout: gl.constexpr = _p_layout(HEAD_DIM, 4, dtype.primitive_bitwidth)
    if VAR & WINDOW:
        _lo, lo_full, n_full, _hi = _window_bounds(my_row0, BLOCK_M, seq_q, seq_k, vr[0], vr[1],
                                                   BLOCK_N)  # fmt: skip
    else:
        n_full, _n_mine = _kv_bounds(my_row0, BLOCK_M, seq_q, seq_k, BLOCK_N, CAUSAL)
        lo_full = 0
    rows = my_row0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
    posf, colf = alibi_positions(rows, my_row0, seq_k - seq_q, BLOCK_N, VAR, s_layout)
    vr = (vr[0], vr[1], vr[2], vr[3], posf, colf)
    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=gl.SliceLayout(1, s_layout))
    l_i = gl.full([BLOCK_M], 0.0, gl.float32, layout=gl.SliceLayout(1, s_layout))
    acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, layout=o_layout)
    if n_end > lo:
        # block lo: S and its softmax, nothing to overlap with yet
        mbarrier.wait(k_ready.index(0), 0)
        s = _qk(q2, k_bufs, 0, gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout))
        s = warpgroup_mma_wait(0, deps=[s])
        mbarrier.arrive(k_empty.index(0), count=1)
        s = _var_s(s, rows, lo, lo_full, n_full, scalars, vr, CAUSAL, VAR, s_layout)
        SOFTMAX: gl.constexpr = (VAR >> 6) & 31
        if VAR & FIXED_MAX:
            if sum_levels(VAR, BLOCK_N) > 0:  # its sums in the next step (lazy_sum)
                p = gl.convert_layout(p_bf16(fixed_p(s, sc, SOFTMAX), VAR), p_layout)
            else:
                l_i, p = softmax_fixed(s, l_i, sc, dtype, p_layout, SOFTMAX)
            m_i = gl.full([BLOCK_M], 1.0 - HEADROOM / sc, gl.float32, gl.SliceLayout(1, s_layout))
        elif VAR & SUMCHECK:
            m_i, l_i, p, _alpha, _flag = softmax_sumcheck(s, m_i, l_i, sc, dtype, p_layout,
                                                          SOFTMAX)  # fmt: skip
        elif VAR & ALIBI_COL:
            shift = alibi_shift(lo, vr[3], vr[4], BLOCK_N)
            m_i, _alpha, l_i, p = _softmax(s, m_i - shift, l_i, sc, dtype, p_layout, SOFTMAX)
            m_i = m_i + shift
        else:
            m_i, _alpha, l_i, p = _softmax(s, m_i, l_i, sc, dtype, p_layout, SOFTMAX)
        for j in range(lo + 1, n_end):
            acc, m_i, l_i, p = _var_step(j, j - lo, q2, acc, m_i, l_i, p, smem, bars, rows,
                                         lo_full, n_full, scalars, vr, ME, CAUSAL, PINGPONG,
                                         VAR)  # fmt: skip
        last = n_end - 1 - lo
        acc = _pv(p, v_bufs, v_ready, last, acc)
        if sum_levels(VAR, BLOCK_N) > 0:  # the last block's sums
            l_i = lazy_sum(p, l_i, s_layout, sum_levels(VAR, BLOCK_N))
        acc, p = warpgroup_mma_wait(0, deps=[acc, p])
        mbarrier.arrive(v_empty.index(last % STAGES), count=1)
    if VAR & SUMCHECK:  # the epilogue's m is in score units
        m_i = m_i / sc
    return acc, m_i, l_i


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
