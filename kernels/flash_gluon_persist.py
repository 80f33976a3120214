"""The persistent warp-specialised Gluon forward (GluonConfig(persistent=True), issue 21).

The partitions of flash_gluon_ws.py, looping over tiles: the grid is one CTA per SM (at
most), CTA p takes tiles p, p + P, p + 2P, ... of a fixed order, so no CTA waits for a
launch slot and the last wave is not left to chance:
- causal: tiles by query position from the last (the heaviest: most keys) to the first,
  every (batch, head) at one position before the next position, so the heavy tiles of
  all heads run first and the light ones fill the tail;
- not causal: (batch, head) major, as the non-persistent grid (concurrent CTAs share a
  head's K/V in L2).

The K/V ring's indices and the ping-pong's turns run on across tiles (each partition
counts them the same way); the Q buffers get an "empty" mbarrier per consumer: a
consumer releases its Q buffer after its O (written through it) has been stored, and the
producer waits for that before loading the next tile's Q.
"""

# Gluon constexpr annotations inside the (untyped) jit functions are for triton, not mypy.
# mypy: disable-error-code="annotation-unchecked"

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

from fa_bench.kernels.flash_gluon_kernels import _acc_layout, _epilogue, _kv_bounds
from fa_bench.kernels.flash_gluon_ws import _alloc_bars, _ws_tile


@gluon.jit
def _tile(t, sched, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr):
    """Tile t of the fixed order: (b, h, kv head, flat (b, h) index, first row, n_end)."""
    heads_q, group, seq_q, seq_k, n_bh = sched
    n_m = gl.cdiv(seq_q, 2 * BLOCK_M)
    if CAUSAL:
        m = n_m - 1 - t // n_bh
        bh = t % n_bh
    else:
        m = t % n_m
        bh = t // n_m
    row0 = m * (2 * BLOCK_M)
    _n_full, n_end = _kv_bounds(row0, 2 * BLOCK_M, seq_q, seq_k, BLOCK_N, CAUSAL)
    h = bh % heads_q
    return bh // heads_q, h, h // group, bh.to(gl.int64), row0, n_end


@gluon.jit
def _n_tiles(sched, BLOCK_M: gl.constexpr):
    _heads_q, _group, seq_q, _seq_k, n_bh = sched
    return gl.cdiv(seq_q, 2 * BLOCK_M) * n_bh


@gluon.jit
def _persist_producer(descs, smem, bars, q_empty, sched, CAUSAL: gl.constexpr):
    """One warp: per tile, both Q tiles (once their buffers are free), then its K/V.
    With two Q buffers per consumer the next tile's Q loads while this tile runs."""
    q_desc, k_desc, v_desc = descs
    q_smem, k_bufs, v_bufs = smem
    q_bars, k_ready, k_empty, v_ready, v_empty = bars[0], bars[1], bars[2], bars[3], bars[4]
    Q_BUFFERS: gl.constexpr = q_smem.shape[0] // 2
    BLOCK_M: gl.constexpr = q_smem.shape[3]
    BLOCK_N: gl.constexpr = k_bufs.shape[3]
    STAGES: gl.constexpr = k_bufs.shape[0]
    g = 0
    it = 0
    for t in range(gl.program_id(0), _n_tiles(sched, BLOCK_M), gl.num_programs(0)):
        b, h, hk, _bh, row0, n_end = _tile(t, sched, BLOCK_M, BLOCK_N, CAUSAL)
        for c in gl.static_range(2):
            qs = (it % Q_BUFFERS) * 2 + c
            mbarrier.wait(q_empty.index(qs), ((it // Q_BUFFERS) & 1) ^ 1)
            mbarrier.expect(q_bars.index(qs), q_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(
                q_desc, [b, h, row0 + c * BLOCK_M, 0], q_bars.index(qs), q_smem.index(qs)
            )
        for j in range(n_end):
            slot = (g + j) % STAGES
            phase = ((g + j) // STAGES) & 1
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
        g += n_end
        it += 1


@gluon.jit
def _persist_consumer(ME: gl.constexpr, out, smem, bars, q_empty, sched, qk_scale,
                      CAUSAL: gl.constexpr, PINGPONG: gl.constexpr,
                      SOFTMAX: gl.constexpr = 0):  # fmt: skip
    """Consumer warpgroup ME over its tiles: ring index g and turn count tc run on."""
    o_desc, lse_ptr = out
    q_smem, k_bufs = smem[0], smem[1]
    _heads_q, _group, seq_q, seq_k, _n_bh = sched
    BLOCK_M: gl.constexpr = q_smem.shape[3]
    HEAD_DIM: gl.constexpr = q_smem.shape[4]
    BLOCK_N: gl.constexpr = k_bufs.shape[3]
    o_layout: gl.constexpr = _acc_layout(HEAD_DIM, 4, q_smem.dtype.primitive_bitwidth)
    Q_BUFFERS: gl.constexpr = q_smem.shape[0] // 2
    g = 0
    tc = 0
    it = 0
    for t in range(gl.program_id(0), _n_tiles(sched, BLOCK_M), gl.num_programs(0)):
        b, h, _hk, bh, row0, n_end = _tile(t, sched, BLOCK_M, BLOCK_N, CAUSAL)
        my_row0 = row0 + ME * BLOCK_M
        qs = (it % Q_BUFFERS) * 2 + ME
        q_tile = q_smem.index(qs)
        mbarrier.wait(bars[0].index(qs), (it // Q_BUFFERS) & 1)
        acc, m_i, l_i = _ws_tile(q_tile.reshape([BLOCK_M, HEAD_DIM]), smem, bars, my_row0, n_end,
                                 g, tc, (seq_q, seq_k, qk_scale), ME, CAUSAL, PINGPONG,
                                 SOFTMAX)  # fmt: skip
        _epilogue(acc, m_i, l_i, qk_scale, q_tile, o_desc, lse_ptr, bh * seq_q, b, h, my_row0,
                  seq_q, BLOCK_M, HEAD_DIM, o_layout)  # fmt: skip
        # O has left the Q buffer (the epilogue waited for its store): free it
        mbarrier.arrive(q_empty.index(qs), count=1)
        g += n_end
        tc += gl.maximum(n_end - 1, 0)
        it += 1


@gluon.jit
def _persist_consumer0(out, smem, bars, q_empty, sched, qk_scale,
                       CAUSAL: gl.constexpr, PINGPONG: gl.constexpr,
                       SOFTMAX: gl.constexpr = 0):  # fmt: skip
    _persist_consumer(0, out, smem, bars, q_empty, sched, qk_scale, CAUSAL, PINGPONG, SOFTMAX)


@gluon.jit
def _persist_consumer1(out, smem, bars, q_empty, sched, qk_scale,
                       CAUSAL: gl.constexpr, PINGPONG: gl.constexpr,
                       SOFTMAX: gl.constexpr = 0):  # fmt: skip
    _persist_consumer(1, out, smem, bars, q_empty, sched, qk_scale, CAUSAL, PINGPONG, SOFTMAX)


@gluon.jit
def _fwd_ws_persistent(q_desc, k_desc, v_desc, o_desc, lse_ptr, heads_q, group, seq_q, seq_k,
                       qk_scale, n_bh, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                       HEAD_DIM: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr,
                       NUM_WARPS: gl.constexpr, PINGPONG: gl.constexpr,
                       PRODUCER_REGS: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                       Q_BUFFERS: gl.constexpr, SOFTMAX: gl.constexpr = 0):  # fmt: skip
    """Launched with min(SMs, tiles) CTAs; n_bh = batch · heads_q. Registers, SOFTMAX as _fwd_ws.
    Q_BUFFERS (1 or 2) Q tiles per consumer: buffer (it % Q_BUFFERS) · 2 + consumer."""
    gl.static_assert(NUM_WARPS == 4, "each consumer is one warpgroup")
    gl.static_assert(BLOCK_M == 64, "wgmma: 4 warps × 16 rows")
    dtype: gl.constexpr = q_desc.dtype
    q_shape: gl.constexpr = [2 * Q_BUFFERS] + q_desc.block_type.shape  # noqa: RUF005
    q_smem = gl.allocate_shared_memory(dtype, q_shape, q_desc.layout)
    k_bufs = gl.allocate_shared_memory(dtype, [STAGES] + k_desc.block_type.shape, k_desc.layout)  # noqa: RUF005
    v_bufs = gl.allocate_shared_memory(dtype, [STAGES] + v_desc.block_type.shape, v_desc.layout)  # noqa: RUF005
    ring = _alloc_bars(STAGES)
    # Q "full" and "empty" barriers per buffer (the ring's own Q barriers go unused)
    q_full = gl.allocate_shared_memory(gl.int64, [2 * Q_BUFFERS, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [2 * Q_BUFFERS, 1], mbarrier.MBarrierLayout())
    for c in gl.static_range(2 * Q_BUFFERS):
        mbarrier.init(q_full.index(c), count=1)
        mbarrier.init(q_empty.index(c), count=1)
    bars = (q_full, ring[1], ring[2], ring[3], ring[4], ring[5])
    # the argument tuples are written inline: an assignment would turn constexprs in
    # them into tensors (triton 3.6's code generator)
    gl.warp_specialize(
        [
            (_persist_consumer0, ((o_desc, lse_ptr), (q_smem, k_bufs, v_bufs), bars, q_empty,
                                  (heads_q, group, seq_q, seq_k, n_bh), qk_scale, CAUSAL,
                                  PINGPONG, SOFTMAX)),
            (_persist_consumer1, ((o_desc, lse_ptr), (q_smem, k_bufs, v_bufs), bars, q_empty,
                                  (heads_q, group, seq_q, seq_k, n_bh), qk_scale, CAUSAL,
                                  PINGPONG, SOFTMAX)),
            (_persist_producer, ((q_desc, k_desc, v_desc), (q_smem, k_bufs, v_bufs), bars,
                                 q_empty, (heads_q, group, seq_q, seq_k, n_bh), CAUSAL)),
        ],
        [4, 1],
        [CONSUMER_REGS, PRODUCER_REGS],
    )  # fmt: skip
