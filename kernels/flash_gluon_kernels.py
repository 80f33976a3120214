"""The Gluon FlashAttention forward for sm_90 (issue 21): the `@gluon.jit` kernels.

Written against triton 3.6.0's `triton.experimental.gluon` (the H200's version); the host
side (descriptors, grid, checks) is kernels/flash_gluon.py. Gluon kernels do not run in
the Triton interpreter: tools/gluon_compile.py compiles them for sm_90 on a CPU.

Conventions, as in the `tl` forward (kernels/flash_kernels.py), so that our backward
consumes the output unchanged:
- scores in the log2 domain: the raw q·k is kept, the running max m is raw, and
  p = exp2(s · qk_scale − m · qk_scale) with qk_scale = scale · log2(e) (one FMA);
- lse2 = m · qk_scale + log2(l) per row, +inf for a row that sees no key;
- causal is bottom-right: query i sees key j iff j <= i + (seq_k − seq_q).

Tensors reach the kernels as 4-D TMA descriptors over (B, H, S, D) with a [1, 1, rows, D]
box, so the bounds are per (batch, head): tail rows of Q, K and V load as zeros and the
O store is clipped at seq_q. Keys past seq_k are masked to −inf in the last key block.

Two kernels:
- `_fwd_pipelined` (GluonConfig.variant "pipelined"): one partition of 4 or 8 warps
  owns `BLOCK_M` query rows; the same warps issue the TMA loads of a `STAGES`-deep K/V
  ring ahead of the math (mbarriers mark each slot ready). The fallback.
- `_fwd_ws` ("ws"): warp specialised. A producer partition of one warp (few registers)
  loads Q once and streams K/V into the ring; two consumer warpgroups each own their
  own `BLOCK_M`-row Q tile of the CTA's 2·BLOCK_M rows and share the K/V tiles. Each
  consumer issues the next QKᵀ before the current softmax (S_j and PV_{j−1} in flight
  while it computes softmax(S_j)), and the two ping-pong: a pair of mbarriers passes
  the turn to issue wgmma, so one's softmax overlaps the other's matmuls.
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

from fa_bench.kernels.gluon_exp2 import exp2_split, row_max, row_sum, softmax_emu, softmax_tree


@gluon.constexpr_function
def _acc_layout(n, num_warps, bitwidth):
    """The wgmma accumulator layout of a (rows × n) fp32 tile: S (n = keys) or O
    (n = head_dim); k is 256 bits of the operand type."""
    return gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, n, 256 // bitwidth]
    )


@gluon.constexpr_function
def _p_layout(head_dim, num_warps, bitwidth):
    """P's register layout as wgmma's A operand of PV (P never goes through shared memory)."""
    return gl.DotOperandLayout(
        operand_index=0, parent=_acc_layout(head_dim, num_warps, bitwidth), k_width=32 // bitwidth
    )


@gluon.jit
def _kv_bounds(row0, rows: gl.constexpr, seq_q, seq_k, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr):
    """(n_full, n_end) for query rows [row0, row0 + rows): key blocks [0, n_full) are seen
    whole by every row (no mask), [n_full, n_end) need the mask, later ones none at all."""
    n_blocks = gl.cdiv(seq_k, BLOCK_N)
    if CAUSAL:
        diag = seq_k - seq_q
        # the tile's last row sees keys <= row0 + rows - 1 + diag; its first row
        # sees row0 + diag + 1 keys
        n_end = gl.minimum(gl.maximum(gl.cdiv(row0 + rows + diag, BLOCK_N), 0), n_blocks)
        n_full = gl.minimum(gl.maximum((row0 + diag + 1) // BLOCK_N, 0), seq_k // BLOCK_N)
    else:
        n_end = n_blocks
        n_full = seq_k // BLOCK_N
    n_full = gl.minimum(n_full, n_end)
    return n_full, n_end


@gluon.jit
def _mask(
    s, rows, j, seq_q, seq_k, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr, layout: gl.constexpr
):
    """Scores of keys past seq_k (and, causal, past each row's diagonal) set to −inf."""
    cols = j * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, layout))
    keep = gl.expand_dims(cols < seq_k, 0)
    if CAUSAL:
        keep = keep & (gl.expand_dims(cols, 0) <= gl.expand_dims(rows + (seq_k - seq_q), 1))
    return gl.where(keep, s, float("-inf"))


@gluon.jit
def _softmax(s, m_i, l_i, qk_scale, dtype: gl.constexpr, p_layout: gl.constexpr,
             SOFTMAX: gl.constexpr = 0):  # fmt: skip
    """One online-softmax step: the new max, the rescale factor of the old sums, the new
    row sums and P (in the input dtype, as wgmma's register A operand). SOFTMAX, the
    variant code (GluonConfig.softmax_code, kernels/gluon_exp2.py; 0 = this plain step):
    every softmax_emu-th exponential of P on the FMA pipes, tree-shaped row reductions."""
    TREE: gl.constexpr = softmax_tree(SOFTMAX)
    m_new = gl.maximum(m_i, row_max(s, m_i, TREE))
    # a row that has seen no key yet keeps m = -inf: subtract 0 instead (no NaN)
    m_scaled = gl.where(m_new == float("-inf"), 0.0, m_new * qk_scale)
    p = exp2_split(s * qk_scale - gl.expand_dims(m_scaled, 1), softmax_emu(SOFTMAX))
    alpha = gl.exp2(m_i * qk_scale - m_scaled)
    l_new = l_i * alpha + row_sum(p, l_i, TREE)
    p_op = gl.convert_layout(p.to(dtype), p_layout)
    return m_new, alpha, l_new, p_op


@gluon.jit
def _epilogue(
    acc,
    m_i,
    l_i,
    qk_scale,
    q_smem,
    o_desc,
    lse_ptr,
    lse_base,
    b,
    h,
    row0,
    seq_q,
    BLOCK_M: gl.constexpr,
    HEAD_DIM: gl.constexpr,
    o_layout: gl.constexpr,
):
    """O = acc / l through shared memory (the Q tile's buffer, free once the last QKᵀ is
    done) and a TMA store clipped at seq_q; lse2 with +inf where a row saw no key."""
    row_layout: gl.constexpr = gl.SliceLayout(1, o_layout)
    l_o = gl.convert_layout(l_i, row_layout)
    empty = l_o == 0.0
    l_safe = gl.where(empty, 1.0, l_o)
    o = acc / gl.expand_dims(l_safe, 1)
    q_smem.reshape([BLOCK_M, HEAD_DIM]).store(o.to(o_desc.dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(o_desc, [b, h, row0, 0], q_smem)
    m_o = gl.convert_layout(m_i, row_layout)
    lse2 = gl.where(empty, float("inf"), m_o * qk_scale + gl.log2(l_safe))
    rows = row0 + gl.arange(0, BLOCK_M, layout=row_layout)
    gl.store(lse_ptr + lse_base + rows, lse2, mask=rows < seq_q)
    tma.store_wait(0)


@gluon.jit
def _program(heads_q, group):
    """(batch, q head, kv head, flat row offset of this head in lse2) of this program."""
    bh = gl.program_id(1)
    b = bh // heads_q
    h = bh % heads_q
    return b, h, h // group, bh.to(gl.int64)


# ---------------------------------------------------------------------------------------
# (a) one partition, software-pipelined TMA ring
# ---------------------------------------------------------------------------------------


@gluon.jit
def _load_kv(k_desc, v_desc, k_bufs, v_bufs, ready, slot, coords, j, live):
    """K_j and V_j into ring slot `slot`, one mbarrier for both; nothing when not live."""
    b, hk = coords
    BLOCK_N: gl.constexpr = k_bufs.shape[3]
    bar = ready.index(slot)
    mbarrier.expect(bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes, pred=live)
    tma.async_copy_global_to_shared(
        k_desc, [b, hk, j * BLOCK_N, 0], bar, k_bufs.index(slot), pred=live
    )
    tma.async_copy_global_to_shared(
        v_desc, [b, hk, j * BLOCK_N, 0], bar, v_bufs.index(slot), pred=live
    )


@gluon.jit
def _pipelined_loop(q2, k_bufs, v_bufs, ready, descs, coords, rows, n_full, n_end, scalars,
                    CAUSAL: gl.constexpr, NUM_WARPS: gl.constexpr,
                    SOFTMAX: gl.constexpr = 0):  # fmt: skip
    """Key blocks [0, n_end): S, softmax, PV, each waited for; the slot just read is
    refilled with block j + STAGES. Returns (acc, m_i, l_i)."""
    k_desc, v_desc = descs
    seq_q, seq_k, qk_scale = scalars
    STAGES: gl.constexpr = k_bufs.shape[0]
    BLOCK_N: gl.constexpr = k_bufs.shape[3]
    HEAD_DIM: gl.constexpr = k_bufs.shape[4]
    BLOCK_M: gl.constexpr = q2.shape[0]
    dtype: gl.constexpr = k_bufs.dtype
    s_layout: gl.constexpr = _acc_layout(BLOCK_N, NUM_WARPS, dtype.primitive_bitwidth)
    o_layout: gl.constexpr = _acc_layout(HEAD_DIM, NUM_WARPS, dtype.primitive_bitwidth)
    p_layout: gl.constexpr = _p_layout(HEAD_DIM, NUM_WARPS, dtype.primitive_bitwidth)
    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=gl.SliceLayout(1, s_layout))
    l_i = gl.full([BLOCK_M], 0.0, gl.float32, layout=gl.SliceLayout(1, s_layout))
    acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, layout=o_layout)
    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)
    for j in range(n_end):
        slot = j % STAGES
        mbarrier.wait(ready.index(slot), (j // STAGES) & 1)
        k_t = k_bufs.index(slot).reshape([BLOCK_N, HEAD_DIM]).permute((1, 0))
        s = warpgroup_mma(q2, k_t, s_zero, use_acc=False, is_async=True)
        s = warpgroup_mma_wait(0, deps=[s])
        if j >= n_full:
            s = _mask(s, rows, j, seq_q, seq_k, BLOCK_N, CAUSAL, s_layout)
        m_i, alpha, l_i, p = _softmax(s, m_i, l_i, qk_scale, dtype, p_layout, SOFTMAX)
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, o_layout)), 1)
        v = v_bufs.index(slot).reshape([BLOCK_N, HEAD_DIM])
        acc = warpgroup_mma(p, v, acc, is_async=True)
        acc = warpgroup_mma_wait(0, deps=[acc, p])[0]
        # the slot is free again: refill it
        _load_kv(k_desc, v_desc, k_bufs, v_bufs, ready, slot, coords, j + STAGES,
                 j + STAGES < n_end)  # fmt: skip
    return acc, m_i, l_i


@gluon.jit
def _fwd_pipelined(q_desc, k_desc, v_desc, o_desc, lse_ptr, heads_q, group, seq_q, seq_k,
                   qk_scale, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                   HEAD_DIM: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr,
                   NUM_WARPS: gl.constexpr, SOFTMAX: gl.constexpr = 0):  # fmt: skip
    dtype: gl.constexpr = q_desc.dtype
    s_layout: gl.constexpr = _acc_layout(BLOCK_N, NUM_WARPS, dtype.primitive_bitwidth)
    o_layout: gl.constexpr = _acc_layout(HEAD_DIM, NUM_WARPS, dtype.primitive_bitwidth)
    b, h, hk, bh = _program(heads_q, group)
    row0 = gl.program_id(0) * BLOCK_M
    if CAUSAL:  # heaviest tiles first: the last query tiles see the most keys
        row0 = (gl.num_programs(0) - 1 - gl.program_id(0)) * BLOCK_M
    n_full, n_end = _kv_bounds(row0, BLOCK_M, seq_q, seq_k, BLOCK_N, CAUSAL)
    q_smem = gl.allocate_shared_memory(dtype, q_desc.block_type.shape, q_desc.layout)
    k_bufs = gl.allocate_shared_memory(dtype, [STAGES] + k_desc.block_type.shape, k_desc.layout)  # noqa: RUF005
    v_bufs = gl.allocate_shared_memory(dtype, [STAGES] + v_desc.block_type.shape, v_desc.layout)  # noqa: RUF005
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
    mbarrier.expect(q_bar, q_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [b, h, row0, 0], q_bar, q_smem)
    for i in gl.static_range(STAGES):  # fill the ring
        _load_kv(k_desc, v_desc, k_bufs, v_bufs, ready, i, (b, hk), i, i < n_end)
    rows = row0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
    mbarrier.wait(q_bar, 0)
    acc, m_i, l_i = _pipelined_loop(q_smem.reshape([BLOCK_M, HEAD_DIM]), k_bufs, v_bufs, ready,
                                    (k_desc, v_desc), (b, hk), rows, n_full, n_end,
                                    (seq_q, seq_k, qk_scale), CAUSAL, NUM_WARPS,
                                    SOFTMAX)  # fmt: skip
    mbarrier.invalidate(q_bar)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(i))
    _epilogue(acc, m_i, l_i, qk_scale, q_smem, o_desc, lse_ptr, bh * seq_q, b, h, row0, seq_q,
              BLOCK_M, HEAD_DIM, o_layout)  # fmt: skip
