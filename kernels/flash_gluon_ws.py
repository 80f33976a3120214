"""The warp-specialised Gluon forward for sm_90 (GluonConfig.variant "ws", issue 21).

A CTA owns 2·BLOCK_M query rows of one (batch, head) and three partitions:
- a producer of one warp (its warpgroup drops to PRODUCER_REGS registers per thread):
  both Q tiles once, then K_j and V_j into ring slot j % STAGES as soon as both
  consumers have released the slot; K and V have their own ready/empty mbarriers, so
  QKᵀ starts before V lands;
- two consumer warpgroups (the default partition is consumer 0, a worker consumer 1),
  each owning its own BLOCK_M-row Q tile and sharing every K/V tile. Per key block
  j ≥ 1 a consumer issues S_j = Q K_jᵀ and O += P_{j−1} V_{j−1} back to back, waits for
  S_j only, releases K_j, computes softmax(S_j) while PV runs, then waits for PV,
  releases V_{j−1} and rescales O: the next QKᵀ is always queued before a softmax;
- ping-pong: a pair of mbarriers passes the turn to issue wgmma between the two
  consumers, so one's softmax overlaps the other's matmuls.

Shared helpers (layouts, bounds, mask, softmax, epilogue) are in flash_gluon_kernels.py.
Tile sizes are read from the shared-memory buffers' shapes inside the partitions (a
constexpr passed through an assigned tuple would become a tensor in triton 3.6).
"""

# Gluon constexpr annotations inside the (untyped) jit functions are for triton, not mypy.
# mypy: disable-error-code="annotation-unchecked"

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from fa_bench.kernels.flash_gluon_kernels import (
    _acc_layout,
    _epilogue,
    _kv_bounds,
    _mask,
    _p_layout,
    _program,
    _softmax,
)


@gluon.jit
def _ws_producer(descs, smem, bars, coords):
    """One warp: both Q tiles, then the K/V ring."""
    q_desc, k_desc, v_desc = descs
    q_smem, k_bufs, v_bufs = smem
    q_bars, k_ready, k_empty, v_ready, v_empty, _turn = bars
    b, h, hk, row0, n_end = coords
    CONSUMERS: gl.constexpr = q_smem.shape[0]
    BLOCK_M: gl.constexpr = q_smem.shape[3]
    BLOCK_N: gl.constexpr = k_bufs.shape[3]
    STAGES: gl.constexpr = k_bufs.shape[0]
    for c in gl.static_range(CONSUMERS):
        mbarrier.expect(q_bars.index(c), q_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(
            q_desc, [b, h, row0 + c * BLOCK_M, 0], q_bars.index(c), q_smem.index(c)
        )
    for j in range(n_end):
        slot = j % STAGES
        phase = (j // STAGES) & 1
        # a fresh mbarrier counts as having completed the phase before 0: the first
        # STAGES waits on "empty" pass at once
        mbarrier.wait(k_empty.index(slot), phase ^ 1)
        mbarrier.expect(k_ready.index(slot), k_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(
            k_desc, [b, hk, j * BLOCK_N, 0], k_ready.index(slot), k_bufs.index(slot)
        )
        mbarrier.wait(v_empty.index(slot), phase ^ 1)
        mbarrier.expect(v_ready.index(slot), v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(
            v_desc, [b, hk, j * BLOCK_N, 0], v_ready.index(slot), v_bufs.index(slot)
        )


@gluon.jit
def _qk(q2, k_bufs, g, s_zero):
    """S = Q Kᵀ issued asynchronously on the K tile in ring slot g % STAGES."""
    STAGES: gl.constexpr = k_bufs.shape[0]
    k_t = k_bufs.index(g % STAGES).reshape([k_bufs.shape[3], k_bufs.shape[4]]).permute((1, 0))
    return warpgroup_mma(q2, k_t, s_zero, use_acc=False, is_async=True)


@gluon.jit
def _pv(p, v_bufs, v_ready, g, acc):
    """O += P V issued asynchronously, once the V tile of ring index g has landed."""
    STAGES: gl.constexpr = v_bufs.shape[0]
    mbarrier.wait(v_ready.index(g % STAGES), (g // STAGES) & 1)
    v = v_bufs.index(g % STAGES).reshape([v_bufs.shape[3], v_bufs.shape[4]])
    return warpgroup_mma(p, v, acc, is_async=True)


@gluon.jit
def _ws_step(j, g, tc, q2, acc, m_i, l_i, p, smem, bars, rows, n_full, scalars,
             ME: gl.constexpr, CAUSAL: gl.constexpr, PINGPONG: gl.constexpr,
             SOFTMAX: gl.constexpr = 0):  # fmt: skip
    """Key block j ≥ 1 of one consumer's tile (ring index g, tc-th turn of the ping-pong):
    returns the new (acc, m_i, l_i, p). SOFTMAX: the softmax's variant code (_softmax)."""
    q_smem, k_bufs, v_bufs = smem
    k_ready, k_empty, v_ready, v_empty, turn = bars[1], bars[2], bars[3], bars[4], bars[5]
    seq_q, seq_k, qk_scale = scalars
    BLOCK_M: gl.constexpr = q_smem.shape[3]
    STAGES: gl.constexpr = k_bufs.shape[0]
    BLOCK_N: gl.constexpr = k_bufs.shape[3]
    dtype: gl.constexpr = k_bufs.dtype
    s_layout: gl.constexpr = _acc_layout(BLOCK_N, 4, dtype.primitive_bitwidth)
    o_layout: gl.constexpr = _acc_layout(k_bufs.shape[4], 4, dtype.primitive_bitwidth)
    p_layout: gl.constexpr = _p_layout(k_bufs.shape[4], 4, dtype.primitive_bitwidth)
    mbarrier.wait(k_ready.index(g % STAGES), (g // STAGES) & 1)
    if PINGPONG:
        # consumer 0 goes first: its first wait (parity 1) passes on a fresh barrier;
        # consumer 1's first one waits for consumer 0's first arrival
        mbarrier.wait(turn.index(ME), (tc + 1 - ME) & 1)
    s = _qk(q2, k_bufs, g, gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout))
    acc = _pv(p, v_bufs, v_ready, g - 1, acc)
    if PINGPONG:
        mbarrier.arrive(turn.index(1 - ME), count=1)
    s = warpgroup_mma_wait(1, deps=[s])  # S_j done; PV_{j-1} may still run
    mbarrier.arrive(k_empty.index(g % STAGES), count=1)
    if j >= n_full:
        s = _mask(s, rows, j, seq_q, seq_k, BLOCK_N, CAUSAL, s_layout)
    m_i, alpha, l_i, p_next = _softmax(s, m_i, l_i, qk_scale, dtype, p_layout, SOFTMAX)
    acc, p = warpgroup_mma_wait(0, deps=[acc, p])
    mbarrier.arrive(v_empty.index((g - 1) % STAGES), count=1)
    acc = acc * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, o_layout)), 1)
    return acc, m_i, l_i, p_next


@gluon.jit
def _ws_tile(q2, smem, bars, my_row0, n_end, g0, tc0, scalars,
             ME: gl.constexpr, CAUSAL: gl.constexpr, PINGPONG: gl.constexpr,
             SOFTMAX: gl.constexpr = 0):  # fmt: skip
    """One consumer's BLOCK_M rows against key blocks [0, n_end), the first at ring index
    g0, its ping-pong turns counted from tc0: returns (acc, m_i, l_i). Uses ring indices
    g0 .. g0 + n_end − 1 and n_end − 1 turns."""
    q_smem, k_bufs, v_bufs = smem
    k_ready, k_empty, v_ready, v_empty = bars[1], bars[2], bars[3], bars[4]
    seq_q, seq_k, qk_scale = scalars
    BLOCK_M: gl.constexpr = q_smem.shape[3]
    HEAD_DIM: gl.constexpr = q_smem.shape[4]
    BLOCK_N: gl.constexpr = k_bufs.shape[3]
    STAGES: gl.constexpr = k_bufs.shape[0]
    dtype: gl.constexpr = q_smem.dtype
    s_layout: gl.constexpr = _acc_layout(BLOCK_N, 4, dtype.primitive_bitwidth)
    o_layout: gl.constexpr = _acc_layout(HEAD_DIM, 4, dtype.primitive_bitwidth)
    p_layout: gl.constexpr = _p_layout(HEAD_DIM, 4, dtype.primitive_bitwidth)
    n_full, _n_mine = _kv_bounds(my_row0, BLOCK_M, seq_q, seq_k, BLOCK_N, CAUSAL)
    rows = my_row0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=gl.SliceLayout(1, s_layout))
    l_i = gl.full([BLOCK_M], 0.0, gl.float32, layout=gl.SliceLayout(1, s_layout))
    acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, layout=o_layout)
    if n_end > 0:
        # block 0: S_0 and its softmax, nothing to overlap with yet
        mbarrier.wait(k_ready.index(g0 % STAGES), (g0 // STAGES) & 1)
        s = _qk(q2, k_bufs, g0, gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout))
        s = warpgroup_mma_wait(0, deps=[s])
        mbarrier.arrive(k_empty.index(g0 % STAGES), count=1)
        if 0 >= n_full:
            s = _mask(s, rows, 0, seq_q, seq_k, BLOCK_N, CAUSAL, s_layout)
        m_i, _alpha, l_i, p = _softmax(s, m_i, l_i, qk_scale, dtype, p_layout, SOFTMAX)
        for j in range(1, n_end):
            acc, m_i, l_i, p = _ws_step(j, g0 + j, tc0 + j - 1, q2, acc, m_i, l_i, p, smem, bars,
                                        rows, n_full, scalars, ME, CAUSAL, PINGPONG,
                                        SOFTMAX)  # fmt: skip
        last = g0 + n_end - 1
        acc = _pv(p, v_bufs, v_ready, last, acc)
        acc, p = warpgroup_mma_wait(0, deps=[acc, p])
        mbarrier.arrive(v_empty.index(last % STAGES), count=1)
    return acc, m_i, l_i


@gluon.jit
def _ws_consumer(ME: gl.constexpr, out, smem, bars, coords, scalars,
                 CAUSAL: gl.constexpr, PINGPONG: gl.constexpr,
                 SOFTMAX: gl.constexpr = 0):  # fmt: skip
    """Consumer warpgroup ME (0 or 1): rows [row0 + ME·BLOCK_M, +BLOCK_M)."""
    o_desc, lse_ptr = out
    q_smem = smem[0]
    b, h, bh, row0, n_end = coords
    seq_q, _seq_k, qk_scale = scalars
    BLOCK_M: gl.constexpr = q_smem.shape[3]
    HEAD_DIM: gl.constexpr = q_smem.shape[4]
    o_layout: gl.constexpr = _acc_layout(HEAD_DIM, 4, q_smem.dtype.primitive_bitwidth)
    my_row0 = row0 + ME * BLOCK_M
    q_tile = q_smem.index(ME)
    mbarrier.wait(bars[0].index(ME), 0)
    acc, m_i, l_i = _ws_tile(q_tile.reshape([BLOCK_M, HEAD_DIM]), smem, bars, my_row0, n_end,
                             0, 0, scalars, ME, CAUSAL, PINGPONG, SOFTMAX)  # fmt: skip
    _epilogue(acc, m_i, l_i, qk_scale, q_tile, o_desc, lse_ptr, bh * seq_q, b, h, my_row0, seq_q,
              BLOCK_M, HEAD_DIM, o_layout)  # fmt: skip


@gluon.jit
def _ws_consumer0(out, smem, bars, coords, scalars, CAUSAL: gl.constexpr, PINGPONG: gl.constexpr,
                  SOFTMAX: gl.constexpr = 0):  # fmt: skip
    _ws_consumer(0, out, smem, bars, coords, scalars, CAUSAL, PINGPONG, SOFTMAX)


@gluon.jit
def _ws_consumer1(out, smem, bars, coords, scalars, CAUSAL: gl.constexpr, PINGPONG: gl.constexpr,
                  SOFTMAX: gl.constexpr = 0):  # fmt: skip
    _ws_consumer(1, out, smem, bars, coords, scalars, CAUSAL, PINGPONG, SOFTMAX)


@gluon.jit
def _ws_consumer2(out, smem, bars, coords, scalars, CAUSAL: gl.constexpr, PINGPONG: gl.constexpr,
                  SOFTMAX: gl.constexpr = 0):  # fmt: skip
    _ws_consumer(2, out, smem, bars, coords, scalars, CAUSAL, PINGPONG, SOFTMAX)


@gluon.jit
def _alloc_bars(STAGES: gl.constexpr, CONSUMERS: gl.constexpr = 2):
    """The mbarriers: Q (one per consumer), K/V ready (one arrival: the producer's
    expect) and empty (one arrival per consumer), and the ping-pong turn."""
    layout: gl.constexpr = mbarrier.MBarrierLayout()
    q_bars = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], layout)
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], layout)
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], layout)
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], layout)
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], layout)
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], layout)
    for c in gl.static_range(CONSUMERS):
        mbarrier.init(q_bars.index(c), count=1)
    for c in gl.static_range(2):
        mbarrier.init(turn.index(c), count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=CONSUMERS)
        mbarrier.init(v_empty.index(i), count=CONSUMERS)
    return q_bars, k_ready, k_empty, v_ready, v_empty, turn


@gluon.jit
def _fwd_ws(q_desc, k_desc, v_desc, o_desc, lse_ptr, heads_q, group, seq_q, seq_k, qk_scale,
            BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
            STAGES: gl.constexpr, CAUSAL: gl.constexpr, NUM_WARPS: gl.constexpr,
            PINGPONG: gl.constexpr, PRODUCER_REGS: gl.constexpr,
            CONSUMER_REGS: gl.constexpr, CONSUMERS: gl.constexpr,
            SOFTMAX: gl.constexpr = 0):  # fmt: skip
    """CONSUMERS (2, or 3 without ping-pong: FA3's head_dim 64 shape) warpgroups of
    BLOCK_M rows each. Registers: the producer's warpgroup gets PRODUCER_REGS per thread,
    the worker consumers CONSUMER_REGS, consumer 0 (the default partition, the kernel's 4
    warps) what is left of the 64K (triton's AllocateWarpGroups: 240 for 24 / 240 with 2
    consumers, 168 for 24 / 160 with 3). SOFTMAX: the softmax's variant code
    (GluonConfig.softmax_code: the exp2 split, tree reductions; 0 = the plain softmax)."""
    gl.static_assert(NUM_WARPS == 4, "each consumer is one warpgroup")
    gl.static_assert(BLOCK_M == 64, "wgmma: 4 warps × 16 rows")
    gl.static_assert(CONSUMERS == 2 or not PINGPONG, "ping-pong takes two consumers")
    dtype: gl.constexpr = q_desc.dtype
    b, h, hk, bh = _program(heads_q, group)
    pid = gl.program_id(0)
    if CAUSAL:  # heaviest tiles first
        pid = gl.num_programs(0) - 1 - pid
    row0 = pid * (CONSUMERS * BLOCK_M)
    # every consumer steps through the keys of the CTA's last row (the others mask their
    # extra diagonal blocks): they share every K/V tile and release it once each
    _n_full, n_end = _kv_bounds(row0, CONSUMERS * BLOCK_M, seq_q, seq_k, BLOCK_N, CAUSAL)
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
                    _ws_consumer0,
                    (
                        (o_desc, lse_ptr),
                        (q_smem, k_bufs, v_bufs),
                        bars,
                        (b, h, bh, row0, n_end),
                        (seq_q, seq_k, qk_scale),
                        CAUSAL,
                        PINGPONG,
                        SOFTMAX,
                    ),
                ),
                (
                    _ws_consumer1,
                    (
                        (o_desc, lse_ptr),
                        (q_smem, k_bufs, v_bufs),
                        bars,
                        (b, h, bh, row0, n_end),
                        (seq_q, seq_k, qk_scale),
                        CAUSAL,
                        PINGPONG,
                        SOFTMAX,
                    ),
                ),
                (
                    _ws_producer,
                    (
                        (q_desc, k_desc, v_desc),
                        (q_smem, k_bufs, v_bufs),
                        bars,
                        (b, h, hk, row0, n_end),
                    ),
                ),
            ],
            [4, 1],
            [CONSUMER_REGS, PRODUCER_REGS],
        )
    else:
        gl.warp_specialize(
            [
                (_ws_consumer0, ((o_desc, lse_ptr), (q_smem, k_bufs, v_bufs), bars,
                                 (b, h, bh, row0, n_end), (seq_q, seq_k, qk_scale), CAUSAL,
                                 PINGPONG, SOFTMAX)),
                (_ws_consumer1, ((o_desc, lse_ptr), (q_smem, k_bufs, v_bufs), bars,
                                 (b, h, bh, row0, n_end), (seq_q, seq_k, qk_scale), CAUSAL,
                                 PINGPONG, SOFTMAX)),
                (_ws_consumer2, ((o_desc, lse_ptr), (q_smem, k_bufs, v_bufs), bars,
                                 (b, h, bh, row0, n_end), (seq_q, seq_k, qk_scale), CAUSAL,
                                 PINGPONG, SOFTMAX)),
                (_ws_producer, ((q_desc, k_desc, v_desc), (q_smem, k_bufs, v_bufs), bars,
                                (b, h, hk, row0, n_end))),
            ],
            [4, 4, 1],
            [CONSUMER_REGS, CONSUMER_REGS, PRODUCER_REGS],
        )  # fmt: skip
