"""One step of the Gluon backward's consumers (kernels/flash_gluon_bwd_kernels.py): a
query block against one consumer warpgroup's 64 keys, and the helpers it shares with
the producer (the step's coordinates).

OPS_SMEM (issue 18, session 7) moves wgmma A operands from registers to shared memory so
fewer registers are live while the matmuls run (ptxas serialised the wgmmas, C7512, when
a second dQ accumulator was live beside dK and dV): 1 dK += dSᵀ Q reads dSᵀ from the tile
dQ's matmul reads anyway (stored before dK is issued, not after); 2 also dV += Pᵀ dO
reads Pᵀ from a tile of its own; 3 as 2, and consumer 1 hands its dQ share to consumer
0 through shared memory, which reduce-adds the sum (half the adds, `_dq_sum`). 0 keeps
both operands in registers (the session-6 kernel).
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

from fa_bench.kernels.flash_gluon_bwd_dq import (
    _dq_alt_handoff,
    _dq_alternate,
    _dq_finish,
    _dq_issue,
    _dq_out,
    _dq_shared,
    _dq_sum,
    _tail_dq_first,
)
from fa_bench.kernels.flash_gluon_bwd_var import _slope2, _var_p
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
              PINGPONG: gl.constexpr, OPS_SMEM: gl.constexpr = 0,
              DQ_PERM: gl.constexpr = False, var=None, VAR: gl.constexpr = 0):  # fmt: skip
    """One query block against this consumer's keys: returns the new (dk, dv). PINGPONG:
    the consumers take turns to issue their three matmul groups (Sᵀ and dPᵀ, dV, dK),
    so one's exponentials and dS overlap the other's matmuls. DQ_PERM: dQ's staging
    order (flash_gluon_bwd_dq._staged). VAR, var: issue 19's variants
    (kernels/flash_gluon_bwd_var.py)."""
    k_tiles, k_me, v_me = kv
    q_bufs, do_bufs, lse_bufs, delta_bufs = rings
    q_ready, do_ready = bars[1], bars[3]
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
    slope2 = _slope2(var, b, hq, VAR)  # ALiBi: read before the waits, which hide it
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
    if VAR == 0:
        p_t = gl.exp2(s_t * qk_scale - gl.expand_dims(lse2, 0))
        p_t = _p_masked(p_t, m0, my_key0, seq_q, seq_k, CAUSAL)
        pg_t = p_t
        p_lo = p_t.to(dtype)
    else:  # Pᵀ in dtype, and pg_t: Pᵀ, or with a softcap Pᵀ ∘ (1 - tanh²), in fp32
        p_lo, pg_t = _var_p(s_t, lse2, m0, my_key0, seq_q, seq_k, qk_scale, var, slope2,
                            dtype, CAUSAL, VAR)  # fmt: skip
    if OPS_SMEM >= 2:  # Pᵀ through its own tile: no register operand live under dV
        p_op = ds_bufs.index(2 + ME)
        p_op.store(p_lo)
        fence_async_shared()
    else:
        p_op = gl.convert_layout(p_lo, a_layout)
    _turn(bars, ME, 3 * t + 1, PINGPONG)
    dv = warpgroup_mma(p_op, do_t, dv, is_async=True)
    _pass(bars, ME, PINGPONG)
    dp_t = warpgroup_mma_wait(1, deps=[dp_t])  # dPᵀ done (in order), dV may still run
    delta = _row_vector(delta_bufs, slot, col_layout)
    ds_t = (pg_t * (dp_t - gl.expand_dims(delta, 0))).to(dtype)
    if OPS_SMEM > 0:
        dk, dv = _tail_smem(t, ME, ds_t, p_op, q_t, dk, dv, ds_bufs, kv, dq_bufs, bars,
                            dq_desc, (b, hq, m0, slot), DQ_MODE, PINGPONG, OPS_SMEM,
                            DQ_PERM)  # fmt: skip
    else:
        dk, dv = _tail_regs(t, ME, ds_t, p_op, q_t, dk, dv, (k_tiles, ds_bufs, k_me, dq_bufs),
                            bars, dq_desc, (b, hq, m0, slot), DQ_MODE, PINGPONG,
                            DQ_PERM)  # fmt: skip
    return dk, dv


@gluon.jit
def _tail_regs(t, ME: gl.constexpr, ds_t, p_op, q_t, dk, dv, smem, bars, dq_desc, where,
               DQ_MODE: gl.constexpr, PINGPONG: gl.constexpr,
               PERM: gl.constexpr = False):  # fmt: skip
    """The end of a step after dV was issued, Pᵀ and dSᵀ register operands (the session-6
    kernel): dK, then dQ by DQ_MODE (`_bwd_ws`)."""
    k_tiles, ds_bufs, k_me, dq_bufs = smem
    b, hq, m0, slot = where
    q_empty, do_empty = bars[2], bars[4]
    a_layout: gl.constexpr = _p_layout(k_me.shape[1], 4, k_me.dtype.primitive_bitwidth)
    ds_me = ds_bufs.index(ME)
    ds_op = gl.convert_layout(ds_t, a_layout)
    if DQ_MODE == 5 or DQ_MODE == 6:  # FA3's order: dQ before dK, its stores under dK
        dk, dv = _tail_dq_first(ds_t, ds_op, p_op, q_t, dk, dv, ds_me, k_me, dq_bufs, ME,
                                dq_desc, (b, hq, m0), (q_empty, do_empty, slot),
                                DQ_MODE == 5, PERM)  # fmt: skip
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
            _dq_shared(t, ME, ds_bufs, k_tiles, dq_bufs, bars, dq_desc, b, hq, m0, PERM)
        elif DQ_MODE == 4:
            _dq_rest(dq0, dq1, 2, ds_me, k_me, dq_bufs, ME, dq_desc, (b, hq, m0), True, PERM)
        elif DQ_MODE == 3:
            _dq_rest(dq0, None, 1, ds_me, k_me, dq_bufs, ME, dq_desc, (b, hq, m0), True, PERM)
        else:
            _dq_rest(None, None, 0, ds_me, k_me, dq_bufs, ME, dq_desc, (b, hq, m0),
                     DQ_MODE != 2, PERM)  # fmt: skip
    return dk, dv


@gluon.jit
def _dq_rest(dq0, dq1, PENDING: gl.constexpr, ds_me, k_me, dq_bufs, ME: gl.constexpr,
             dq_desc, where, ADD: gl.constexpr, PERM: gl.constexpr = False):  # fmt: skip
    """dQ's share after dV and dK: the PENDING chunks already queued (dq0, dq1) staged
    and added, the others issued, staged and added (`_dq_out`); ADD False: the timing
    probe without reduce-adds. Both tails (register and shared-memory operands) end so."""
    b, hq, m0 = where
    if PENDING == 2:
        _dq_finish(dq0, 0, dq_bufs, ME, dq_desc, b, hq, m0, True, 1, PERM)
        _dq_finish(dq1, 1, dq_bufs, ME, dq_desc, b, hq, m0, True, 0, PERM)
    elif PENDING == 1:
        _dq_finish(dq0, 0, dq_bufs, ME, dq_desc, b, hq, m0, True, 0, PERM)
        _dq_out(ds_me, k_me, dq_bufs, ME, dq_desc, b, hq, m0, True, 1, PERM)
    else:
        _dq_out(ds_me, k_me, dq_bufs, ME, dq_desc, b, hq, m0, ADD, 0, PERM)


@gluon.jit
def _tail_smem(t, ME: gl.constexpr, ds_t, p_op, q_t, dk, dv, ds_bufs, kv, dq_bufs, bars,
               dq_desc, where, DQ_MODE: gl.constexpr, PINGPONG: gl.constexpr,
               OPS_SMEM: gl.constexpr, PERM: gl.constexpr = False):  # fmt: skip
    """The end of a step after dV was issued, OPS_SMEM 1-3: dSᵀ stored first, then
    dK += dSᵀ Q reads it from shared memory (the tile dQ = dS K reads transposed), so no
    register copy of dSᵀ (nor, OPS_SMEM 2 and 3, of Pᵀ) stays live while dV and dK run;
    dQ's chunks as DQ_MODE 0, 2, 3, 4 (`_bwd_step`), or DQ_MODE 1 FA3's shared dQ over
    both consumers' dSᵀ tiles (`_dq_shared`, OPS_SMEM 1-2); OPS_SMEM 3 sums the two
    consumers' shares before one reduce-add (`_dq_sum`)."""
    k_tiles, k_me, _v_me = kv
    b, hq, m0, slot = where
    q_empty, do_empty = bars[2], bars[4]
    CHUNK: gl.constexpr = dq_bufs.shape[4]
    ds_me = ds_bufs.index(ME)
    if DQ_MODE == 1:  # the other consumer has read this tile's previous dSᵀ
        mbarrier.wait(bars[6].index(ME), (t & 1) ^ 1)
    if DQ_MODE == 8:
        _dq_alt_handoff(t, ME, bars, True)
    ds_me.store(ds_t)
    fence_async_shared()
    if DQ_MODE == 1:
        mbarrier.arrive(bars[5].index(ME), count=1)
    if DQ_MODE == 8:
        _dq_alt_handoff(t, ME, bars, False)
    _turn(bars, ME, 3 * t + 2, PINGPONG)
    dk = warpgroup_mma(ds_me, q_t, dk, is_async=True)
    _pass(bars, ME, PINGPONG)
    # in order: dV, dK, then the dQ chunks queued here; PENDING of them may still run
    PENDING: gl.constexpr = 1 if DQ_MODE == 3 else 2 if DQ_MODE == 4 else 0
    if PENDING > 0:
        dq0 = _dq_issue(ds_me, k_me, 0, CHUNK)
    if PENDING > 1:
        dq1 = _dq_issue(ds_me, k_me, 1, CHUNK)
    if OPS_SMEM >= 2:
        dv, dk = warpgroup_mma_wait(PENDING, deps=[dv, dk])
    else:
        dv, dk, _p = warpgroup_mma_wait(PENDING, deps=[dv, dk, p_op])
    mbarrier.arrive(q_empty.index(slot), count=1)
    mbarrier.arrive(do_empty.index(slot), count=1)
    if DQ_MODE == 1:
        _dq_shared(t, ME, ds_bufs, k_tiles, dq_bufs, bars, dq_desc, b, hq, m0, PERM)
    elif DQ_MODE == 8:
        _dq_alternate(t, ME, ds_bufs, k_tiles, dq_bufs, bars, dq_desc, b, hq, m0, PERM)
    elif OPS_SMEM == 3:  # one reduce-add of both consumers' shares (consumer 0 adds)
        sync = (bars[5], bars[6], t)
        if PENDING == 2:
            _dq_sum(dq0, 0, dq_bufs, ME, sync, dq_desc, (b, hq, m0), 1, PERM)
            _dq_sum(dq1, 1, dq_bufs, ME, sync, dq_desc, (b, hq, m0), 0, PERM)
        else:
            if PENDING == 1:
                _dq_sum(dq0, 0, dq_bufs, ME, sync, dq_desc, (b, hq, m0), 0, PERM)
            for c in gl.static_range(PENDING, dq_bufs.shape[0] // 2):
                dq = _dq_issue(ds_me, k_me, c, CHUNK)
                _dq_sum(dq, c, dq_bufs, ME, sync, dq_desc, (b, hq, m0), 0, PERM)
    elif PENDING == 2:
        _dq_rest(dq0, dq1, 2, ds_me, k_me, dq_bufs, ME, dq_desc, (b, hq, m0), True, PERM)
    elif PENDING == 1:
        _dq_rest(dq0, None, 1, ds_me, k_me, dq_bufs, ME, dq_desc, (b, hq, m0), True, PERM)
    else:
        _dq_rest(None, None, 0, ds_me, k_me, dq_bufs, ME, dq_desc, (b, hq, m0), DQ_MODE != 2,
                 PERM)  # fmt: skip
    return dk, dv
