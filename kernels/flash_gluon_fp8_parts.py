"""Helpers of the Gluon fp8 forward (kernels/flash_gluon_fp8_kernels.py): the 8-bit wgmma
layouts, the program's coordinates, key bounds and masks, the exp2 that computes part of
P on the FMA pipes, the fp8 online-softmax step, and the shared memory and mbarriers a
CTA allocates (_alloc_smem, _alloc_bars: the persistent kernel's too). The layouts are
flash_gluon_kernels' fixed to one warpgroup and 8-bit operands; the coordinate, bound and
mask helpers are flash_gluon_kernels' own (imported from there by the fp8 kernels).

The emulated exp2 (EMU = 2: every second exponential, 4: one in four; FlashAttention-4's
idea): with fp8 matmuls twice as fast as bf16, a consumer's 64 × 128 softmax needs as many
MUFU cycles (8192 exp2 at 16 per clock per SM) as its two matmuls need tensor-core cycles
at head_dim 128. 2^x = 2^round(x) · poly(x − round(x)): a degree-3 polynomial (relative
error 1.0e-4, fitted here with 2^0 = 1 exact so the row maximum stays exactly 256), the
integer part added into the exponent bits; x is clamped at −127 first, where the result
is exactly 0 (masked scores: −inf).
"""

# Gluon constexpr annotations inside the (untyped) jit functions are for triton, not mypy.
# mypy: disable-error-code="annotation-unchecked"

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

from fa_bench.kernels.flash_gluon_kernels import _acc_layout as _acc_layout_any
from fa_bench.kernels.flash_gluon_kernels import _kv_bounds, _mask
from fa_bench.kernels.flash_gluon_kernels import _p_layout as _p_layout_any


@gluon.constexpr_function
def _acc_layout(n):
    """The wgmma accumulator layout of a (64 × n) fp32 tile of one warpgroup: S (n = keys)
    or O (n = head_dim); k = 32 (256 bits of 8-bit operands)."""
    return _acc_layout_any(n, 4, 8)


@gluon.constexpr_function
def _p_layout(head_dim):
    """P's register layout as wgmma's 8-bit A operand of PV (k_width 4)."""
    return _p_layout_any(head_dim, 4, 8)


@gluon.constexpr_function
def _p_smem_layout(block_n):
    """P's shared-memory layout as wgmma's A operand (K-major: the keys contiguous), for
    P_SMEM: one 128-byte (or 64-byte) swizzled row per query."""
    return gl.NVMMASharedLayout(swizzle_byte_width=min(block_n, 128), element_bitwidth=8, rank=2)


@gluon.jit
def _rescale(acc, alpha, o_layout: gl.constexpr, SOFTMAX: gl.constexpr):
    """O · alpha per row. SOFTMAX bit 16 (lazy): only when some row of the warpgroup's 64 has
    a new maximum (alpha < 1; _softmax_fp8 moves it only past LAZY_TAU); once the row maxima
    settle, most key steps skip the 64 multiplies per thread (the test costs a cross-warp
    reduction)."""
    alpha_o = gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))
    if (SOFTMAX // 16) % 2 == 1:
        if gl.min(alpha_o, axis=0) < 1.0:
            acc = acc * gl.expand_dims(alpha_o, 1)
    else:
        acc = acc * gl.expand_dims(alpha_o, 1)
    return acc


# P's shift: exp2(s − m + P_EXP) ∈ [0, 256] (e4m3's largest finite value is 448).
P_EXP = gl.constexpr(8.0)
# The lazy rescale (SOFTMAX bit 16) keeps a row's running maximum m unless the new block's
# maximum exceeds it by more than LAZY_TAU (log2 units; FlashAttention-4's conditional
# rescale): P then stays ≤ 2^(P_EXP + LAZY_TAU) = 430 < 448, the row's O and l need no
# rescale (alpha = 1 exactly), and once the maxima have settled (the first key blocks)
# whole warpgroups skip the 64 multiplies per thread. m only enters through lse2 = m·c +
# log2(l) − P_EXP, which holds for any m the row's P and l were computed with.
LAZY_TAU = gl.constexpr(0.75)


def _emulated_exp2(dst: str, src: str) -> str:
    """PTX for dst = 2^src on the FMA/ALU pipes (see the module docstring); the constants
    are fp32 bit patterns: −127, 1.5·2²³ (adding it rounds to an integer held in the low
    mantissa bits), and the polynomial's coefficients c1, c2, c3 (c0 = 1)."""
    return (
        f"max.ftz.f32 %t, {src}, 0fC2FE0000; "
        "add.rn.f32 %j, %t, 0f4B400000; "
        "sub.rn.f32 %f, %j, 0f4B400000; "
        "sub.rn.f32 %f, %t, %f; "
        "fma.rn.f32 %p, %f, 0f3D6150EE, 0f3E78061A; "
        "fma.rn.f32 %p, %p, %f, 0f3F317AFD; "
        "fma.rn.f32 %p, %p, %f, 0f3F800000; "
        "shl.b32 %e, %j, 23; "
        f"add.s32 {dst}, %p, %e; "
    )


_DECL = "{ .reg .b32 %t, %j, %f, %p, %e; "
# pack 2: $0 on the MUFU, $1 emulated; pack 4: $0-$2 on the MUFU, $3 emulated
EXP2_HALF = gl.constexpr(_DECL + "ex2.approx.ftz.f32 $0, $2; " + _emulated_exp2("$1", "$3") + "}")
EXP2_QUARTER = gl.constexpr(
    _DECL
    + "ex2.approx.ftz.f32 $0, $4; ex2.approx.ftz.f32 $1, $5; ex2.approx.ftz.f32 $2, $6; "
    + _emulated_exp2("$3", "$7")
    + "}"
)


@gluon.jit
def _exp2(x, EMU: gl.constexpr):
    """2^x, with every EMU-th element computed on the FMA pipes (EMU 0: all on the MUFU)."""
    if EMU == 2:
        return gl.inline_asm_elementwise(
            EXP2_HALF, "=r,=r,r,r", [x], dtype=gl.float32, is_pure=True, pack=2
        )
    elif EMU == 4:
        return gl.inline_asm_elementwise(
            EXP2_QUARTER, "=r,=r,=r,=r,r,r,r,r", [x], dtype=gl.float32, is_pure=True, pack=4
        )
    else:
        return gl.exp2(x)


@gluon.jit
def _softmax_fp8(s, m_i, l_i, qk_scale, p_layout: gl.constexpr, SOFTMAX: gl.constexpr,
                 P_SMEM: gl.constexpr = False):  # fmt: skip
    """One online-softmax step with P shifted by P_EXP and rounded to e4m3: (m_new, alpha,
    l_new, p), p in PV's register A-operand layout, or (P_SMEM) left in S's layout for a
    store to shared memory. SOFTMAX % 16 is the exp2's EMU (0, 2 or 4)."""
    m_new = gl.maximum(m_i, gl.max(s, axis=1))
    if (SOFTMAX // 16) % 2 == 1:
        # (m_i = −inf: the difference is +inf, or NaN with m_new = −inf too: m_i kept)
        m_new = gl.where((m_new - m_i) * qk_scale > LAZY_TAU, m_new, m_i)
    # a row that has seen no key yet keeps m = -inf: subtract 0 instead (no NaN)
    m_scaled = gl.where(m_new == float("-inf"), 0.0, m_new * qk_scale)
    p = _exp2(s * qk_scale - gl.expand_dims(m_scaled - P_EXP, 1), SOFTMAX % 16)
    alpha = gl.exp2(m_i * qk_scale - m_scaled)
    if (SOFTMAX // 16) % 2 == 1:
        # exactly 1 where the row kept its maximum (the exp2's argument, fused into an FMA,
        # is the rounding error of m·c, not 0), so _rescale's test can skip the step
        alpha = gl.where(m_new == m_i, 1.0, alpha)
    l_new = l_i * alpha + gl.sum(p, axis=1)
    if P_SMEM:
        p_op = p.to(gl.float8e4nv)
    else:
        p_op = gl.convert_layout(p.to(gl.float8e4nv), p_layout)
    return m_new, alpha, l_new, p_op


@gluon.jit
def _tile_start(my_row0, seq_q, seq_k, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                HEAD_DIM: gl.constexpr, CAUSAL: gl.constexpr):  # fmt: skip
    """A consumer tile's start (flash_gluon_fp8_kernels._tile, flash_gluon_fp8_ahead's):
    (n_full, its rows, m_i = −inf, l_i = 0, acc = 0)."""
    s_layout: gl.constexpr = _acc_layout(BLOCK_N)
    n_full, _n_mine = _kv_bounds(my_row0, BLOCK_M, seq_q, seq_k, BLOCK_N, CAUSAL)
    rows = my_row0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=gl.SliceLayout(1, s_layout))
    l_i = gl.full([BLOCK_M], 0.0, gl.float32, layout=gl.SliceLayout(1, s_layout))
    acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, layout=_acc_layout(HEAD_DIM))
    return n_full, rows, m_i, l_i, acc


@gluon.jit
def _alloc_bars(STAGES: gl.constexpr, CONSUMERS: gl.constexpr = 2):
    """Q (one per consumer), K/V ready (the producer's expect) and empty (one arrival per
    consumer), and the ping-pong turn (one per consumer: a round robin). (flash_gluon_ws'
    helper, kept: its mbarriers are initialised in another order, and importing it
    changes the PTX; the third consumer's come last for the same reason.)"""
    layout: gl.constexpr = mbarrier.MBarrierLayout()
    q_bars = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], layout)
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], layout)
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], layout)
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], layout)
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], layout)
    turn = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], layout)
    for c in gl.static_range(2):
        mbarrier.init(q_bars.index(c), count=1)
        mbarrier.init(turn.index(c), count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=CONSUMERS)
        mbarrier.init(v_empty.index(i), count=CONSUMERS)
    for c in gl.static_range(2, CONSUMERS):
        mbarrier.init(q_bars.index(c), count=1)
        mbarrier.init(turn.index(c), count=1)
    return q_bars, k_ready, k_empty, v_ready, v_empty, turn


@gluon.jit
def _alloc_smem(q_desc, k_desc, vt_desc, o_desc, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                HEAD_DIM: gl.constexpr, STAGES: gl.constexpr, P_SMEM: gl.constexpr,
                CONSUMERS: gl.constexpr = 2, O_IN_P: gl.constexpr = False):  # fmt: skip
    """The CTA's tiles: every consumer's fp8 Q, the K/Vᵀ ring, every consumer's bf16 O tile
    and (P_SMEM) the P buffers (o_smem again otherwise). O_IN_P: consumer c's O tile is its
    two P buffers (16 KB at BLOCK_N = HEAD_DIM = 128), written once its last PV is done:
    the bytes a fourth ring stage needs with three consumers (not persistent: there the O
    store runs on under the next tile's P)."""
    fp8: gl.constexpr = gl.float8e4nv
    q_smem = gl.allocate_shared_memory(fp8, [CONSUMERS, 1, 1, BLOCK_M, HEAD_DIM], q_desc.layout)
    k_bufs = gl.allocate_shared_memory(fp8, [STAGES, 1, 1, BLOCK_N, HEAD_DIM], k_desc.layout)
    vt_bufs = gl.allocate_shared_memory(fp8, [STAGES, 1, 1, HEAD_DIM, BLOCK_N], vt_desc.layout)
    if O_IN_P:
        gl.static_assert(P_SMEM and BLOCK_N >= HEAD_DIM, "O fits in the P buffers")
        p_smem = gl.allocate_shared_memory(fp8, [2 * CONSUMERS, BLOCK_M, BLOCK_N],
                                           _p_smem_layout(BLOCK_N))  # fmt: skip
        # consumer c's O tile is o_smem.index(c · BLOCK_N // HEAD_DIM): the bytes of its
        # own P buffers 2c and 2c + 1 (at head_dim 64 index c would overlap another
        # consumer's: session 7's inf at d64). One return for both branches: triton 3.6
        # checks every return's type, and this o_smem has more tiles
        o_smem = p_smem._reinterpret(gl.bfloat16, [CONSUMERS * (BLOCK_N // HEAD_DIM), 1, 1,
                                     BLOCK_M, HEAD_DIM], o_desc.layout)  # fmt: skip
    else:
        o_smem = gl.allocate_shared_memory(gl.bfloat16, [CONSUMERS, 1, 1, BLOCK_M, HEAD_DIM],
                                           o_desc.layout)  # fmt: skip
        if P_SMEM:  # [2 · consumer + buffer, rows, keys]
            p_smem = gl.allocate_shared_memory(fp8, [2 * CONSUMERS, BLOCK_M, BLOCK_N],
                                               _p_smem_layout(BLOCK_N))  # fmt: skip
        else:  # not read: the registers carry P
            p_smem = o_smem
    return q_smem, k_bufs, vt_bufs, o_smem, p_smem


@gluon.jit
def _mask_fp8(s, rows, j, seq_q, seq_k, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr,
              layout: gl.constexpr, SOFTMAX: gl.constexpr):  # fmt: skip
    """flash_gluon_kernels._mask, or (SOFTMAX bit 128, causal) the same keys masked with one
    compare per score: each column against its row's last key min(row + seq_k − seq_q,
    seq_k − 1) (_mask's two tests folded per row). (Comparing the loop-invariant column
    offsets against last − j·BLOCK_N instead kept 32 offsets live: ptxas spilled them.)"""
    if CAUSAL and (SOFTMAX // 128) % 2 == 1:
        cols = j * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, layout))
        last = gl.minimum(rows + (seq_k - seq_q), seq_k - 1)
        keep = gl.expand_dims(cols, 0) <= gl.expand_dims(last, 1)
        return gl.where(keep, s, float("-inf"))
    else:
        return _mask(s, rows, j, seq_q, seq_k, BLOCK_N, CAUSAL, layout)


@gluon.jit
def _idle(bars, j0, n_end, g0, tc0, ME: gl.constexpr, PINGPONG: gl.constexpr):
    """Key blocks [j0, n_end) of a consumer without rows there (all of them: its rows lie
    past seq_q; OWN_END: those past its diagonal): each ring slot released once it has
    landed (its empty mbarriers count every consumer; waiting for the landing keeps this
    consumer's arrivals in the slot's phase), each ping-pong turn taken and passed on, no
    matmul."""
    k_ready, k_empty, v_ready, v_empty, turn = bars[1], bars[2], bars[3], bars[4], bars[5]
    STAGES: gl.constexpr = k_ready.shape[0]
    for j in range(j0, n_end):
        g = g0 + j
        mbarrier.wait(k_ready.index(g % STAGES), (g // STAGES) & 1)
        if PINGPONG:
            if j > 0:  # the parities of _step's turn (consumer 0 goes first)
                if ME == 0:
                    mbarrier.wait(turn.index(ME), (tc0 + j) & 1)
                else:
                    mbarrier.wait(turn.index(ME), (tc0 + j - 1) & 1)
                mbarrier.arrive(turn.index((ME + 1) % turn.shape[0]), count=1)
        mbarrier.arrive(k_empty.index(g % STAGES), count=1)
        mbarrier.wait(v_ready.index(g % STAGES), (g // STAGES) & 1)
        mbarrier.arrive(v_empty.index(g % STAGES), count=1)
