"""The persistent form of the Gluon fp8 forward (Fp8GluonConfig(persistent=True)).

The partitions of flash_gluon_fp8_kernels.py looping over tiles, as the bf16 persistent
kernel (kernels/flash_gluon_persist.py) does: one CTA per SM at most, CTA p takes tiles
p, p + P, ... of a fixed order (causal: the (batch, head)s in groups of bh_group, whose
K/V fit in L2 together, each group by query position from the last, every (batch, head)
of the group at one position before the next (bh_group = batch · heads: the bf16 kernel's
order, whose working set at 4k, 64 heads × 1 MB of fp8 K/V, is larger than the L2);
otherwise (batch, head) major, as the bf16 kernel), the ring
indices and ping-pong turns run on across tiles. What differs from bf16: O has its own
shared-memory tile (Q's fp8 tile is too small for it), so a consumer frees its Q buffer
as soon as its last QKᵀ is done, and the producer loads the next tile's Q while this
tile's last PV and epilogue run (no second Q buffer needed). The O tile's TMA store is not
waited for at the end of its epilogue (the non-persistent kernel's does): the wait comes
before the next tile's O is written into the same buffer (_epilogue's DEFER), so the store
runs under the next tile's matmuls, and once after the last tile. The key loop (_tile),
the producer's K/V loads (_load_kv) and the epilogue are the plain kernel's own helpers.
"""

# Gluon constexpr annotations inside the (untyped) jit functions are for triton, not mypy.
# mypy: disable-error-code="annotation-unchecked"

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

from fa_bench.kernels.flash_gluon_fp8_kernels import _epilogue, _load_kv, _tile
from fa_bench.kernels.flash_gluon_fp8_parts import _alloc_bars, _alloc_smem
from fa_bench.kernels.flash_gluon_kernels import _kv_bounds
from fa_bench.kernels.flash_gluon_persist import _n_tiles
from fa_bench.kernels.flash_gluon_persist import _tile as _coords


@gluon.jit
def _tile_at(t, sched, bh_group, HALF: gl.constexpr, BLOCK_N: gl.constexpr,
             CAUSAL: gl.constexpr):  # fmt: skip
    """Tile t of the order above: (b, h, kv head, flat (b, h) index, first row, n_end).
    A tile has 2 · HALF rows (HALF = consumers · BLOCK_M / 2: the bf16 kernel's helpers
    take tiles of two BLOCK_M)."""
    if CAUSAL:
        heads_q, group, seq_q, seq_k, n_bh = sched
        n_m = gl.cdiv(seq_q, 2 * HALF)
        grp = t // (n_m * bh_group)
        first = grp * bh_group
        size = gl.minimum(bh_group, n_bh - first)  # the last group may be smaller
        r = t - grp * (n_m * bh_group)
        row0 = (n_m - 1 - r // size) * (2 * HALF)
        bh = first + r % size
        _n_full, n_end = _kv_bounds(row0, 2 * HALF, seq_q, seq_k, BLOCK_N, CAUSAL)
        h = bh % heads_q
        return bh // heads_q, h, h // group, bh.to(gl.int64), row0, n_end
    else:
        return _coords(t, sched, HALF, BLOCK_N, CAUSAL)


@gluon.jit
def _my_tiles(sched, plan, HALF: gl.constexpr, LPT: gl.constexpr):
    """(first, end, step) of this CTA's loop index: the round robin over every tile, or
    (LPT) its range of the host's plan (kernels/flash_gluon_fp8_sched.py)."""
    if LPT:
        pid = gl.program_id(0)
        return gl.load(plan + pid), gl.load(plan + pid + 1), 1
    else:
        return gl.program_id(0), _n_tiles(sched, HALF), gl.num_programs(0)


@gluon.jit
def _tile_id(i, plan, LPT: gl.constexpr):
    """The tile of loop index i (LPT: the plan's ids follow its num_programs + 1 offsets)."""
    if LPT:
        return gl.load(plan + gl.num_programs(0) + 1 + i)
    else:
        return i


@gluon.jit
def _producer(descs, smem, bars, q_empty, sched, bh_group, plan, CAUSAL: gl.constexpr,
              LPT: gl.constexpr):  # fmt: skip
    """One warp: per tile, every consumer's Q tile (once freed), then K/Vᵀ."""
    q_desc = descs[0]
    q_smem, q_bars = smem[0], bars[0]
    BLOCK_M: gl.constexpr = q_smem.shape[3]
    BLOCK_N: gl.constexpr = smem[1].shape[3]
    CONSUMERS: gl.constexpr = q_smem.shape[0]
    HALF: gl.constexpr = CONSUMERS * BLOCK_M // 2
    g = 0
    it = 0
    first, end, step = _my_tiles(sched, plan, HALF, LPT)
    for i in range(first, end, step):
        t = _tile_id(i, plan, LPT)
        b, h, hk, _bh, row0, n_end = _tile_at(t, sched, bh_group, HALF, BLOCK_N, CAUSAL)
        for c in gl.static_range(CONSUMERS):
            mbarrier.wait(q_empty.index(c), (it & 1) ^ 1)
            mbarrier.expect(q_bars.index(c), q_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(
                q_desc, [b, h, row0 + c * BLOCK_M, 0], q_bars.index(c), q_smem.index(c)
            )
        _load_kv(descs, smem, bars, b, hk, g, n_end)
        g += n_end
        it += 1


@gluon.jit
def _consumer(ME: gl.constexpr, out, smem, bars, q_empty, sched, bh_group, sm_scale_log2,
              descales, plan, CAUSAL: gl.constexpr, PINGPONG: gl.constexpr,
              SOFTMAX: gl.constexpr, P_SMEM: gl.constexpr, LPT: gl.constexpr):  # fmt: skip
    """Consumer warpgroup ME over its tiles; the ring index g and turn count tc run on."""
    q_smem, o_smem = smem[0], smem[3]
    _heads_q, _group, seq_q, seq_k, _n_bh = sched
    q_descale_ptr, k_descale_ptr, v_descale_ptr = descales
    BLOCK_M: gl.constexpr = q_smem.shape[3]
    HEAD_DIM: gl.constexpr = q_smem.shape[4]
    BLOCK_N: gl.constexpr = smem[1].shape[3]
    HALF: gl.constexpr = q_smem.shape[0] * BLOCK_M // 2
    qk_scale = gl.load(q_descale_ptr) * gl.load(k_descale_ptr) * sm_scale_log2
    v_descale = gl.load(v_descale_ptr)
    g = 0
    tc = 0
    it = 0
    first, end, step = _my_tiles(sched, plan, HALF, LPT)
    for i in range(first, end, step):
        t = _tile_id(i, plan, LPT)
        b, h, _hk, bh, row0, n_end = _tile_at(t, sched, bh_group, HALF, BLOCK_N, CAUSAL)
        my_row0 = row0 + ME * BLOCK_M
        mbarrier.wait(bars[0].index(ME), it & 1)
        q2 = q_smem.index(ME).reshape([BLOCK_M, HEAD_DIM])
        acc, m_i, l_i = _tile(q2, (q_smem, smem[1], smem[2], smem[4]), bars, my_row0, n_end, g,
                              tc, (seq_q, seq_k, qk_scale), ME, CAUSAL, PINGPONG, SOFTMAX,
                              P_SMEM)  # fmt: skip
        # every QKᵀ of the tile is done: the producer may load the next tile's Q
        mbarrier.arrive(q_empty.index(ME), count=1)
        _epilogue(acc, m_i, l_i, o_smem.index(ME), out, (b, h, bh, my_row0), (seq_q, qk_scale),
                  v_descale, True)  # fmt: skip
        g += n_end
        tc += gl.maximum(n_end - 1, 0)
        it += 1
    tma.store_wait(0)


@gluon.jit
def _consumer0(out, smem, bars, q_empty, sched, bh_group, sm_scale_log2, descales, plan,
               CAUSAL: gl.constexpr, PINGPONG: gl.constexpr, SOFTMAX: gl.constexpr,
               P_SMEM: gl.constexpr, LPT: gl.constexpr):  # fmt: skip
    _consumer(0, out, smem, bars, q_empty, sched, bh_group, sm_scale_log2, descales, plan,
              CAUSAL, PINGPONG, SOFTMAX, P_SMEM, LPT)  # fmt: skip


@gluon.jit
def _consumer1(out, smem, bars, q_empty, sched, bh_group, sm_scale_log2, descales, plan,
               CAUSAL: gl.constexpr, PINGPONG: gl.constexpr, SOFTMAX: gl.constexpr,
               P_SMEM: gl.constexpr, LPT: gl.constexpr):  # fmt: skip
    _consumer(1, out, smem, bars, q_empty, sched, bh_group, sm_scale_log2, descales, plan,
              CAUSAL, PINGPONG, SOFTMAX, P_SMEM, LPT)  # fmt: skip


@gluon.jit
def _consumer2(out, smem, bars, q_empty, sched, bh_group, sm_scale_log2, descales, plan,
               CAUSAL: gl.constexpr, PINGPONG: gl.constexpr, SOFTMAX: gl.constexpr,
               P_SMEM: gl.constexpr, LPT: gl.constexpr):  # fmt: skip
    _consumer(2, out, smem, bars, q_empty, sched, bh_group, sm_scale_log2, descales, plan,
              CAUSAL, PINGPONG, SOFTMAX, P_SMEM, LPT)  # fmt: skip


@gluon.jit
def _fwd_fp8_persistent(q_desc, k_desc, vt_desc, o_desc, lse_ptr, q_descale_ptr,
                        k_descale_ptr, v_descale_ptr, heads_q, group, seq_q, seq_k,
                        sm_scale_log2, n_bh, bh_group, plan, BLOCK_M: gl.constexpr,
                        BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, STAGES: gl.constexpr,
                        CAUSAL: gl.constexpr, PINGPONG: gl.constexpr, SOFTMAX: gl.constexpr,
                        PRODUCER_REGS: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                        P_SMEM: gl.constexpr, CONSUMERS: gl.constexpr = 2,
                        LPT: gl.constexpr = False):  # fmt: skip
    """Launched with min(SMs, tiles) CTAs; n_bh = batch · heads_q; bh_group (1..n_bh): the
    causal order's (batch, head)s per group; LPT: each CTA's tiles from `plan` (int32,
    kernels/flash_gluon_fp8_sched.py; None otherwise: the round robin); the rest
    (CONSUMERS 2 or 3) as _fwd_fp8_ws."""
    gl.static_assert(BLOCK_M == 64, "wgmma: a consumer warpgroup's 4 warps × 16 rows")
    q_smem, k_bufs, vt_bufs, o_smem, p_smem = _alloc_smem(q_desc, k_desc, vt_desc, o_desc,
                                                          BLOCK_M, BLOCK_N, HEAD_DIM, STAGES,
                                                          P_SMEM, CONSUMERS)  # fmt: skip
    bars = _alloc_bars(STAGES, CONSUMERS)
    q_empty = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
    for c in gl.static_range(CONSUMERS):
        mbarrier.init(q_empty.index(c), count=1)
    if CONSUMERS == 3:
        _specialize3(q_desc, k_desc, vt_desc, o_desc, lse_ptr, (q_smem, k_bufs, vt_bufs, o_smem,
                     p_smem), bars, q_empty, (heads_q, group, seq_q, seq_k, n_bh), bh_group,
                     sm_scale_log2, (q_descale_ptr, k_descale_ptr, v_descale_ptr), plan, CAUSAL,
                     PINGPONG, SOFTMAX, PRODUCER_REGS, CONSUMER_REGS, P_SMEM, LPT)  # fmt: skip
    else:
        # the argument tuples are written inline: an assignment would turn constexprs in
        # them into tensors (triton 3.6's code generator)
        gl.warp_specialize(
            [
                (_consumer0, ((o_desc, lse_ptr), (q_smem, k_bufs, vt_bufs, o_smem, p_smem),
                              bars, q_empty, (heads_q, group, seq_q, seq_k, n_bh), bh_group,
                              sm_scale_log2, (q_descale_ptr, k_descale_ptr, v_descale_ptr),
                              plan, CAUSAL, PINGPONG, SOFTMAX, P_SMEM, LPT)),
                (_consumer1, ((o_desc, lse_ptr), (q_smem, k_bufs, vt_bufs, o_smem, p_smem),
                              bars, q_empty, (heads_q, group, seq_q, seq_k, n_bh), bh_group,
                              sm_scale_log2, (q_descale_ptr, k_descale_ptr, v_descale_ptr),
                              plan, CAUSAL, PINGPONG, SOFTMAX, P_SMEM, LPT)),
                (_producer, ((q_desc, k_desc, vt_desc), (q_smem, k_bufs, vt_bufs, o_smem,
                             p_smem), bars, q_empty, (heads_q, group, seq_q, seq_k, n_bh),
                             bh_group, plan, CAUSAL, LPT)),
            ],
            [4, 1],
            [CONSUMER_REGS, PRODUCER_REGS],
        )  # fmt: skip


@gluon.jit
def _specialize3(q_desc, k_desc, vt_desc, o_desc, lse_ptr, smem, bars, q_empty, sched,
                 bh_group, sm_scale_log2, descales, plan, CAUSAL: gl.constexpr,
                 PINGPONG: gl.constexpr, SOFTMAX: gl.constexpr, PRODUCER_REGS: gl.constexpr,
                 CONSUMER_REGS: gl.constexpr, P_SMEM: gl.constexpr,
                 LPT: gl.constexpr):  # fmt: skip
    """_fwd_fp8_persistent's partitions with three consumers."""
    gl.warp_specialize(
        [
            (_consumer0, ((o_desc, lse_ptr), smem, bars, q_empty, sched, bh_group, sm_scale_log2,
                          descales, plan, CAUSAL, PINGPONG, SOFTMAX, P_SMEM, LPT)),
            (_consumer1, ((o_desc, lse_ptr), smem, bars, q_empty, sched, bh_group, sm_scale_log2,
                          descales, plan, CAUSAL, PINGPONG, SOFTMAX, P_SMEM, LPT)),
            (_consumer2, ((o_desc, lse_ptr), smem, bars, q_empty, sched, bh_group, sm_scale_log2,
                          descales, plan, CAUSAL, PINGPONG, SOFTMAX, P_SMEM, LPT)),
            (_producer, ((q_desc, k_desc, vt_desc), smem, bars, q_empty, sched, bh_group, plan,
                         CAUSAL, LPT)),
        ],
        [4, 4, 1],
        [CONSUMER_REGS, CONSUMER_REGS, PRODUCER_REGS],
    )  # fmt: skip
