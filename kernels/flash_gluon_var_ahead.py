"""The variant forward's key loop with QKᵀ one block ahead (issue 19, session 12; the AHEAD
bit, a development switch: flash_gluon_varhost.SOFTCAP_AHEAD).

Why: in `_var_tile`'s step a consumer issues S_j = Q K_jᵀ and PV_{j−1} together and
waits for S_j at once, so every step it waits out its own QKᵀ (behind the other
consumers' matmuls) before the softmax may start; with a softcap the softmax is two MUFU
ops per score, as long as both matmuls at the tensor cores' peak. Here a consumer enters
step j with S_j issued a whole softmax earlier: it issues PV_{j−1}, waits for S_j (done
by then), issues S_{j+1}, and runs softmax(S_j) while PV_{j−1} and S_{j+1} run.
FlashAttention-3's intra-warpgroup overlap; the fp8 kernel's form of it
(kernels/flash_gluon_fp8_ahead.py) lost 6-12% against ping-pong, where the softmax is
short. The cost: a second S accumulator live through the softmax (32 registers at 64-key
blocks), so it suits launches with registers to spare (two consumers at 240).

The blocks, the scores and the softmax are `_var_tile`'s (`_var_first`, `_var_update`):
only the order of issue and wait differs; the last block is peeled (nothing to issue
ahead of it).
"""

# Gluon constexpr annotations inside the (untyped) jit functions are for triton, not mypy.
# mypy: disable-error-code="annotation-unchecked"

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, warpgroup_mma_wait

from fa_bench.kernels.flash_gluon_kernels import _acc_layout, _kv_bounds, _p_layout
from fa_bench.kernels.flash_gluon_var import WINDOW, _window_bounds, alibi_positions
from fa_bench.kernels.flash_gluon_var_fp16 import SUMCHECK
from fa_bench.kernels.flash_gluon_var_sum import lazy_sum, sum_levels
from fa_bench.kernels.flash_gluon_var_tile import _var_first, _var_update
from fa_bench.kernels.flash_gluon_ws import _pv, _qk

# The VAR bit (flash_gluon_varhost mirrors it; a test checks), above SUM_EARLY (524288).
AHEAD = gl.constexpr(1048576)


@gluon.jit
def _ahead_step(j, i, q2, acc, m_i, l_i, p, s, smem, bars, rows, lo_full, n_full, scalars, vr,
                CAUSAL: gl.constexpr, VAR: gl.constexpr, NEXT: gl.constexpr):  # fmt: skip
    """Key block j (ring index i ≥ 1) with S_j done: PV_{j−1} issued, then S_{j+1} where
    NEXT, S_j's softmax while both run, PV_{j−1}'s wait and O's rescale, S_{j+1}'s wait:
    (acc, m_i, l_i, P_j, S_{j+1})."""
    _q_smem, k_bufs, v_bufs = smem
    k_ready, k_empty, v_ready, v_empty = bars[1], bars[2], bars[3], bars[4]
    BLOCK_N: gl.constexpr = k_bufs.shape[3]
    STAGES: gl.constexpr = k_bufs.shape[0]
    BLOCK_M: gl.constexpr = q2.shape[0]
    s_layout: gl.constexpr = _acc_layout(BLOCK_N, 4, k_bufs.dtype.primitive_bitwidth)
    acc = _pv(p, v_bufs, v_ready, i - 1, acc)
    if sum_levels(VAR, BLOCK_N) > 0:  # P_{j−1}'s row sums while the matmuls run
        l_i = lazy_sum(p, l_i, s_layout, sum_levels(VAR, BLOCK_N))
    if NEXT:
        mbarrier.wait(k_ready.index((i + 1) % STAGES), ((i + 1) // STAGES) & 1)
        s_next = _qk(q2, k_bufs, i + 1, gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout))
        # PV_{j−1} was issued first: its wait leaves S_{j+1} running through O's rescale
        acc, m_i, l_i, p = _var_update(s, j, i, acc, m_i, l_i, p, v_empty, rows, lo_full,
                                       n_full, scalars, vr, CAUSAL, VAR, 1,
                                       k_bufs.shape[4])  # fmt: skip
        s_next = warpgroup_mma_wait(0, deps=[s_next])
        mbarrier.arrive(k_empty.index((i + 1) % STAGES), count=1)
    else:
        s_next = s
        acc, m_i, l_i, p = _var_update(s, j, i, acc, m_i, l_i, p, v_empty, rows, lo_full,
                                       n_full, scalars, vr, CAUSAL, VAR, 0,
                                       k_bufs.shape[4])  # fmt: skip
    return acc, m_i, l_i, p, s_next


@gluon.jit
def _var_tile_ahead(q2, smem, bars, my_row0, lo, n_end, scalars, vr, CAUSAL: gl.constexpr,
                    VAR: gl.constexpr):  # fmt: skip
    """`_var_tile` with QKᵀ one block ahead (no ping-pong): (acc, m_i, l_i)."""
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
        zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)
        mbarrier.wait(k_ready.index(0), 0)
        s_lo = _qk(q2, k_bufs, 0, zero)
        s_lo = warpgroup_mma_wait(0, deps=[s_lo])
        mbarrier.arrive(k_empty.index(0), count=1)
        if n_end > lo + 1:  # S_{lo+1} runs during the first softmax
            mbarrier.wait(k_ready.index(1 % STAGES), (1 // STAGES) & 1)
            s = _qk(q2, k_bufs, 1, zero)
            m_i, l_i, p = _var_first(s_lo, m_i, l_i, rows, lo, lo_full, n_full, scalars, vr,
                                     CAUSAL, VAR, dtype, p_layout)  # fmt: skip
            s = warpgroup_mma_wait(0, deps=[s])
            mbarrier.arrive(k_empty.index(1 % STAGES), count=1)
        else:
            m_i, l_i, p = _var_first(s_lo, m_i, l_i, rows, lo, lo_full, n_full, scalars, vr,
                                     CAUSAL, VAR, dtype, p_layout)  # fmt: skip
            s = s_lo
        for j in range(lo + 1, n_end - 1):
            acc, m_i, l_i, p, s = _ahead_step(j, j - lo, q2, acc, m_i, l_i, p, s, smem, bars,
                                              rows, lo_full, n_full, scalars, vr, CAUSAL, VAR,
                                              True)  # fmt: skip
        if n_end - 1 > lo:
            acc, m_i, l_i, p, s = _ahead_step(n_end - 1, n_end - 1 - lo, q2, acc, m_i, l_i, p,
                                              s, smem, bars, rows, lo_full, n_full, scalars,
                                              vr, CAUSAL, VAR, False)  # fmt: skip
        last = n_end - 1 - lo
        acc = _pv(p, v_bufs, v_ready, last, acc)
        if sum_levels(VAR, BLOCK_N) > 0:  # the last block's sums
            l_i = lazy_sum(p, l_i, s_layout, sum_levels(VAR, BLOCK_N))
        acc, p = warpgroup_mma_wait(0, deps=[acc, p])
        mbarrier.arrive(v_empty.index(last % STAGES), count=1)
    if VAR & SUMCHECK:  # the epilogue's m is in score units
        m_i = m_i / sc
    return acc, m_i, l_i
