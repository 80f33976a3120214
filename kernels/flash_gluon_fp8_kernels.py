"""The warp-specialised FP8 (e4m3) Gluon forward for sm_90 (issue 21, part 3): the
`@gluon.jit` kernel. Host side: kernels/flash_gluon_fp8.py.

The schedule of the bf16 "ws" kernel (kernels/flash_gluon_ws.py): a producer warp streams
K and Vᵀ through a STAGES-deep TMA ring (its own ready/empty mbarriers per tile), two
consumer warpgroups own 64 query rows each, issue S_j = Q K_jᵀ and O += P_{j−1} V_{j−1}
back to back, wait for S_j only and compute softmax(S_j) while PV runs; with PINGPONG a
pair of mbarriers passes the turn to issue wgmma between the two consumers.

What fp8 changes:
- Both wgmma B operands must be K-major. K's (keys, D) rows already are for QKᵀ. For PV
  the reduction runs over the keys, so V comes from its K-major storage (B, H, D, S)
  (flash_fp8.fp8_v_layout): the ring holds (D, BLOCK_N) tiles of Vᵀ and PV reads the
  transposed view (BLOCK_N, D) of each, whose contiguous dimension is the reduction.
- P is shifted into e4m3's range as in the `tl` fp8 kernel (flash_kernels_fp8.py):
  p = exp2(s·c − m·c + 8) ∈ [0, 256], the row maximum exactly 256; l sums the same fp32
  p, so the 2⁸ cancels in acc / l and lse2 subtracts 8. P is rounded to e4m3 in
  registers and converted to wgmma's A-operand layout (k_width 4 for 8-bit operands).
- The descales: c = q_descale · k_descale · scale · log2 e (read from device memory, no
  host sync) is the one exp2 constant; v_descale / l scales O in the epilogue.
- O is bf16: its own shared-memory tile per consumer (Q's fp8 tile is half its size),
  stored by TMA, clipped at seq_q.
- SOFTMAX: part of P's exponentials on the FMA pipes (kernels/flash_gluon_fp8_parts.py).
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

from fa_bench.kernels.flash_gluon_fp8_ahead import _tile_ahead
from fa_bench.kernels.flash_gluon_fp8_parts import (
    P_EXP,
    _acc_layout,
    _alloc_bars,
    _alloc_smem,
    _idle,
    _mask_fp8,
    _p_layout,
    _rescale,
    _softmax_fp8,
    _tile_start,
)
from fa_bench.kernels.flash_gluon_kernels import _kv_bounds, _program
from fa_bench.kernels.flash_gluon_ws import _qk


@gluon.jit
def _producer(descs, smem, bars, coords):
    """One warp: every consumer's Q tile, then K_j and Vᵀ_j into ring slot j % STAGES."""
    q_desc = descs[0]
    q_smem, q_bars = smem[0], bars[0]
    b, h, hk, row0, n_end = coords
    BLOCK_M: gl.constexpr = q_smem.shape[3]
    CONSUMERS: gl.constexpr = q_smem.shape[0]
    for c in gl.static_range(CONSUMERS):
        mbarrier.expect(q_bars.index(c), q_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(
            q_desc, [b, h, row0 + c * BLOCK_M, 0], q_bars.index(c), q_smem.index(c)
        )
    _load_kv(descs, smem, bars, b, hk, 0, n_end)


@gluon.jit
def _load_kv(descs, smem, bars, b, hk, g0, n_end):
    """The producer's K_j and Vᵀ_j, j < n_end, into ring indices g0 + j (the persistent
    kernel's run on across tiles), each slot once its consumers have released it."""
    _q_desc, k_desc, vt_desc = descs
    k_bufs, vt_bufs = smem[1], smem[2]
    k_ready, k_empty, v_ready, v_empty = bars[1], bars[2], bars[3], bars[4]
    BLOCK_N: gl.constexpr = k_bufs.shape[3]
    STAGES: gl.constexpr = k_bufs.shape[0]
    for j in range(n_end):
        slot = (g0 + j) % STAGES
        phase = ((g0 + j) // STAGES) & 1
        # a fresh mbarrier counts as having completed the phase before 0
        mbarrier.wait(k_empty.index(slot), phase ^ 1)
        mbarrier.expect(k_ready.index(slot), k_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(
            k_desc, [b, hk, j * BLOCK_N, 0], k_ready.index(slot), k_bufs.index(slot)
        )
        mbarrier.wait(v_empty.index(slot), phase ^ 1)
        mbarrier.expect(v_ready.index(slot), vt_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(
            vt_desc, [b, hk, 0, j * BLOCK_N], v_ready.index(slot), vt_bufs.index(slot)
        )


@gluon.jit
def _pv(p, vt_bufs, v_ready, g, acc):
    """O += P V issued asynchronously once Vᵀ of ring index g has landed; V is the
    (BLOCK_N, D) view of the (D, BLOCK_N) tile: K-major, as fp8 wgmma requires."""
    STAGES: gl.constexpr = vt_bufs.shape[0]
    mbarrier.wait(v_ready.index(g % STAGES), (g // STAGES) & 1)
    v = vt_bufs.index(g % STAGES).reshape([vt_bufs.shape[3], vt_bufs.shape[4]]).permute((1, 0))
    return warpgroup_mma(p, v, acc, is_async=True)


@gluon.jit
def _stash_p(p, p_bufs, j, ME: gl.constexpr):
    """P_SMEM: P_j (e4m3, S's layout) into consumer ME's shared-memory buffer j % 2
    (PV_{j−1} may still read the other), visible to the wgmma of every warp of the
    warpgroup."""
    p_bufs.index(2 * ME + j % 2).store(p)
    fence_async_shared()
    gl.thread_barrier()


@gluon.jit
def _a_operand(p, p_bufs, j, ME: gl.constexpr, P_SMEM: gl.constexpr):
    """PV_j's A operand: P_j in registers, or (P_SMEM) its shared-memory buffer."""
    if P_SMEM:
        return p_bufs.index(2 * ME + j % 2)
    else:
        return p


@gluon.jit
def _step(j, g, tc, q2, acc, m_i, l_i, p, smem, bars, rows, scalars,
          ME: gl.constexpr, CAUSAL: gl.constexpr, PINGPONG: gl.constexpr,
          SOFTMAX: gl.constexpr, P_SMEM: gl.constexpr, MASKED: gl.constexpr):  # fmt: skip
    """Key block j ≥ 1 (ring index g, ping-pong turn tc): returns the new (acc, m_i, l_i, p).
    MASKED: the block needs the causal / key-tail mask (a constexpr: a runtime test was
    if-converted, the mask's ~130 instructions then ran in every step)."""
    k_bufs, vt_bufs, p_bufs = smem[1], smem[2], smem[3]
    k_ready, k_empty, v_ready, v_empty, turn = bars[1], bars[2], bars[3], bars[4], bars[5]
    seq_q, seq_k, qk_scale = scalars
    BLOCK_M: gl.constexpr = q2.shape[0]
    STAGES: gl.constexpr = k_bufs.shape[0]
    BLOCK_N: gl.constexpr = k_bufs.shape[3]
    HEAD_DIM: gl.constexpr = k_bufs.shape[4]
    s_layout: gl.constexpr = _acc_layout(BLOCK_N)
    o_layout: gl.constexpr = _acc_layout(HEAD_DIM)
    mbarrier.wait(k_ready.index(g % STAGES), (g // STAGES) & 1)
    if PINGPONG:
        # consumer 0 goes first: its first wait (parity 1) passes on a fresh barrier; the
        # others wait for the one before them (a round robin with three consumers)
        if ME == 0:
            mbarrier.wait(turn.index(ME), (tc + 1) & 1)
        else:
            mbarrier.wait(turn.index(ME), tc & 1)
    s = _qk(q2, k_bufs, g, gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout))
    acc = _pv(_a_operand(p, p_bufs, j - 1, ME, P_SMEM), vt_bufs, v_ready, g - 1, acc)
    if PINGPONG:
        mbarrier.arrive(turn.index((ME + 1) % turn.shape[0]), count=1)
    s = warpgroup_mma_wait(1, deps=[s])  # S_j done; PV_{j-1} may still run
    mbarrier.arrive(k_empty.index(g % STAGES), count=1)
    if MASKED:
        s = _mask_fp8(s, rows, j, seq_q, seq_k, BLOCK_N, CAUSAL, s_layout, SOFTMAX)
    m_i, alpha, l_i, p_next = _softmax_fp8(s, m_i, l_i, qk_scale, _p_layout(HEAD_DIM), SOFTMAX,
                                           P_SMEM)  # fmt: skip
    if P_SMEM:
        _stash_p(p_next, p_bufs, j, ME)
    # P (8-bit) cannot be a dependency of the wait in triton 3.6 ("Unexpected bitwidth in
    # WGMMAWaitGroupOp: 8"); ptxas keeps a wgmma's register operands until its wait
    acc = warpgroup_mma_wait(0, deps=[acc])
    mbarrier.arrive(v_empty.index((g - 1) % STAGES), count=1)
    acc = _rescale(acc, alpha, o_layout, SOFTMAX)
    return acc, m_i, l_i, p_next


@gluon.jit
def _tile(q2, smem, bars, my_row0, n_end, g0, tc0, scalars, ME: gl.constexpr,
          CAUSAL: gl.constexpr, PINGPONG: gl.constexpr, SOFTMAX: gl.constexpr,
          P_SMEM: gl.constexpr):  # fmt: skip
    """One consumer's rows against key blocks [0, n_end): (acc, m_i, l_i). The first block
    is ring index g0 and the first ping-pong turn tc0 (both 0 but in the persistent
    kernel); uses n_end ring indices and n_end − 1 turns. With three consumers, one whose
    rows all lie past seq_q (the last CTA of a 192-row tiling: 4096 = 21⅓ × 192) only
    passes the ring slots and turns on (_idle), leaving the tensor cores to the others."""
    k_bufs, vt_bufs, p_bufs = smem[1], smem[2], smem[3]
    k_ready, k_empty, v_ready, v_empty = bars[1], bars[2], bars[3], bars[4]
    seq_q, seq_k, qk_scale = scalars
    BLOCK_M: gl.constexpr = q2.shape[0]
    BLOCK_N: gl.constexpr = k_bufs.shape[3]
    HEAD_DIM: gl.constexpr = k_bufs.shape[4]
    STAGES: gl.constexpr = k_bufs.shape[0]
    s_layout: gl.constexpr = _acc_layout(BLOCK_N)
    n_full, rows, m_i, l_i, acc = _tile_start(my_row0, seq_q, seq_k, BLOCK_M, BLOCK_N, HEAD_DIM,
                                              CAUSAL)  # fmt: skip
    n_run = n_end
    if smem[0].shape[0] == 3:
        if my_row0 >= seq_q:
            _idle(bars, 0, n_end, g0, tc0, ME, PINGPONG)
            n_run = n_end * 0
        elif (SOFTMAX // 64) % 2 == 1:
            # OWN_END: this consumer's own last key block; the CTA's later ones (past its
            # diagonal: all masked) it only passes on, after its last PV (below)
            _n_full, n_mine = _kv_bounds(my_row0, BLOCK_M, seq_q, seq_k, BLOCK_N, CAUSAL)
            n_run = gl.minimum(n_mine, n_end)
    if n_run > 0:
        # block 0: S_0 and its softmax, nothing to overlap with yet
        mbarrier.wait(k_ready.index(g0 % STAGES), (g0 // STAGES) & 1)
        s = _qk(q2, k_bufs, g0, gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout))
        s = warpgroup_mma_wait(0, deps=[s])
        mbarrier.arrive(k_empty.index(g0 % STAGES), count=1)
        if 0 >= n_full:
            s = _mask_fp8(s, rows, 0, seq_q, seq_k, BLOCK_N, CAUSAL, s_layout, SOFTMAX)
        m_i, _alpha, l_i, p = _softmax_fp8(s, m_i, l_i, qk_scale, _p_layout(HEAD_DIM), SOFTMAX,
                                           P_SMEM)  # fmt: skip
        if P_SMEM:
            _stash_p(p, p_bufs, 0, ME)
        # the blocks every row sees whole, then the masked diagonal / key tail
        for j in range(1, n_full):
            acc, m_i, l_i, p = _step(j, g0 + j, tc0 + j - 1, q2, acc, m_i, l_i, p, smem, bars,
                                     rows, scalars, ME, CAUSAL, PINGPONG, SOFTMAX, P_SMEM,
                                     False)  # fmt: skip
        for j in range(gl.maximum(n_full, 1), n_run):
            acc, m_i, l_i, p = _step(j, g0 + j, tc0 + j - 1, q2, acc, m_i, l_i, p, smem, bars,
                                     rows, scalars, ME, CAUSAL, PINGPONG, SOFTMAX, P_SMEM,
                                     True)  # fmt: skip
        last = n_run - 1
        acc = _pv(_a_operand(p, p_bufs, last, ME, P_SMEM), vt_bufs, v_ready, g0 + last, acc)
        acc = warpgroup_mma_wait(0, deps=[acc])
        mbarrier.arrive(v_empty.index((g0 + last) % STAGES), count=1)
    if (SOFTMAX // 64) % 2 == 1:
        if my_row0 < seq_q:
            _idle(bars, n_run, n_end, g0, tc0, ME, PINGPONG)
    return acc, m_i, l_i


@gluon.jit
def _epilogue(acc, m_i, l_i, o_tile, out, coords, scalars, v_descale, DEFER: gl.constexpr = False):
    """O = acc · v_descale / l in bf16 through the consumer's O tile and a TMA store
    clipped at seq_q; lse2 = m·c + log2(l) − P_EXP, +inf where a row saw no key.
    DEFER (the persistent kernel): the TMA store is waited for before the O tile is
    written (the previous tile's must have left it), not at the end: this tile's runs on
    under the next tile's matmuls."""
    o_desc, lse_ptr = out
    b, h, bh, row0 = coords
    seq_q, qk_scale = scalars
    BLOCK_M: gl.constexpr = o_tile.shape[2]
    HEAD_DIM: gl.constexpr = o_tile.shape[3]
    o_layout: gl.constexpr = _acc_layout(HEAD_DIM)
    row_layout: gl.constexpr = gl.SliceLayout(1, o_layout)
    l_o = gl.convert_layout(l_i, row_layout)
    empty = l_o == 0.0
    l_safe = gl.where(empty, 1.0, l_o)
    o = acc * gl.expand_dims(v_descale / l_safe, 1)
    if DEFER:
        tma.store_wait(0)
    o_tile.reshape([BLOCK_M, HEAD_DIM]).store(o.to(gl.bfloat16))
    fence_async_shared()
    tma.async_copy_shared_to_global(o_desc, [b, h, row0, 0], o_tile)
    m_o = gl.convert_layout(m_i, row_layout)
    lse2 = gl.where(empty, float("inf"), m_o * qk_scale + gl.log2(l_safe) - P_EXP)
    rows = row0 + gl.arange(0, BLOCK_M, layout=row_layout)
    gl.store(lse_ptr + bh * seq_q + rows, lse2, mask=rows < seq_q)
    if not DEFER:
        tma.store_wait(0)


@gluon.jit
def _consumer(ME: gl.constexpr, out, smem, bars, coords, scalars, descales,
              CAUSAL: gl.constexpr, PINGPONG: gl.constexpr, SOFTMAX: gl.constexpr,
              P_SMEM: gl.constexpr):  # fmt: skip
    """Consumer warpgroup ME (0, 1 or 2): rows [row0 + ME·BLOCK_M, +BLOCK_M)."""
    q_smem, o_smem = smem[0], smem[3]
    b, h, bh, row0, n_end = coords
    seq_q, seq_k, sm_scale_log2 = scalars
    q_descale_ptr, k_descale_ptr, v_descale_ptr = descales
    BLOCK_M: gl.constexpr = q_smem.shape[3]
    HEAD_DIM: gl.constexpr = q_smem.shape[4]
    qk_scale = gl.load(q_descale_ptr) * gl.load(k_descale_ptr) * sm_scale_log2
    # loaded here, not before the epilogue: its latency hides behind the Q tile's wait
    v_descale = gl.load(v_descale_ptr)
    my_row0 = row0 + ME * BLOCK_M
    mbarrier.wait(bars[0].index(ME), 0)
    q2 = q_smem.index(ME).reshape([BLOCK_M, HEAD_DIM])
    if (SOFTMAX // 32) % 2 == 1:  # QKᵀ one block ahead (kernels/flash_gluon_fp8_ahead.py)
        acc, m_i, l_i = _tile_ahead(q2, (q_smem, smem[1], smem[2], smem[4]), bars, my_row0,
                                    n_end, 0, (seq_q, seq_k, qk_scale), ME, CAUSAL,
                                    SOFTMAX)  # fmt: skip
    else:
        acc, m_i, l_i = _tile(q2, (q_smem, smem[1], smem[2], smem[4]), bars, my_row0, n_end, 0,
                              0, (seq_q, seq_k, qk_scale), ME, CAUSAL, PINGPONG, SOFTMAX,
                              P_SMEM)  # fmt: skip
    # (O_IN_P at head_dim < BLOCK_N: several O tiles per consumer's P buffers; index ME
    # otherwise)
    o_tile = o_smem.index(ME * (o_smem.shape[0] // q_smem.shape[0]))
    _epilogue(acc, m_i, l_i, o_tile, out, (b, h, bh, my_row0), (seq_q, qk_scale),
              v_descale)  # fmt: skip


@gluon.jit
def _consumer0(out, smem, bars, coords, scalars, descales, CAUSAL: gl.constexpr,
               PINGPONG: gl.constexpr, SOFTMAX: gl.constexpr, P_SMEM: gl.constexpr):  # fmt: skip
    _consumer(0, out, smem, bars, coords, scalars, descales, CAUSAL, PINGPONG, SOFTMAX, P_SMEM)


@gluon.jit
def _consumer1(out, smem, bars, coords, scalars, descales, CAUSAL: gl.constexpr,
               PINGPONG: gl.constexpr, SOFTMAX: gl.constexpr, P_SMEM: gl.constexpr):  # fmt: skip
    _consumer(1, out, smem, bars, coords, scalars, descales, CAUSAL, PINGPONG, SOFTMAX, P_SMEM)


@gluon.jit
def _consumer2(out, smem, bars, coords, scalars, descales, CAUSAL: gl.constexpr,
               PINGPONG: gl.constexpr, SOFTMAX: gl.constexpr, P_SMEM: gl.constexpr):  # fmt: skip
    _consumer(2, out, smem, bars, coords, scalars, descales, CAUSAL, PINGPONG, SOFTMAX, P_SMEM)


@gluon.jit
def _fwd_fp8_ws(q_desc, k_desc, vt_desc, o_desc, lse_ptr, q_descale_ptr, k_descale_ptr,
                v_descale_ptr, heads_q, group, seq_q, seq_k, sm_scale_log2,
                BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
                STAGES: gl.constexpr, CAUSAL: gl.constexpr, PINGPONG: gl.constexpr,
                SOFTMAX: gl.constexpr, PRODUCER_REGS: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                P_SMEM: gl.constexpr, CONSUMERS: gl.constexpr = 2,
                O_IN_P: gl.constexpr = False):  # fmt: skip
    """A CTA: CONSUMERS·BLOCK_M query rows of one (batch, q head); 12 warps (16 with three
    consumers; the default partition's 4 are consumer 0). sm_scale_log2 = scale · log2 e,
    before the descales. P_SMEM: P reaches PV's wgmma through shared memory (two buffers
    per consumer) instead of registers (whose layout conversion costs shuffles and byte
    permutes). CONSUMERS 3: a third warpgroup (FA3's head_dim 64 shape: an fp8 consumer at
    head_dim 128 has the matmul time of a bf16 one at 64), so each consumer's softmax has
    two others' matmuls to hide behind; ping-pong then passes the turn round robin.
    O_IN_P: the O tiles in the P buffers (_alloc_smem)."""
    gl.static_assert(BLOCK_M == 64, "wgmma: a consumer warpgroup's 4 warps × 16 rows")
    gl.static_assert(CONSUMERS == 2 or CONSUMERS == 3, "two or three consumer warpgroups")
    b, h, hk, bh = _program(heads_q, group)
    pid = gl.program_id(0)
    if CAUSAL:  # heaviest tiles first
        pid = gl.num_programs(0) - 1 - pid
    row0 = pid * (CONSUMERS * BLOCK_M)
    # every consumer steps through the keys of the CTA's last row (the others mask their
    # extra diagonal blocks): they share every K/V tile and release it once each
    _n_full, n_end = _kv_bounds(row0, CONSUMERS * BLOCK_M, seq_q, seq_k, BLOCK_N, CAUSAL)
    q_smem, k_bufs, vt_bufs, o_smem, p_smem = _alloc_smem(q_desc, k_desc, vt_desc, o_desc,
                                                          BLOCK_M, BLOCK_N, HEAD_DIM, STAGES,
                                                          P_SMEM, CONSUMERS, O_IN_P)  # fmt: skip
    bars = _alloc_bars(STAGES, CONSUMERS)
    # the argument tuples are written inline: an assignment would turn constexprs in
    # them into tensors (triton 3.6's code generator); _specialize takes them as arguments
    _specialize((o_desc, lse_ptr), (q_smem, k_bufs, vt_bufs, o_smem, p_smem), bars,
                (b, h, bh, row0, n_end), (seq_q, seq_k, sm_scale_log2),
                (q_descale_ptr, k_descale_ptr, v_descale_ptr), (q_desc, k_desc, vt_desc),
                (b, h, hk, row0, n_end), CAUSAL, PINGPONG, SOFTMAX, P_SMEM, PRODUCER_REGS,
                CONSUMER_REGS, CONSUMERS)  # fmt: skip


@gluon.jit
def _specialize(out, smem, bars, coords, scalars, descales, descs, load_coords,
                CAUSAL: gl.constexpr, PINGPONG: gl.constexpr, SOFTMAX: gl.constexpr,
                P_SMEM: gl.constexpr, PRODUCER_REGS: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                CONSUMERS: gl.constexpr):  # fmt: skip
    """_fwd_fp8_ws's partitions: CONSUMERS consumer warpgroups (the default partition is
    consumer 0) and the producer warp. (One helper for both counts, the review's D2: the
    partition list is the only difference.)"""
    if CONSUMERS == 2:
        gl.warp_specialize(
            [
                (_consumer0, (out, smem, bars, coords, scalars, descales, CAUSAL, PINGPONG,
                              SOFTMAX, P_SMEM)),
                (_consumer1, (out, smem, bars, coords, scalars, descales, CAUSAL, PINGPONG,
                              SOFTMAX, P_SMEM)),
                (_producer, (descs, smem, bars, load_coords)),
            ],
            [4, 1],
            [CONSUMER_REGS, PRODUCER_REGS],
        )  # fmt: skip
    else:
        gl.warp_specialize(
            [
                (_consumer0, (out, smem, bars, coords, scalars, descales, CAUSAL, PINGPONG,
                              SOFTMAX, P_SMEM)),
                (_consumer1, (out, smem, bars, coords, scalars, descales, CAUSAL, PINGPONG,
                              SOFTMAX, P_SMEM)),
                (_consumer2, (out, smem, bars, coords, scalars, descales, CAUSAL, PINGPONG,
                              SOFTMAX, P_SMEM)),
                (_producer, (descs, smem, bars, load_coords)),
            ],
            [4, 4, 1],
            [CONSUMER_REGS, CONSUMER_REGS, PRODUCER_REGS],
        )  # fmt: skip
