"""The Gluon fp8 forward's key loop with QKᵀ one block ahead (Fp8GluonConfig(ahead=True)).

In the default loop (flash_gluon_fp8_kernels._step) a consumer issues S_j = Q K_jᵀ and
PV_{j−1} together, waits for S_j, then runs softmax(S_j): the tensor core has PV_{j−1}
to do during the softmax, but the consumer waits for its QKᵀ every step. Here it enters
step j with S_j already computed, issues S_{j+1} and PV_{j−1} back to back, runs
softmax(S_j) while both run, then waits for both (FlashAttention-3's intra-warpgroup
overlap). That needs a second S accumulator (64 more registers per thread), affordable
because P goes through shared memory (P_SMEM), not registers. No ping-pong: the two
consumers interleave on their own.

Block j of the tile is ring index g0 + j; the first block and the last are peeled (no
PV before the first, no QKᵀ after the last); blocks every row sees whole and the masked
ones run in separate loops (the mask a constexpr).
"""

# Gluon constexpr annotations inside the (untyped) jit functions are for triton, not mypy.
# mypy: disable-error-code="annotation-unchecked"

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from fa_bench.kernels.flash_gluon_fp8_parts import (
    _acc_layout,
    _p_layout,
    _rescale,
    _softmax_fp8,
    _tile_start,
)
from fa_bench.kernels.flash_gluon_kernels import _mask


@gluon.jit
def _issue_qk(q2, k_bufs, k_ready, g, s_acc):
    """S = Q K_gᵀ issued asynchronously once K of ring index g has landed; `s_acc` only
    gives the accumulator's registers (use_acc=False)."""
    STAGES: gl.constexpr = k_bufs.shape[0]
    mbarrier.wait(k_ready.index(g % STAGES), (g // STAGES) & 1)
    k_t = k_bufs.index(g % STAGES).reshape([k_bufs.shape[3], k_bufs.shape[4]]).permute((1, 0))
    return warpgroup_mma(q2, k_t, s_acc, use_acc=False, is_async=True)


@gluon.jit
def _issue_pv(p_buf, vt_bufs, v_ready, g, acc):
    """O += P V issued asynchronously, P from its shared-memory buffer."""
    STAGES: gl.constexpr = vt_bufs.shape[0]
    mbarrier.wait(v_ready.index(g % STAGES), (g // STAGES) & 1)
    v = vt_bufs.index(g % STAGES).reshape([vt_bufs.shape[3], vt_bufs.shape[4]]).permute((1, 0))
    return warpgroup_mma(p_buf, v, acc, is_async=True)


@gluon.jit
def _stash(p, p_buf):
    """P into its shared-memory buffer, visible to the warpgroup's wgmma."""
    p_buf.store(p)
    fence_async_shared()
    gl.thread_barrier()


@gluon.jit
def _ahead_step(j, g0, q2, s, acc, m_i, l_i, smem, bars, rows, scalars, ME: gl.constexpr,
                CAUSAL: gl.constexpr, SOFTMAX: gl.constexpr, MASKED: gl.constexpr,
                HAS_PREV: gl.constexpr, HAS_NEXT: gl.constexpr):  # fmt: skip
    """Block j with S_j in hand: issue S_{j+1} (HAS_NEXT) and PV_{j−1} (HAS_PREV), run
    softmax(S_j), stash P_j, wait for both, release their tiles, rescale O. Returns
    (s_next, acc, m_i, l_i); s_next is S_j again without HAS_NEXT."""
    k_bufs, vt_bufs, p_bufs = smem[1], smem[2], smem[3]
    k_ready, k_empty, v_ready, v_empty = bars[1], bars[2], bars[3], bars[4]
    seq_q, seq_k, qk_scale = scalars
    STAGES: gl.constexpr = k_bufs.shape[0]
    BLOCK_N: gl.constexpr = k_bufs.shape[3]
    HEAD_DIM: gl.constexpr = k_bufs.shape[4]
    BLOCK_M: gl.constexpr = q2.shape[0]
    s_layout: gl.constexpr = _acc_layout(BLOCK_N)
    o_layout: gl.constexpr = _acc_layout(HEAD_DIM)
    g = g0 + j
    if HAS_NEXT:  # (a fresh accumulator: S_j's registers are still read below)
        s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)
        s_next = _issue_qk(q2, k_bufs, k_ready, g + 1, s_zero)
    if HAS_PREV:
        acc = _issue_pv(p_bufs.index(2 * ME + (j - 1) % 2), vt_bufs, v_ready, g - 1, acc)
    if MASKED:
        s = _mask(s, rows, j, seq_q, seq_k, BLOCK_N, CAUSAL, s_layout)
    m_i, alpha, l_i, p = _softmax_fp8(s, m_i, l_i, qk_scale, _p_layout(HEAD_DIM), SOFTMAX, True)
    # buffer j % 2: PV_{j-1} reads the other one
    _stash(p, p_bufs.index(2 * ME + j % 2))
    if HAS_NEXT and HAS_PREV:
        s_next, acc = warpgroup_mma_wait(0, deps=[s_next, acc])
    elif HAS_NEXT:
        s_next = warpgroup_mma_wait(0, deps=[s_next])
    elif HAS_PREV:
        acc = warpgroup_mma_wait(0, deps=[acc])
    if HAS_NEXT:
        mbarrier.arrive(k_empty.index((g + 1) % STAGES), count=1)
    else:
        s_next = s
    if HAS_PREV:
        mbarrier.arrive(v_empty.index((g - 1) % STAGES), count=1)
    acc = _rescale(acc, alpha, o_layout, SOFTMAX)
    return s_next, acc, m_i, l_i


@gluon.jit
def _tile_ahead(q2, smem, bars, my_row0, n_end, g0, scalars, ME: gl.constexpr,
                CAUSAL: gl.constexpr, SOFTMAX: gl.constexpr):  # fmt: skip
    """One consumer's rows against key blocks [0, n_end) with QKᵀ one block ahead:
    (acc, m_i, l_i). Uses ring indices g0 .. g0 + n_end − 1."""
    k_bufs, vt_bufs, p_bufs = smem[1], smem[2], smem[3]
    k_ready, k_empty, v_ready, v_empty = bars[1], bars[2], bars[3], bars[4]
    seq_q, seq_k, _qk_scale = scalars
    BLOCK_M: gl.constexpr = q2.shape[0]
    BLOCK_N: gl.constexpr = k_bufs.shape[3]
    HEAD_DIM: gl.constexpr = k_bufs.shape[4]
    STAGES: gl.constexpr = k_bufs.shape[0]
    s_layout: gl.constexpr = _acc_layout(BLOCK_N)
    n_full, rows, m_i, l_i, acc = _tile_start(my_row0, seq_q, seq_k, BLOCK_M, BLOCK_N, HEAD_DIM,
                                              CAUSAL)  # fmt: skip
    if n_end > 0:
        s = _issue_qk(q2, k_bufs, k_ready, g0, gl.zeros([BLOCK_M, BLOCK_N], gl.float32,
                                                        layout=s_layout))  # fmt: skip
        s = warpgroup_mma_wait(0, deps=[s])
        mbarrier.arrive(k_empty.index(g0 % STAGES), count=1)
        # block 0: no PV before it; a QKᵀ after it unless it is the only one
        if n_end > 1:
            s, acc, m_i, l_i = _ahead_step(0, g0, q2, s, acc, m_i, l_i, smem, bars, rows,
                                           scalars, ME, CAUSAL, SOFTMAX, True, False,
                                           True)  # fmt: skip
        else:
            s, acc, m_i, l_i = _ahead_step(0, g0, q2, s, acc, m_i, l_i, smem, bars, rows,
                                           scalars, ME, CAUSAL, SOFTMAX, True, False,
                                           False)  # fmt: skip
        # blocks 1 .. n_end - 2: the whole ones, then the masked ones
        for j in range(1, gl.minimum(n_full, n_end - 1)):
            s, acc, m_i, l_i = _ahead_step(j, g0, q2, s, acc, m_i, l_i, smem, bars, rows,
                                           scalars, ME, CAUSAL, SOFTMAX, False, True,
                                           True)  # fmt: skip
        for j in range(gl.maximum(n_full, 1), n_end - 1):
            s, acc, m_i, l_i = _ahead_step(j, g0, q2, s, acc, m_i, l_i, smem, bars, rows,
                                           scalars, ME, CAUSAL, SOFTMAX, True, True,
                                           True)  # fmt: skip
        last = n_end - 1
        if last > 0:  # the last block: no QKᵀ after it
            s, acc, m_i, l_i = _ahead_step(last, g0, q2, s, acc, m_i, l_i, smem, bars, rows,
                                           scalars, ME, CAUSAL, SOFTMAX, True, True,
                                           False)  # fmt: skip
        acc = _issue_pv(p_bufs.index(2 * ME + last % 2), vt_bufs, v_ready, g0 + last, acc)
        acc = warpgroup_mma_wait(0, deps=[acc])
        mbarrier.arrive(v_empty.index((g0 + last) % STAGES), count=1)
    return acc, m_i, l_i
