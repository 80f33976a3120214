"""The warp-specialised Gluon backward for sm_90 (issue 18): the `@gluon.jit` kernel.

FlashAttention-3's shape, written against triton 3.6.0's Gluon API (the H200's). One CTA
per (2·KEYS keys, batch, kv head), three partitions:

- a producer warp (PRODUCER_REGS registers): K and V once (one KEYS-row tile per
  consumer), then Q_i with its lse2 row and dO_i with its delta row for every visited
  query block of every q head of the GQA group into a STAGES-deep ring (ready mbarriers
  with the transaction count, empty ones with one arrival per consumer);
- two consumer warpgroups of KEYS (64) keys each; per query block of BLOCK_M rows, in the
  log2 domain of the forward,

      Sᵀ = K Qᵀ,  Pᵀ = exp2(Sᵀ · qk_scale − lse2),  dPᵀ = V dOᵀ     (issued back to back)
      dV += Pᵀ dO,  dSᵀ = Pᵀ ∘ (dPᵀ − delta),  dK += dSᵀ Q        (Pᵀ, dSᵀ from registers)
      dQ_share = dS K                                           (dSᵀ through shared memory)

  dK and dV stay in fp32 registers; dQ's shares go through fp32 staging tiles into the
  workspace (B, Hq, Sq, D) with TMA reduce-adds (kernels/flash_gluon_bwd_dq.py). dQ is
  not bitwise reproducible (the adds land in any order); dK and dV are.

Bounds come from the descriptors: Q/dO rows past seq_q load as zeros (their lse2 and
delta as 0), the adds and the dK/dV stores are clipped; keys past seq_k load as zeros
and their P is masked to 0 (an overflowing exp2 would reach dQ as inf · 0). Causal CTAs
start at the first query block that sees their keys, mask only the diagonal blocks, and
run heaviest first within their head; a head's key blocks run together (its dQ
workspace stays in L2).
"""

# Gluon constexpr annotations inside the (untyped) jit functions are for triton, not mypy.
# mypy: disable-error-code="annotation-unchecked"

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma

from fa_bench.kernels.flash_gluon_bwd_step import _bwd_step, _step_coords
from fa_bench.kernels.flash_gluon_bwd_var import _query_range, _scale_k
from fa_bench.kernels.flash_gluon_kernels import _acc_layout


@gluon.jit
def _bwd_producer(descs, smem, bars, coords):
    """One warp: the CTA's K and V once, then the Q/dO ring (with each block's lse2 and
    delta rows)."""
    q_desc, do_desc, k_desc, v_desc, lse_desc, delta_desc = descs
    k_tiles, v_tiles, q_bufs, do_bufs, lse_bufs, delta_bufs = smem
    kv_bar, q_ready, q_empty, do_ready, do_empty = bars[0], bars[1], bars[2], bars[3], bars[4]
    b, hk, key0, m_start, n_m, rot, group, heads_q = coords
    KEYS: gl.constexpr = k_tiles.shape[3]
    BLOCK_M: gl.constexpr = q_bufs.shape[3]
    STAGES: gl.constexpr = q_bufs.shape[0]
    mbarrier.expect(kv_bar, 2 * k_desc.block_type.nbytes + 2 * v_desc.block_type.nbytes)
    for c in gl.static_range(2):
        tma.async_copy_global_to_shared(
            k_desc, [b, hk, key0 + c * KEYS, 0], kv_bar, k_tiles.index(c)
        )
        tma.async_copy_global_to_shared(
            v_desc, [b, hk, key0 + c * KEYS, 0], kv_bar, v_tiles.index(c)
        )
    for t in range(group * n_m):
        hq, m0 = _step_coords(t, hk, group, m_start, n_m, rot, BLOCK_M)
        slot = t % STAGES
        # a fresh mbarrier counts as having completed the phase before 0: the first
        # STAGES waits on "empty" pass at once
        phase = ((t // STAGES) & 1) ^ 1
        mbarrier.wait(q_empty.index(slot), phase)
        row = b * heads_q + hq
        # Q_i with its lse2 (one transaction count), dO_i with its delta
        mbarrier.expect(q_ready.index(slot), q_desc.block_type.nbytes + lse_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [b, hq, m0, 0], q_ready.index(slot),
                                        q_bufs.index(slot))  # fmt: skip
        tma.async_copy_global_to_shared(lse_desc, [row, m0], q_ready.index(slot),
                                        lse_bufs.index(slot))  # fmt: skip
        mbarrier.wait(do_empty.index(slot), phase)
        mbarrier.expect(do_ready.index(slot),
                        do_desc.block_type.nbytes + delta_desc.block_type.nbytes)  # fmt: skip
        tma.async_copy_global_to_shared(do_desc, [b, hq, m0, 0], do_ready.index(slot),
                                        do_bufs.index(slot))  # fmt: skip
        tma.async_copy_global_to_shared(delta_desc, [row, m0], do_ready.index(slot),
                                        delta_bufs.index(slot))  # fmt: skip


@gluon.jit
def _bwd_consumer(ME: gl.constexpr, outs, smem, bars, coords, scalars, CAUSAL: gl.constexpr,
                  DQ_MODE: gl.constexpr, PINGPONG: gl.constexpr,
                  OPS_SMEM: gl.constexpr, DQ_PERM: gl.constexpr, var,
                  VAR: gl.constexpr):  # fmt: skip
    """Consumer warpgroup ME (0 or 1): keys [key0 + ME·KEYS, +KEYS) of the CTA."""
    dk_desc, dv_desc, dq_desc = outs
    k_tiles, v_tiles, q_bufs, do_bufs, lse_bufs, delta_bufs, ds_bufs, dq_bufs = smem
    b, hk, key0, m_start, n_m, rot, group = coords
    seq_q, seq_k, qk_scale, scale = scalars
    KEYS: gl.constexpr = k_tiles.shape[3]
    HEAD_DIM: gl.constexpr = k_tiles.shape[4]
    dtype: gl.constexpr = k_tiles.dtype
    d_layout: gl.constexpr = _acc_layout(HEAD_DIM, 4, dtype.primitive_bitwidth)
    my_key0 = key0 + ME * KEYS
    k_me = k_tiles.index(ME).reshape([KEYS, HEAD_DIM])
    v_me = v_tiles.index(ME).reshape([KEYS, HEAD_DIM])
    dk = gl.zeros([KEYS, HEAD_DIM], gl.float32, layout=d_layout)
    dv = gl.zeros([KEYS, HEAD_DIM], gl.float32, layout=d_layout)
    mbarrier.wait(bars[0], 0)
    if VAR & 8:  # a softcap's K scaled by cap_in in shared memory, both tiles awaited
        _scale_k(k_me, var[2], var[6])
    for t in range(group * n_m):
        dk, dv = _bwd_step(t, ME, (k_tiles, k_me, v_me), ds_bufs, dq_bufs, dk, dv,
                           (q_bufs, do_bufs, lse_bufs, delta_bufs), bars, dq_desc,
                           (b, hk, my_key0, m_start, n_m, rot, group), (seq_q, seq_k, qk_scale),
                           CAUSAL, DQ_MODE, PINGPONG, OPS_SMEM, DQ_PERM, var, VAR)  # fmt: skip
    if DQ_MODE == 1:  # the other consumer's last dQ (over both K tiles) is done reading
        mbarrier.wait(bars[6].index(ME), ((group * n_m) & 1) ^ 1)
    last = group * n_m - 1
    if DQ_MODE == 8 and last >= 0:  # the last step's dQ was the other's: it read our K tile
        if last % 2 != ME:
            mbarrier.wait(bars[6].index(ME), (last // 2) & 1)
    # dK = scale · Σ dSᵀ Q; both go out through this consumer's own K and V tiles (no
    # matmul reads them any more), clipped at seq_k by the descriptors
    k_tiles.index(ME).reshape([KEYS, HEAD_DIM]).store((dk * scale).to(dtype))
    v_tiles.index(ME).reshape([KEYS, HEAD_DIM]).store(dv.to(dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(dk_desc, [b, hk, my_key0, 0], k_tiles.index(ME))
    tma.async_copy_shared_to_global(dv_desc, [b, hk, my_key0, 0], v_tiles.index(ME))
    tma.store_wait(0)


@gluon.jit
def _bwd_consumer0(outs, smem, bars, coords, scalars, CAUSAL: gl.constexpr,
                   DQ_MODE: gl.constexpr, PINGPONG: gl.constexpr,
                   OPS_SMEM: gl.constexpr, DQ_PERM: gl.constexpr, var,
                   VAR: gl.constexpr):  # fmt: skip
    _bwd_consumer(0, outs, smem, bars, coords, scalars, CAUSAL, DQ_MODE, PINGPONG, OPS_SMEM,
                  DQ_PERM, var, VAR)  # fmt: skip


@gluon.jit
def _bwd_consumer1(outs, smem, bars, coords, scalars, CAUSAL: gl.constexpr,
                   DQ_MODE: gl.constexpr, PINGPONG: gl.constexpr,
                   OPS_SMEM: gl.constexpr, DQ_PERM: gl.constexpr, var,
                   VAR: gl.constexpr):  # fmt: skip
    _bwd_consumer(1, outs, smem, bars, coords, scalars, CAUSAL, DQ_MODE, PINGPONG, OPS_SMEM,
                  DQ_PERM, var, VAR)  # fmt: skip


@gluon.jit
def _bwd_bars(STAGES: gl.constexpr):
    """K/V (one transaction barrier), Q and dO ready (the producer's expect) and empty
    (one arrival per consumer) per ring slot; per consumer, its dSᵀ tile ready for and
    freed by the other consumer (DQ_MODE 1); the ping-pong's turn per consumer."""
    layout: gl.constexpr = mbarrier.MBarrierLayout()
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], layout)
    q_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], layout)
    q_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], layout)
    do_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], layout)
    do_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], layout)
    ds_ready = gl.allocate_shared_memory(gl.int64, [2, 1], layout)
    ds_free = gl.allocate_shared_memory(gl.int64, [2, 1], layout)
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], layout)
    mbarrier.init(kv_bar, count=1)
    for c in gl.static_range(2):
        mbarrier.init(ds_ready.index(c), count=1)
        mbarrier.init(ds_free.index(c), count=1)
        mbarrier.init(turn.index(c), count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(q_ready.index(i), count=1)
        mbarrier.init(do_ready.index(i), count=1)
        mbarrier.init(q_empty.index(i), count=2)
        mbarrier.init(do_empty.index(i), count=2)
    return kv_bar, q_ready, q_empty, do_ready, do_empty, ds_ready, ds_free, turn


@gluon.jit
def _bwd_ws(q_desc, k_desc, v_desc, do_desc, dk_desc, dv_desc, dq_desc, lse_desc, delta_desc,
            heads_q, heads_kv, seq_q, seq_k, qk_scale, scale,
            win_left, win_right, cap_in, cap_out, slopes, slope_stride_b,
            BLOCK_M: gl.constexpr, KEYS: gl.constexpr, HEAD_DIM: gl.constexpr,
            STAGES: gl.constexpr, CAUSAL: gl.constexpr, PRODUCER_REGS: gl.constexpr,
            CONSUMER_REGS: gl.constexpr, DQ_MODE: gl.constexpr,
            ROTATE: gl.constexpr, PINGPONG: gl.constexpr,
            OPS_SMEM: gl.constexpr = 0, DQ_PERM: gl.constexpr = False,
            VAR: gl.constexpr = 0):  # fmt: skip
    """Grid: (group, key blocks of 2·KEYS, batch · heads_kv / group), dispatched x
    fastest: with a group of 1 a head's key blocks run together, so the CTAs adding into
    one head's dQ workspace share it in L2 (causal: its heaviest, first, key blocks
    first); a larger group interleaves the key blocks of that many heads
    (kernels/flash_gluon_bwd_order.py, whose grid_position is this order; all of them is
    session 5's key-block-major order, every head's first key blocks first, whose dQ
    workspaces thrashed L2 on the H200).
    DQ_MODE: 0 each consumer adds its keys' dQ share (`_dq_out`), 1 FA3's shared dQ
    (`_dq_shared`), 3 as 0 with dQ's first chunk queued before dV/dK are waited for,
    4 as 0 with both chunks (head_dim 128) queued before dV/dK are waited for, 5 dQ's
    chunks issued between dV and dK, staged and added while dK runs, 6 the same with
    only the first chunk before dK (`_tail_dq_first`); 8 the consumers take turns at all
    of dQ (`_dq_alternate`);
    2 a timing probe (0 without the reduce-adds: dQ left out). OPS_SMEM: which wgmma A
    operands come from shared memory (kernels/flash_gluon_bwd_step.py). DQ_PERM: dQ's
    columns in the staging order (flash_gluon_bwd_dq._staged; the workspace keeps it).
    lse_desc/delta_desc: 2-D (batch · heads_q, seq_q padded to 4) fp32 with a
    [1, BLOCK_M] box. VAR, win_left … slope_stride_b: issue 19's window, softcap and
    ALiBi (kernels/flash_gluon_bwd_var.py; VAR 0: dense, the values unused)."""
    gl.static_assert(KEYS == 64, "a consumer's keys are one wgmma row tile (4 warps × 16)")
    gl.static_assert(BLOCK_M == 64 or BLOCK_M == 128, "query blocks of 64 or 128 rows")
    gl.static_assert(DQ_MODE != 1 or dq_desc.block_type.shape[3] * 2 == HEAD_DIM,
                     "DQ_MODE 1: each consumer adds half of dQ's columns")  # fmt: skip
    gl.static_assert(DQ_MODE != 4 or dq_desc.block_type.shape[3] * 2 == HEAD_DIM,
                     "DQ_MODE 4: two dQ chunks queued at once")  # fmt: skip
    gl.static_assert(OPS_SMEM == 0 or DQ_MODE <= 4 or DQ_MODE == 8, "OPS_SMEM: DQ_MODE 0-4, 8")
    gl.static_assert(
        DQ_MODE != 8 or (OPS_SMEM == 1 and dq_desc.block_type.shape[3] == HEAD_DIM),
        "DQ_MODE 8: dSᵀ through shared memory, one add of all dQ's columns",
    )
    gl.static_assert(OPS_SMEM != 3 or DQ_MODE != 1, "OPS_SMEM 3 sums the consumers' own shares")
    gl.static_assert(OPS_SMEM != 3 or DQ_MODE != 2, "OPS_SMEM 3 always reduce-adds")
    dtype: gl.constexpr = q_desc.dtype
    kb = gl.program_id(1)
    bhk = gl.program_id(2) * gl.num_programs(0) + gl.program_id(0)
    b = bhk // heads_kv
    hk = bhk % heads_kv
    group = heads_q // heads_kv
    key0 = kb * (2 * KEYS)
    # the query blocks that see the CTA's keys (causal: from the diagonal; a window: its
    # edges, and none at all for keys no row sees)
    m_start, n_m = _query_range(key0, 2 * KEYS, seq_q, seq_k, win_left, win_right, BLOCK_M,
                                CAUSAL, VAR)  # fmt: skip
    rot = 0
    if ROTATE and not CAUSAL:
        # every key block of a head starts at another query block: their dQ reduce-adds
        # land on different rows of the workspace at any moment, not all on the same ones
        # (causal CTAs start at their diagonal anyway)
        if VAR & 1:
            rot = kb % gl.maximum(n_m, 1)
        else:
            rot = kb % n_m
    tile: gl.constexpr = q_desc.block_type.shape
    kv_tile: gl.constexpr = k_desc.block_type.shape
    k_tiles = gl.allocate_shared_memory(dtype, [2] + kv_tile, k_desc.layout)  # noqa: RUF005
    v_tiles = gl.allocate_shared_memory(dtype, [2] + kv_tile, v_desc.layout)  # noqa: RUF005
    q_bufs = gl.allocate_shared_memory(dtype, [STAGES] + tile, q_desc.layout)  # noqa: RUF005
    do_bufs = gl.allocate_shared_memory(dtype, [STAGES] + tile, do_desc.layout)  # noqa: RUF005
    row: gl.constexpr = lse_desc.block_type.shape
    lse_bufs = gl.allocate_shared_memory(gl.float32, [STAGES] + row, lse_desc.layout)  # noqa: RUF005
    delta_bufs = gl.allocate_shared_memory(gl.float32, [STAGES] + row, delta_desc.layout)  # noqa: RUF005
    ds_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([KEYS, BLOCK_M], dtype)
    # per consumer its dSᵀ tile (index ME) and, OPS_SMEM 2, its Pᵀ tile (index 2 + ME)
    ds_bufs = gl.allocate_shared_memory(dtype, [2 if OPS_SMEM < 2 else 4, KEYS, BLOCK_M],
                                        ds_layout)  # fmt: skip
    # per consumer, one fp32 staging tile per 64 head_dim columns of its dQ share
    dq_tile: gl.constexpr = dq_desc.block_type.shape
    # DQ_MODE 1: one tile of half the columns per consumer (FA3's dQ, `_dq_shared`)
    chunks: gl.constexpr = 1 if DQ_MODE == 1 else HEAD_DIM // dq_tile[3]
    dq_bufs = gl.allocate_shared_memory(gl.float32, [2 * chunks] + dq_tile, dq_desc.layout)  # noqa: RUF005
    bars = _bwd_bars(STAGES)
    if VAR & 8:  # both consumers have scaled their K tile (flash_gluon_bwd_var._scale_k)
        kbar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        mbarrier.init(kbar, count=2)
    else:
        kbar: gl.constexpr = None  # type: ignore[no-redef]  # a constexpr, as triton needs
    # the argument tuples are written inline: an assignment would turn constexprs in
    # them into tensors (triton 3.6's code generator)
    gl.warp_specialize(
        [
            (_bwd_consumer0, ((dk_desc, dv_desc, dq_desc),
                              (k_tiles, v_tiles, q_bufs, do_bufs, lse_bufs, delta_bufs,
                               ds_bufs, dq_bufs), bars,
                              (b, hk, key0, m_start, n_m, rot, group),
                              (seq_q, seq_k, qk_scale, scale), CAUSAL, DQ_MODE, PINGPONG,
                              OPS_SMEM, DQ_PERM,
                              (win_left, win_right, cap_in, cap_out, slopes, slope_stride_b,
                               kbar),
                              VAR)),
            (_bwd_consumer1, ((dk_desc, dv_desc, dq_desc),
                              (k_tiles, v_tiles, q_bufs, do_bufs, lse_bufs, delta_bufs,
                               ds_bufs, dq_bufs), bars,
                              (b, hk, key0, m_start, n_m, rot, group),
                              (seq_q, seq_k, qk_scale, scale), CAUSAL, DQ_MODE, PINGPONG,
                              OPS_SMEM, DQ_PERM,
                              (win_left, win_right, cap_in, cap_out, slopes, slope_stride_b,
                               kbar),
                              VAR)),
            (_bwd_producer, ((q_desc, do_desc, k_desc, v_desc, lse_desc, delta_desc),
                             (k_tiles, v_tiles, q_bufs, do_bufs, lse_bufs, delta_bufs), bars,
                             (b, hk, key0, m_start, n_m, rot, group, heads_q))),
        ],
        [4, 1],
        [CONSUMER_REGS, PRODUCER_REGS],
    )  # fmt: skip
