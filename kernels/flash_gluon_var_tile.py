"""One consumer warpgroup's rows of the variant forward (sm_90): the key-block loop of
kernels/flash_gluon_var_ws.py (issue 19's variants, VAR's bits: kernels/flash_gluon_var.py),
apart from the kernel's launch and roles so each file stays focused.

`_var_tile` runs a consumer's BLOCK_M rows against key blocks [lo, n_end): block lo alone,
then `_var_step` per block (S_j issued, PV_{j−1} issued, S_j's variant scores and mask,
the softmax the launch's bits pick: the running max, the bf16 fixed offset, session 9's
threshold rescale or session 10's sum check for fp16 softcap), then the last PV.
"""

# Gluon constexpr annotations inside the (untyped) jit functions are for triton, not mypy.
# mypy: disable-error-code="annotation-unchecked"

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, warpgroup_mma_wait

from fa_bench.kernels.flash_gluon_kernels import _acc_layout, _kv_bounds, _p_layout, _softmax
from fa_bench.kernels.flash_gluon_var import (
    ALIBI,
    ALIBI_COL,
    FIXED_MAX,
    HEADROOM,
    LAZY,
    LAZY_WARP,
    SOFTCAP,
    WINDOW,
    _needs_mask,
    _var_mask,
    _var_scores,
    _window_bounds,
    alibi_positions,
    alibi_shift,
    fixed_p,
    lazy_rescale,
    softmax_fixed,
    softmax_lazy,
    warp_mul,
)
from fa_bench.kernels.flash_gluon_var_fp16 import SUM_EARLY, SUMCHECK, softmax_sumcheck
from fa_bench.kernels.flash_gluon_var_sum import lazy_sum, p_bf16, sum_levels
from fa_bench.kernels.flash_gluon_ws import _pv, _qk


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
                                                         p_layout, SOFTMAX,
                                                         VAR & SUM_EARLY)  # fmt: skip
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
                                                          SOFTMAX, VAR & SUM_EARLY)  # fmt: skip
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
