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
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from fa_bench.kernels.flash_gluon_bwd_dq import (
    _dq_finish,
    _dq_issue,
    _dq_out,
    _dq_shared,
    _tail_dq_first,
)
from fa_bench.kernels.flash_gluon_kernels import _acc_layout, _p_layout


@gluon.jit
def _step_coords(t, hk, group, m_start, n_m, rot, BLOCK_M: gl.constexpr):
    """Step t of a CTA's loop: (q head, first row of the query block). The loop runs the
    q heads of the group one after another, each over query blocks [m_start, m_start + n_m)
    starting at block m_start + rot (wrapping around)."""
    hq = hk * group + t // n_m
    m0 = (m_start + (t % n_m + rot) % n_m) * BLOCK_M
    return hq, m0


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
def _p_masked(p_t, m0, my_key0, seq_q, seq_k, CAUSAL: gl.constexpr):
    """Pᵀ with keys past seq_k (and, causal, past each row's diagonal) set to 0; only
    the blocks that need it (the key tail, the diagonal) pay the mask."""
    KEYS: gl.constexpr = p_t.shape[0]
    BLOCK_M: gl.constexpr = p_t.shape[1]
    layout: gl.constexpr = p_t.type.layout
    diag = seq_k - seq_q
    need = my_key0 + KEYS > seq_k
    if CAUSAL:
        need = need | (my_key0 + KEYS - 1 > m0 + diag)
    if need:
        keys = my_key0 + gl.arange(0, KEYS, layout=gl.SliceLayout(1, layout))
        keep = gl.expand_dims(keys < seq_k, 1)
        if CAUSAL:
            rows = m0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, layout))
            keep = keep & (gl.expand_dims(keys, 1) <= gl.expand_dims(rows + diag, 0))
        p_t = gl.where(keep, p_t, 0.0)
    return p_t


@gluon.jit
def _row_vector(bufs, slot, layout: gl.constexpr):
    """The BLOCK_M fp32 values (lse2 or delta) of ring slot `slot`, one per query column
    of Sᵀ: the [1, BLOCK_M] TMA tile (unswizzled) read as a plain vector."""
    BLOCK_M: gl.constexpr = bufs.shape[2]
    flat: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[0])
    return bufs.index(slot)._reinterpret(gl.float32, [BLOCK_M], flat).load(layout)


@gluon.jit
def _turn(bars, ME: gl.constexpr, k, PINGPONG: gl.constexpr):
    """Wait for this consumer's k-th turn to issue matmuls (consumer 0 first: its first
    wait passes on a fresh barrier, consumer 1's waits for consumer 0's first pass)."""
    if PINGPONG:
        mbarrier.wait(bars[7].index(ME), (k + 1 - ME) & 1)


@gluon.jit
def _pass(bars, ME: gl.constexpr, PINGPONG: gl.constexpr):
    """Hand the turn to the other consumer."""
    if PINGPONG:
        mbarrier.arrive(bars[7].index(1 - ME), count=1)


@gluon.jit
def _bwd_step(t, ME: gl.constexpr, kv, ds_bufs, dq_bufs, dk, dv, rings, bars, dq_desc,
              coords, scalars, CAUSAL: gl.constexpr, DQ_MODE: gl.constexpr,
              PINGPONG: gl.constexpr):  # fmt: skip
    """One query block against this consumer's keys: returns the new (dk, dv). PINGPONG:
    the consumers take turns to issue their three matmul groups (Sᵀ and dPᵀ, dV, dK),
    so one's exponentials and dS overlap the other's matmuls."""
    k_tiles, k_me, v_me = kv
    ds_me = ds_bufs.index(ME)
    q_bufs, do_bufs, lse_bufs, delta_bufs = rings
    q_ready, q_empty, do_ready, do_empty = bars[1], bars[2], bars[3], bars[4]
    b, hk, my_key0, m_start, n_m, rot, group = coords
    seq_q, seq_k, qk_scale = scalars
    KEYS: gl.constexpr = k_me.shape[0]
    HEAD_DIM: gl.constexpr = k_me.shape[1]
    BLOCK_M: gl.constexpr = q_bufs.shape[3]
    STAGES: gl.constexpr = q_bufs.shape[0]
    dtype: gl.constexpr = k_me.dtype
    bits: gl.constexpr = dtype.primitive_bitwidth
    s_layout: gl.constexpr = _acc_layout(BLOCK_M, 4, bits)
    a_layout: gl.constexpr = _p_layout(HEAD_DIM, 4, bits)
    col_layout: gl.constexpr = gl.SliceLayout(0, s_layout)
    hq, m0 = _step_coords(t, hk, group, m_start, n_m, rot, BLOCK_M)
    slot = t % STAGES
    phase = (t // STAGES) & 1
    q_t = q_bufs.index(slot).reshape([BLOCK_M, HEAD_DIM])
    do_t = do_bufs.index(slot).reshape([BLOCK_M, HEAD_DIM])
    s_zero = gl.zeros([KEYS, BLOCK_M], gl.float32, layout=s_layout)
    mbarrier.wait(q_ready.index(slot), phase)
    _turn(bars, ME, 3 * t, PINGPONG)
    s_t = warpgroup_mma(k_me, q_t.permute((1, 0)), s_zero, use_acc=False, is_async=True)
    mbarrier.wait(do_ready.index(slot), phase)
    dp_t = warpgroup_mma(v_me, do_t.permute((1, 0)), s_zero, use_acc=False, is_async=True)
    _pass(bars, ME, PINGPONG)
    s_t = warpgroup_mma_wait(1, deps=[s_t])  # Sᵀ done, dPᵀ may still run
    # rows past seq_q read lse2 = 0 (TMA's zero fill, or the launcher's padding): their
    # Q and dO rows are zeros too, so P = 1 there meets dO = 0 and dS = 1 · (0 − 0)
    lse2 = _row_vector(lse_bufs, slot, col_layout)
    p_t = gl.exp2(s_t * qk_scale - gl.expand_dims(lse2, 0))
    p_t = _p_masked(p_t, m0, my_key0, seq_q, seq_k, CAUSAL)
    p_op = gl.convert_layout(p_t.to(dtype), a_layout)
    _turn(bars, ME, 3 * t + 1, PINGPONG)
    dv = warpgroup_mma(p_op, do_t, dv, is_async=True)
    _pass(bars, ME, PINGPONG)
    dp_t = warpgroup_mma_wait(1, deps=[dp_t])  # dPᵀ done (in order), dV may still run
    delta = _row_vector(delta_bufs, slot, col_layout)
    ds_t = (p_t * (dp_t - gl.expand_dims(delta, 0))).to(dtype)
    ds_op = gl.convert_layout(ds_t, a_layout)
    if DQ_MODE == 5 or DQ_MODE == 6:  # FA3's order: dQ before dK, its stores under dK
        dk, dv = _tail_dq_first(ds_t, ds_op, p_op, q_t, dk, dv, ds_me, k_me, dq_bufs, ME,
                                dq_desc, (b, hq, m0), (q_empty, do_empty, slot),
                                DQ_MODE == 5)  # fmt: skip
    else:
        _turn(bars, ME, 3 * t + 2, PINGPONG)
        dk = warpgroup_mma(ds_op, q_t, dk, is_async=True)
        _pass(bars, ME, PINGPONG)
        # dS = (dSᵀ)ᵀ as the A operand of dQ = dS K: through shared memory, read transposed
        if DQ_MODE == 1:  # the other consumer has read this tile's previous dSᵀ
            mbarrier.wait(bars[6].index(ME), (t & 1) ^ 1)
        ds_me.store(ds_t)
        fence_async_shared()
        if DQ_MODE == 1:
            mbarrier.arrive(bars[5].index(ME), count=1)
        # dV and dK done before dQ's accumulator is live (Pᵀ and dSᵀ leave the registers
        # first), and the ring slot goes back to the producer; DQ_MODE 3: dQ's first chunk
        # is queued behind them first (wgmma waits are in order: it may still run)
        if DQ_MODE == 3:
            dq0 = _dq_issue(ds_me, k_me, 0, dq_bufs.shape[4])
            dv, dk, _p, _ds = warpgroup_mma_wait(1, deps=[dv, dk, p_op, ds_op])
        elif DQ_MODE == 4:  # both chunks queued: the tensor cores never wait on a staging store
            dq0 = _dq_issue(ds_me, k_me, 0, dq_bufs.shape[4])
            dq1 = _dq_issue(ds_me, k_me, 1, dq_bufs.shape[4])
            dv, dk, _p, _ds = warpgroup_mma_wait(2, deps=[dv, dk, p_op, ds_op])
        else:
            dv, dk, _p, _ds = warpgroup_mma_wait(0, deps=[dv, dk, p_op, ds_op])
        mbarrier.arrive(q_empty.index(slot), count=1)
        mbarrier.arrive(do_empty.index(slot), count=1)
        if DQ_MODE == 1:
            _dq_shared(t, ME, ds_bufs, k_tiles, dq_bufs, bars, dq_desc, b, hq, m0)
        elif DQ_MODE == 4:
            _dq_finish(dq0, 0, dq_bufs, ME, dq_desc, b, hq, m0, True, 1)
            _dq_finish(dq1, 1, dq_bufs, ME, dq_desc, b, hq, m0, True, 0)
        elif DQ_MODE == 3:
            _dq_finish(dq0, 0, dq_bufs, ME, dq_desc, b, hq, m0, True)
            _dq_out(ds_me, k_me, dq_bufs, ME, dq_desc, b, hq, m0, True, 1)
        else:
            _dq_out(ds_me, k_me, dq_bufs, ME, dq_desc, b, hq, m0, DQ_MODE != 2, 0)
    return dk, dv


@gluon.jit
def _bwd_consumer(ME: gl.constexpr, outs, smem, bars, coords, scalars, CAUSAL: gl.constexpr,
                  DQ_MODE: gl.constexpr, PINGPONG: gl.constexpr):  # fmt: skip
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
    for t in range(group * n_m):
        dk, dv = _bwd_step(t, ME, (k_tiles, k_me, v_me), ds_bufs, dq_bufs, dk, dv,
                           (q_bufs, do_bufs, lse_bufs, delta_bufs), bars, dq_desc,
                           (b, hk, my_key0, m_start, n_m, rot, group), (seq_q, seq_k, qk_scale),
                           CAUSAL, DQ_MODE, PINGPONG)  # fmt: skip
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
                   DQ_MODE: gl.constexpr, PINGPONG: gl.constexpr):  # fmt: skip
    _bwd_consumer(0, outs, smem, bars, coords, scalars, CAUSAL, DQ_MODE, PINGPONG)


@gluon.jit
def _bwd_consumer1(outs, smem, bars, coords, scalars, CAUSAL: gl.constexpr,
                   DQ_MODE: gl.constexpr, PINGPONG: gl.constexpr):  # fmt: skip
    _bwd_consumer(1, outs, smem, bars, coords, scalars, CAUSAL, DQ_MODE, PINGPONG)


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
            BLOCK_M: gl.constexpr, KEYS: gl.constexpr, HEAD_DIM: gl.constexpr,
            STAGES: gl.constexpr, CAUSAL: gl.constexpr, PRODUCER_REGS: gl.constexpr,
            CONSUMER_REGS: gl.constexpr, DQ_MODE: gl.constexpr,
            ROTATE: gl.constexpr, KB_MAJOR: gl.constexpr, PINGPONG: gl.constexpr):  # fmt: skip
    """Grid: (key blocks of 2·KEYS, batch · heads_kv): a head's key blocks run together,
    so the CTAs adding into one head's dQ workspace share it in L2 (causal: its heaviest,
    first, key blocks first); KB_MAJOR swaps the axes (every head's first key blocks
    first: the dQ workspaces of all heads at once, which thrashed L2 on the H200).
    DQ_MODE: 0 each consumer adds its keys' dQ share (`_dq_out`), 1 FA3's shared dQ
    (`_dq_shared`), 3 as 0 with dQ's first chunk queued before dV/dK are waited for,
    4 as 0 with both chunks (head_dim 128) queued before dV/dK are waited for, 5 dQ's
    chunks issued between dV and dK, staged and added while dK runs, 6 the same with
    only the first chunk before dK (`_tail_dq_first`);
    2 a timing probe (0 without the reduce-adds: dQ left out).
    lse_desc/delta_desc: 2-D (batch · heads_q, seq_q padded to 4) fp32 with a
    [1, BLOCK_M] box."""
    gl.static_assert(KEYS == 64, "a consumer's keys are one wgmma row tile (4 warps × 16)")
    gl.static_assert(BLOCK_M == 64 or BLOCK_M == 128, "query blocks of 64 or 128 rows")
    gl.static_assert(DQ_MODE != 1 or dq_desc.block_type.shape[3] * 2 == HEAD_DIM,
                     "DQ_MODE 1: each consumer adds half of dQ's columns")  # fmt: skip
    gl.static_assert(DQ_MODE != 4 or dq_desc.block_type.shape[3] * 2 == HEAD_DIM,
                     "DQ_MODE 4: two dQ chunks queued at once")  # fmt: skip
    dtype: gl.constexpr = q_desc.dtype
    if KB_MAJOR:
        kb = gl.program_id(1)
        bhk = gl.program_id(0)
    else:
        kb = gl.program_id(0)
        bhk = gl.program_id(1)
    b = bhk // heads_kv
    hk = bhk % heads_kv
    group = heads_q // heads_kv
    key0 = kb * (2 * KEYS)
    m_start = 0
    if CAUSAL:  # the first query block that sees any of the CTA's keys
        m_start = gl.maximum(key0 - (seq_k - seq_q), 0) // BLOCK_M
    n_m = gl.cdiv(seq_q, BLOCK_M) - m_start
    rot = 0
    if ROTATE and not CAUSAL:
        # every key block of a head starts at another query block: their dQ reduce-adds
        # land on different rows of the workspace at any moment, not all on the same ones
        # (causal CTAs start at their diagonal anyway)
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
    ds_bufs = gl.allocate_shared_memory(dtype, [2, KEYS, BLOCK_M], ds_layout)
    # per consumer, one fp32 staging tile per 64 head_dim columns of its dQ share
    dq_tile: gl.constexpr = dq_desc.block_type.shape
    # DQ_MODE 1: one tile of half the columns per consumer (FA3's dQ, `_dq_shared`)
    chunks: gl.constexpr = 1 if DQ_MODE == 1 else HEAD_DIM // dq_tile[3]
    dq_bufs = gl.allocate_shared_memory(gl.float32, [2 * chunks] + dq_tile, dq_desc.layout)  # noqa: RUF005
    bars = _bwd_bars(STAGES)
    # the argument tuples are written inline: an assignment would turn constexprs in
    # them into tensors (triton 3.6's code generator)
    gl.warp_specialize(
        [
            (_bwd_consumer0, ((dk_desc, dv_desc, dq_desc),
                              (k_tiles, v_tiles, q_bufs, do_bufs, lse_bufs, delta_bufs,
                               ds_bufs, dq_bufs), bars,
                              (b, hk, key0, m_start, n_m, rot, group),
                              (seq_q, seq_k, qk_scale, scale), CAUSAL, DQ_MODE, PINGPONG)),
            (_bwd_consumer1, ((dk_desc, dv_desc, dq_desc),
                              (k_tiles, v_tiles, q_bufs, do_bufs, lse_bufs, delta_bufs,
                               ds_bufs, dq_bufs), bars,
                              (b, hk, key0, m_start, n_m, rot, group),
                              (seq_q, seq_k, qk_scale, scale), CAUSAL, DQ_MODE, PINGPONG)),
            (_bwd_producer, ((q_desc, do_desc, k_desc, v_desc, lse_desc, delta_desc),
                             (k_tiles, v_tiles, q_bufs, do_bufs, lse_bufs, delta_bufs), bars,
                             (b, hk, key0, m_start, n_m, rot, group, heads_q))),
        ],
        [4, 1],
        [CONSUMER_REGS, PRODUCER_REGS],
    )  # fmt: skip
