"""Issue 19's variants in the Gluon forward (sm_90): the `@gluon.jit` helpers.

The variant kernel (kernels/flash_gluon_var_ws.py) is the warp-specialised kernel of
kernels/flash_gluon_ws.py with these steps added; the dense kernels are left untouched,
so their generated code is unchanged (tools/gluon_compile.py --fingerprint compares).

Semantics (flash-attn's, as kernels/flash_kernels_variants.py): for query i and key j
of one sequence (o = seq_k − seq_q), softcap c turns s = scale · q·k into c · tanh(s / c),
ALiBi subtracts m_h · |i + o − j|, then key j is visible when
i + o − left ≤ j ≤ i + o + right (the host turns −1 into seq_q + seq_k and causal into
right = 0).

Scores stay "raw" as in the dense kernel: the softmax computes exp2(s · sc − m · sc)
with one runtime factor sc, so the variants only change what s and sc are:
- dense / ALiBi only: s = q·k (− alibi_k · |i + o − j|), sc = scale · log2(e);
- softcap: s = tanh(q·k · cap_mul) (− alibi_k · |i + o − j|), sc = c · log2(e), with
  cap_mul = scale / c; tanh is the hardware's tanh.approx.f32 (one MUFU op);
- alibi_k = m_h · log2(e) / sc: the ALiBi term costs one FADD (the distance, exact
  small integers in fp32) and one FFMA per score.
So lse2 = m · sc + log2(l) is the log2-domain log-sum-exp the `tl` backward expects.

Packed batches (VARLEN): the tensors are (1, H, T, D) views of the packed (T, H, D)
ones, so the dense kernel's 4-D TMA descriptors serve unchanged with row coordinates
offset by each sequence's start; rows past a sequence's end read the next sequence's
tokens (keys are masked to −inf past seq_k, query rows are never stored), and O leaves
through masked pointer stores so no program writes another sequence's rows.
"""

# Gluon constexpr annotations inside the (untyped) jit functions are for triton, not mypy.
# mypy: disable-error-code="annotation-unchecked"

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, tma

from fa_bench.kernels.gluon_exp2 import (
    exp2_split,
    row_max,
    row_sum,
    softmax_emu,
    softmax_tree,
)

# Bits of the variant kernel's VAR constexpr (constexpr globals: jit code may read them).
WINDOW = gl.constexpr(1)
SOFTCAP = gl.constexpr(2)
ALIBI = gl.constexpr(4)
VARLEN = gl.constexpr(8)
# with SOFTCAP: tanh.approx.f16x2 (two per MUFU op) instead of tanh.approx.f32; a
# development switch (flash_gluon_varhost.TANH_F16X2), not the default
TANH_F16X2 = gl.constexpr(16)
# with SOFTCAP: each consumer scales its Q tile by scale / c once (in shared memory, rounded
# to the input dtype), so a score's tanh needs no multiply; a development switch
# (flash_gluon_varhost.QSCALE)
QSCALE = gl.constexpr(32)
# with ALIBI, where every visible key j <= i + o (causal, or a window whose right bound is
# 0): −m·|i + o − j| = m·(j − base) − m·(i + o − base) for any base, and the row term
# drops out of the softmax, so each score takes one per-COLUMN bias (a vector per key
# block) in place of the |·| distance; base = the consumer's first row + o keeps the
# visible keys' biases small in fp32, and the epilogue adds the row term to lse2.
# Above the softmax code's bits (6 .. 10: GluonConfig.softmax_code() < 32).
ALIBI_COL = gl.constexpr(4096)
# with SOFTCAP (no ALiBi, bf16): tanh bounds every score to [−sc, sc] in the log2 domain,
# so the softmax can subtract one fixed offset sc − HEADROOM in place of the running row
# max: p ∈ [2^(HEADROOM − 2·sc), 2^HEADROOM], all normal in fp32/bf16 while 2·sc −
# HEADROOM ≤ 126 (the host checks), and no row max, no rescale of the sums or of O.
FIXED_MAX = gl.constexpr(8192)
HEADROOM = gl.constexpr(64.0)
# Without FIXED_MAX (fp16 softcap, flash_gluon_varhost.SOFTCAP_LAZY_FP16; the math holds for
# any launch): a row's offset m moves only when a key block's maximum exceeds it by more
# than LAZY_TAU (log2 units), so p ≤ 2^LAZY_TAU = 256 (fp16 holds 65504; l is fp32), and O
# and l are rescaled only in the steps where some row of the warpgroup moved: once the
# maxima settle, a 64-key step skips its 64 FMUL per thread (the fp8 kernel's lazy
# rescale, flash_gluon_fp8_parts, with fp16's headroom). Exact for any m the row's P and
# l were computed with: lse2 = m · sc + log2(l). Above SUM_BF16 / P_ALU (16384, 32768).
LAZY = gl.constexpr(65536)
LAZY_TAU = gl.constexpr(8.0)
# with LAZY: the skip decided per warp (its 16 rows) by a warp vote, and O's rescale behind
# a branch inside inline PTX, in place of a uniform `if` on the warpgroup's maximum (a
# reduction through shared memory, two barriers per step: the fp8 kernel's lazy rescale,
# which has that test, measured 8-14% slower than its plain launch). A development switch
# (flash_gluon_varhost.SOFTCAP_LAZY_WARP).
LAZY_WARP = gl.constexpr(131072)


def _warp_rescale_asm(n: int) -> str:
    """PTX for n values times their row's alpha, skipped (a warp-uniform branch: the flag
    comes from a vote) where the flag is 0. Operands: $0.. the results, tied to the values
    $n.. (so the skip leaves them as they are), the alphas $2n.., the flags $3n.. (the
    first one read)."""
    muls = " ".join(f"mul.f32 ${i}, ${i}, ${2 * n + i};" for i in range(n))
    return (
        f"{{ .reg .pred %keep; setp.eq.s32 %keep, ${3 * n}, 0; @%keep bra.uni LAZY_SKIP; "
        f"{muls} LAZY_SKIP: }}"
    )


_N = 16  # values per asm block: 4 branches per step at head_dim 128
_PACK = gl.constexpr(_N)
_RESCALE_ASM = gl.constexpr(_warp_rescale_asm(_N))
_RESCALE_CON = gl.constexpr(",".join(["=r"] * _N + [str(i) for i in range(_N)] + ["r"] * (2 * _N)))
# a thread's two rows: whether either moved, then any lane of the warp (vote)
_VOTE_ASM = gl.constexpr(
    "{ .reg .pred %a, %b; setp.ne.s32 %a, $2, 0; setp.ne.s32 %b, $3, 0; or.pred %a, %a, %b; "
    "vote.sync.any.pred %a, %a, 0xffffffff; selp.s32 $0, 1, 0, %a; selp.s32 $1, 1, 0, %a; }"
)


@gluon.jit
def _window_bounds(row0, rows: gl.constexpr, seq_q, seq_k, win_left, win_right,
                   BLOCK_N: gl.constexpr):  # fmt: skip
    """Key blocks of query rows [row0, row0 + rows) under the window (left, right):
    (lo, lo_full, hi_full, hi). Blocks outside [lo, hi) are seen by no row (never
    loaded); [lo_full, hi_full) are seen whole by every row (no mask); the rest of
    [lo, hi) takes the mask. lo <= lo_full <= hi_full <= hi."""
    diag = seq_k - seq_q
    last = row0 + rows - 1
    lo = gl.maximum(row0 + diag - win_left, 0) // BLOCK_N
    hi = gl.minimum(gl.cdiv(gl.maximum(last + diag + win_right + 1, 0), BLOCK_N),
                    gl.cdiv(seq_k, BLOCK_N))  # fmt: skip
    hi = gl.maximum(hi, lo)
    # every row sees [last + diag − left, row0 + diag + right] (and nothing past seq_k)
    lo_full = gl.cdiv(gl.maximum(last + diag - win_left, 0), BLOCK_N)
    hi_full = gl.minimum(gl.maximum(row0 + diag + win_right + 1, 0), seq_k) // BLOCK_N
    lo_full = gl.minimum(gl.maximum(lo_full, lo), hi)
    hi_full = gl.minimum(gl.maximum(hi_full, lo_full), hi)
    return lo, lo_full, hi_full, hi


@gluon.jit
def _tanh(x, F16X2: gl.constexpr):
    """tanh.approx.f32: one MUFU op, relative error about 2^-11 (fp16/bf16 inputs only,
    as the `tl` kernel's flash_validate.FAST_TANH); F16X2: tanh.approx.f16x2 on the
    values rounded to fp16, two per MUFU op (the softcap's second MUFU op per score
    competes with exp2's: this halves it)."""
    if F16X2:
        t = gl.inline_asm_elementwise(
            "tanh.approx.f16x2 $0, $1;", "=r,r", [x.to(gl.float16)], dtype=gl.float16,
            is_pure=True, pack=2,
        )  # fmt: skip
        return t.to(gl.float32)
    else:
        return gl.inline_asm_elementwise(
            "tanh.approx.f32 $0, $1;", "=r,r", [x], dtype=gl.float32, is_pure=True, pack=1
        )


@gluon.jit
def _var_scores(s, j, cap_mul, alibi_k, posf, colf, BLOCK_N: gl.constexpr, VAR: gl.constexpr):
    """The softcap, then ALiBi, on the raw scores of key block j (see the module
    docstring for the units). posf: the rows' i + o (ALIBI_COL: the scalar base) and
    colf: 0 .. BLOCK_N − 1, both as fp32, made once per tile (`alibi_positions`):
    int-to-float conversions run on the pipe that also computes exp2, so none is made
    per score."""
    if VAR & SOFTCAP:
        if VAR & QSCALE:  # Q already carries scale / c (scale_q)
            s = _tanh(s, VAR & TANH_F16X2)
        else:
            s = _tanh(s * cap_mul, VAR & TANH_F16X2)
    if VAR & ALIBI:
        if VAR & ALIBI_COL:
            # the bias within the block, one FFMA per score; the block's own offset
            # alibi_k · (j·BLOCK_N − base), the same for every score of it, goes into the
            # running max instead (`alibi_shift`): a column vector made per block would
            # cost as much again, a thread holding only two rows of it
            s = gl.fma(gl.expand_dims(colf, 0), alibi_k, s)
        else:
            # distances as exact small integers in fp32: no large intermediate to round
            rel = posf - (j * BLOCK_N).to(gl.float32)
            dist = gl.expand_dims(rel, 1) - gl.expand_dims(colf, 0)
            s = s - alibi_k * gl.abs(dist)
    return s


@gluon.jit
def alibi_shift(j, alibi_k, posf, BLOCK_N: gl.constexpr):
    """ALIBI_COL: key block j's bias offset alibi_k · (j·BLOCK_N − base) (posf = base),
    the part of every score's bias that _var_scores leaves out: the softmax runs with
    the running max taken relative to it (m − shift in, + shift out)."""
    return alibi_k * ((j * BLOCK_N).to(gl.float32) - posf)


@gluon.jit
def alibi_positions(rows, row0, diag, BLOCK_N: gl.constexpr, VAR: gl.constexpr,
                    layout: gl.constexpr):  # fmt: skip
    """(posf, colf) of _var_scores for a tile (0, 0 without ALiBi); ALIBI_COL: posf is
    the scalar base row0 + diag."""
    if VAR & ALIBI:
        colf = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, layout)).to(gl.float32)
        if VAR & ALIBI_COL:
            return (row0 + diag).to(gl.float32), colf
        else:
            return (rows + diag).to(gl.float32), colf
    else:
        return 0, 0


@gluon.jit
def fixed_p(s, sc, SOFTMAX: gl.constexpr):
    """FIXED_MAX's P in fp32: p = 2^(s · sc − (sc − HEADROOM))."""
    return exp2_split(s * sc - (sc - HEADROOM), softmax_emu(SOFTMAX))


@gluon.jit
def softmax_fixed(s, l_i, sc, dtype: gl.constexpr, p_layout: gl.constexpr,
                  SOFTMAX: gl.constexpr):  # fmt: skip
    """FIXED_MAX's softmax step: (l, P) with p = 2^(s · sc − (sc − HEADROOM)); the sums
    and O are never rescaled (the offset never moves)."""
    p = fixed_p(s, sc, SOFTMAX)
    l_new = l_i + row_sum(p, l_i, softmax_tree(SOFTMAX))
    return l_new, gl.convert_layout(p.to(dtype), p_layout)


@gluon.jit
def softmax_lazy(s, m_i, l_i, sc, dtype: gl.constexpr, p_layout: gl.constexpr,
                 SOFTMAX: gl.constexpr):  # fmt: skip
    """LAZY's softmax step: (m, the row sums of P, P), P taken against the kept m. The sums
    are left apart: l · alpha (`lazy_rescale`) comes after PV's wait, with O's."""
    TREE: gl.constexpr = softmax_tree(SOFTMAX)
    m_blk = gl.maximum(m_i, row_max(s, m_i, TREE))
    # m_i = −inf: +inf (moves), or NaN where the block is masked for the row too (kept)
    m_new = gl.where((m_blk - m_i) * sc > LAZY_TAU, m_blk, m_i)
    # a row that has seen no key yet keeps m = -inf: subtract 0 instead (no NaN)
    m_scaled = gl.where(m_new == float("-inf"), 0.0, m_new * sc)
    p = exp2_split(s * sc - gl.expand_dims(m_scaled, 1), softmax_emu(SOFTMAX))
    return m_new, row_sum(p, l_i, TREE), gl.convert_layout(p.to(dtype), p_layout)


@gluon.jit
def row_operands(alpha, flag, layout: gl.constexpr):
    """A row vector's alpha and the warp's flag broadcast over `layout`'s columns: the
    per-element operands of the warp-skipped PTX (`warp_mul`, the sum check's rounding)."""
    rows: gl.constexpr = gl.SliceLayout(1, layout)
    a = gl.expand_dims(gl.convert_layout(alpha, rows), 1)
    f = gl.expand_dims(gl.convert_layout(flag, rows), 1)
    return a, f


@gluon.jit
def warp_mul(x, alpha, flag, layout: gl.constexpr):
    """x times its row's alpha, skipped (inside PTX) in the warps whose flag is 0."""
    a, f = row_operands(alpha, flag, layout)
    return gl.inline_asm_elementwise(_RESCALE_ASM, _RESCALE_CON, [x, a, f], dtype=gl.float32,
                                     is_pure=True, pack=_PACK)  # fmt: skip


@gluon.jit
def lazy_rescale(acc, l_i, m_old, m_new, sc, o_layout: gl.constexpr, WARP: gl.constexpr):
    """(O, l) · 2^((m_old − m_new) · sc) per row, in the steps where some row of the
    warpgroup moved its m (a uniform branch after a cross-warp max); else untouched, the
    alpha exp2 skipped too. A row that saw no key before gets alpha 0 (its O and l are 0).
    WARP (LAZY_WARP): l always, O only in the warps where one of its rows moved."""
    rows: gl.constexpr = gl.SliceLayout(1, o_layout)
    if WARP:
        alpha = gl.where(m_new == m_old, 1.0, gl.exp2((m_old - m_new) * sc))
        l_i = l_i * alpha
        moved = gl.where(m_new != m_old, 1, 0)
        flag = gl.inline_asm_elementwise(_VOTE_ASM, "=r,=r,r,r", [moved], dtype=gl.int32,
                                         is_pure=False, pack=2)  # fmt: skip
        acc = warp_mul(acc, alpha, flag, o_layout)
    elif gl.max(gl.where(m_new != m_old, 1, 0), axis=0) > 0:
        alpha = gl.where(m_new == m_old, 1.0, gl.exp2((m_old - m_new) * sc))
        l_i = l_i * alpha
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, rows), 1)
    return acc, l_i


@gluon.jit
def scale_q(q_tile, cap_mul, BLOCK_M: gl.constexpr, HEAD_DIM: gl.constexpr):
    """Q ← Q · cap_mul in shared memory (rounded to Q's dtype), once per tile, before the
    first QKᵀ reads it: the softcap's tanh argument then comes out of the matmul."""
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    q2 = q_tile.reshape([BLOCK_M, HEAD_DIM])
    q = q2.load(layout)
    q2.store((q.to(gl.float32) * cap_mul).to(q.dtype))
    fence_async_shared()


@gluon.jit
def _var_mask(s, rows, j, seq_q, seq_k, win_left, win_right, BLOCK_N: gl.constexpr,
              CAUSAL: gl.constexpr, VAR: gl.constexpr, layout: gl.constexpr):  # fmt: skip
    """Scores of invisible keys set to −inf: past seq_k, and outside the window (or past
    the causal diagonal without one)."""
    cols = gl.expand_dims(j * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, layout)), 0)
    keep = cols < seq_k
    pos = gl.expand_dims(rows + (seq_k - seq_q), 1)
    if VAR & WINDOW:
        keep = keep & (cols >= pos - win_left) & (cols <= pos + win_right)
    elif CAUSAL:
        keep = keep & (cols <= pos)
    return gl.where(keep, s, float("-inf"))


@gluon.jit
def _needs_mask(j, lo_full, n_full, VAR: gl.constexpr):
    """Whether key block j takes the mask: outside [lo_full, n_full) with a window, from
    n_full on without one (as the dense kernel)."""
    if VAR & WINDOW:
        return (j < lo_full) | (j >= n_full)
    else:
        return j >= n_full


@gluon.jit
def _store_rows(o, o_ptr, row0, seq_q, q_start, h, stride_os, stride_oh,
                BLOCK_M: gl.constexpr, HEAD_DIM: gl.constexpr, layout: gl.constexpr):  # fmt: skip
    """O of rows [row0, row0 + BLOCK_M) of a packed sequence (starting at token q_start)
    through pointer stores masked at the sequence's end: never another sequence's rows."""
    rows = row0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, layout))
    cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, layout))
    tok = (q_start + rows).to(gl.int64)
    base = o_ptr + h.to(gl.int64) * stride_oh
    ptrs = base + gl.expand_dims(tok * stride_os, 1) + gl.expand_dims(cols, 0)
    gl.store(ptrs, o.to(o_ptr.dtype.element_ty), mask=gl.expand_dims(rows < seq_q, 1))


@gluon.jit
def _var_epilogue(acc, m_i, l_i, sc, out, lse_base, h, row0, seq_q, q_start, q_tile,
                  alibi_k, BLOCK_M: gl.constexpr, HEAD_DIM: gl.constexpr, VAR: gl.constexpr,
                  o_layout: gl.constexpr):  # fmt: skip
    """O = acc / l and lse2 = m · sc + log2(l) (+inf and O = 0 where a row saw no key;
    ALIBI_COL: minus the dropped row term alibi_k · (i − row0) · sc).
    Dense-layout calls store O with a TMA copy clipped at seq_q; packed ones with a TMA
    copy where the tile lies inside its sequence, else masked pointer stores."""
    o_desc, lse_ptr, o_ptr, stride_os, stride_oh, b = out
    row_layout: gl.constexpr = gl.SliceLayout(1, o_layout)
    l_o = gl.convert_layout(l_i, row_layout)
    empty = l_o == 0.0
    l_safe = gl.where(empty, 1.0, l_o)
    o = acc / gl.expand_dims(l_safe, 1)
    if VAR & VARLEN:
        if row0 + BLOCK_M <= seq_q:  # the whole tile inside its sequence: one TMA store
            q_tile.reshape([BLOCK_M, HEAD_DIM]).store(o.to(o_desc.dtype))
            fence_async_shared()
            tma.async_copy_shared_to_global(o_desc, [b, h, q_start + row0, 0], q_tile)
            tma.store_wait(0)
        else:
            _store_rows(o, o_ptr, row0, seq_q, q_start, h, stride_os, stride_oh, BLOCK_M,
                        HEAD_DIM, o_layout)  # fmt: skip
    else:
        q_tile.reshape([BLOCK_M, HEAD_DIM]).store(o.to(o_desc.dtype))
        fence_async_shared()
        tma.async_copy_shared_to_global(o_desc, [b, h, row0, 0], q_tile)
    m_o = gl.convert_layout(m_i, row_layout)
    lse2 = gl.where(empty, float("inf"), m_o * sc + gl.log2(l_safe))
    if VAR & ALIBI_COL:
        off = gl.arange(0, BLOCK_M, layout=row_layout).to(gl.float32)
        lse2 = lse2 - (alibi_k * sc) * off
    rows = row0 + gl.arange(0, BLOCK_M, layout=row_layout)
    gl.store(lse_ptr + lse_base + rows, lse2, mask=rows < seq_q)
    if not (VAR & VARLEN):
        tma.store_wait(0)
