"""`@triton.jit` helpers of the attention variants (issue 19), shared by the forward
(flash_kernels.py) and the two-kernel backward (flash_kernels_bwd.py): the block ranges
of a sliding window, the window mask, the softcapped / ALiBi scores, where a packed
(varlen) sequence starts, and the dK/dV kernel's Pᵀ tile.

Semantics (flash-attn's): for query i and key j of one sequence (o = seq_k - seq_q),
key j is visible when i + o - left <= j <= i + o + right; softcap c turns the score
s = scale · q·k into c · tanh(s / c), then ALiBi subtracts m_h · |i + o - j|. The
kernels take the window as two non-negative ints (the launcher turns -1, unbounded,
into seq_q + seq_k, which no index reaches, and causal into right = 0) and keep scores
in the log2 domain: softcap2 = c · log2(e), slope2 = m_h · log2(e).

Triton decides when these functions are defined whether to interpret them, so
TRITON_INTERPRET must be set before this module (or triton) is first imported.
"""

import os

import triton
import triton.language as tl
from triton.language.extra import libdevice

# The interpreter has no libdevice: there tanh comes from exp2 (below). Read at import,
# when triton itself decides whether it interprets.
_LIBDEVICE_TANH = tl.constexpr(os.environ.get("TRITON_INTERPRET") != "1")


@triton.jit
def window_ranges(
    h0, n_streamed, lo_shift, hi_shift,
    BLOCK_HELD: tl.constexpr, BLOCK_STREAMED: tl.constexpr,
):  # fmt: skip
    """Block ranges for the held indices [h0, h0 + BLOCK_HELD), each of which sees the
    streamed indices [x + lo_shift, x + hi_shift] ∩ [0, n_streamed).

    Returns (lo, lo_full, hi_full, hi), BLOCK_STREAMED-aligned but hi, with
    lo <= lo_full <= hi_full: blocks in [lo_full, hi_full) are seen whole by every held
    index (no mask), blocks in [lo, lo_full) and [hi_full, hi) need the window mask, and
    nothing outside [lo, hi) is seen by any held index, so it is never loaded. The
    forward and dQ hold query rows (shifts o - left, o + right over the keys), dK/dV
    holds keys (shifts -o - right, -o + left over the query rows)."""
    last = h0 + BLOCK_HELD - 1
    lo = (tl.maximum(h0 + lo_shift, 0) // BLOCK_STREAMED) * BLOCK_STREAMED
    hi = tl.maximum(tl.minimum(tl.maximum(last + hi_shift + 1, 0), n_streamed), lo)
    hi_up = tl.cdiv(hi, BLOCK_STREAMED) * BLOCK_STREAMED
    # every held index sees [last + lo_shift, h0 + hi_shift]
    lo_full = tl.cdiv(tl.maximum(last + lo_shift, 0), BLOCK_STREAMED) * BLOCK_STREAMED
    lo_full = tl.minimum(lo_full, hi_up)
    hi_full = tl.minimum(tl.maximum(h0 + hi_shift + 1, 0), n_streamed)
    hi_full = tl.maximum((hi_full // BLOCK_STREAMED) * BLOCK_STREAMED, lo_full)
    return lo, lo_full, hi_full, hi


@triton.jit
def window_keep(rows, cols, diag_off, win_left, win_right, TRANSPOSED: tl.constexpr):
    """The window's visibility of (rows × cols), or (cols × rows) when TRANSPOSED (dK/dV
    holds keys on the first axis): key j is seen by query i when
    i + o - left <= j <= i + o + right."""
    if TRANSPOSED:
        diag = rows[None, :] + diag_off
        return (cols[:, None] >= diag - win_left) & (cols[:, None] <= diag + win_right)
    else:
        diag = rows[:, None] + diag_off
        return (cols[None, :] >= diag - win_left) & (cols[None, :] <= diag + win_right)


@triton.jit
def tanh(x, APPROX: tl.constexpr):
    """tanh in fp32. On a GPU: APPROX 1, the hardware's tanh.approx.f32 (one MUFU op,
    relative error about 2^-11, for fp16/bf16 inputs); APPROX 2, tanh.approx.bf16x2 (two
    values per MUFU op, bf16 precision; a development option, see flash_validate); else
    libdevice's. In the interpreter (no libdevice, no inline asm) from exp2."""
    if _LIBDEVICE_TANH:
        if APPROX == 2:
            t = tl.inline_asm_elementwise(
                "tanh.approx.bf16x2 $0, $1;", "=r,r", [x.to(tl.bfloat16)],
                dtype=tl.bfloat16, is_pure=True, pack=2,
            )  # fmt: skip
            return t.to(tl.float32)
        elif APPROX == 1:
            return tl.inline_asm_elementwise(
                "tanh.approx.f32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True, pack=1
            )
        else:
            return libdevice.tanh(x)
    else:
        e = tl.math.exp2(tl.abs(x) * -2.8853900817779268)  # exp(-2|x|)
        t = (1.0 - e) / (1.0 + e)
        return tl.where(x < 0, -t, t)


@triton.jit
def variant_scores(
    qk, qk_scale, softcap2, slope2, rows, cols, diag_off,
    SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, TRANSPOSED: tl.constexpr,
):  # fmt: skip
    """Log2-domain scores of the raw dots `qk` with the softcap and ALiBi, and the tanh
    the softcap's backward needs (a placeholder without a softcap): s2 = softcap2 · tanh(qk ·
    scale / c) - slope2 · |i + o - j| (log2(e) folded in after the tanh)."""
    if SOFTCAP:
        # SOFTCAP 1: libdevice's tanh (fp32), 2: tanh.approx.f32 (fp16/bf16), 3: bf16x2
        th = tanh(qk * (qk_scale / softcap2), SOFTCAP - 1)
        s = th * softcap2
    else:
        s = qk * qk_scale
        th = s  # unused without a softcap (a compiled tuple cannot hold None)
    if ALIBI:
        # distances as exact small integers in fp32, so no large value loses the score
        if TRANSPOSED:
            dist = (rows + diag_off).to(tl.float32)[None, :] - cols.to(tl.float32)[:, None]
        else:
            dist = (rows + diag_off).to(tl.float32)[:, None] - cols.to(tl.float32)[None, :]
        s = s - slope2 * tl.abs(dist)
    return s, th


@triton.jit
def alibi_slope2(Slopes, stride_slope_b, off_b, off_h, ALIBI: tl.constexpr):
    """This (batch, q head)'s ALiBi slope times log2(e), or 0.0 without ALiBi."""
    if ALIBI:
        return tl.load(Slopes + off_b * stride_slope_b + off_h) * 1.4426950408889634
    else:
        return 0.0


@triton.jit
def sequence(Cu, off_b):
    """A packed batch's sequence `off_b`: (its first token, its length)."""
    start = tl.load(Cu + off_b)
    return start, tl.load(Cu + off_b + 1) - start


@triton.jit
def dkdv_p_t(
    qk_t, lse2, offs_m, offs_n, causal_off, qk_scale, ON_DIAGONAL: tl.constexpr,
    win_left, win_right, softcap2, slope2,
    WINDOW: tl.constexpr, SOFTCAP: tl.constexpr, ALIBI: tl.constexpr,
):  # fmt: skip
    """dK/dV's Pᵀ tile (held keys × streamed rows, masked on the diagonal or the window's
    edges) and the tile that multiplies dPᵀ - delta: Pᵀ, or with a softcap Pᵀ ∘ (1 - tanh²),
    the derivative of c · tanh(s / c), taken here so the tanh tile dies at once instead
    of living across two dots beside Pᵀ (it spilled on sm_90)."""
    if SOFTCAP or ALIBI:
        s_t, th_t = variant_scores(
            qk_t, qk_scale, softcap2, slope2, offs_m, offs_n, causal_off, SOFTCAP, ALIBI, True
        )
        p_t = tl.math.exp2(s_t - lse2[None, :])
    else:
        p_t = tl.math.exp2(qk_t * qk_scale - lse2[None, :])
    if ON_DIAGONAL:
        if WINDOW:
            keep = window_keep(offs_m, offs_n, causal_off, win_left, win_right, True)
            p_t = tl.where(keep, p_t, 0.0)
        else:
            p_t = tl.where(offs_n[:, None] <= offs_m[None, :] + causal_off, p_t, 0.0)
    if SOFTCAP:
        pg_t = p_t * (1.0 - th_t * th_t)
    else:
        pg_t = p_t
    return p_t, pg_t
