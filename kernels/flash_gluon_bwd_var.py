"""Issue 19's variants in the Gluon backward (kernels/flash_gluon_bwd_kernels.py): sliding
windows, ALiBi and the logit softcap, in any combination, for the consumers' Sᵀ tiles
(keys on the first axis, query rows on the second).

`VAR` (a constexpr) holds the variant bits, 0 for dense attention (whose code is then
untouched): window 1, softcap 2, ALiBi 4, K_SCALED 8 (the host's names and values:
kernels/flash_gluon_bwd_varhost.py). The runtime values come as one tuple `var`:

- win_left, win_right: the window's kernel bounds (flash_validate.kernel_window: both
  >= 0, -1 turned into seq_q + seq_k, causal folded in as right = 0); key j is visible
  to query i when i + o - left <= j <= i + o + right (o = seq_k - seq_q);
- cap_in = scale / c and cap_out = c · log2(e): the forward's softcapped score in the
  log2 domain is tanh(q·k · cap_in) · cap_out;
- slopes, slope_stride_b: the (batch, heads_q) fp32 ALiBi slopes (stride 0 over the
  batch when the call gave (heads_q,));
- kbar: with bit 8 (K_SCALED, a softcap), an mbarrier both consumers arrive at once
  they have scaled their K tile by cap_in in shared memory (`_scale_k`), so a score's
  tanh takes its dot as it is (one multiply per score less) and dQ = dS K' comes out
  scaled by cap_in (dQ's cast multiplies by c = scale / cap_in instead of scale); None
  without.

Semantics are the `tl` kernels' (flash_kernels_variants.py): softcap, then ALiBi
(s - m_h · |i + o - j|), then the mask; lse2 is the forward's (+inf for a row that sees no
key, which makes its P 0). The softcap's derivative is folded into the tile that meets
dPᵀ - delta (Pᵀ ∘ (1 - tanh²)) as soon as Pᵀ is known, so the tanh tile dies at once:
the registers live across dV are the dense kernel's.
"""

# Gluon constexpr annotations inside the (untyped) jit functions are for triton, not mypy.
# mypy: disable-error-code="annotation-unchecked"

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier


@gluon.jit
def _query_range(key0, n_keys, seq_q, seq_k, win_left, win_right, BLOCK_M: gl.constexpr,
                 CAUSAL: gl.constexpr, VAR: gl.constexpr):  # fmt: skip
    """(first query block, number of query blocks) that see any of keys
    [key0, key0 + n_keys): causal from the diagonal, a window between its edges."""
    diag = seq_k - seq_q
    n_blocks = gl.cdiv(seq_q, BLOCK_M)
    m_start = 0
    if VAR & 1:
        m_start = gl.maximum(key0 - diag - win_right, 0) // BLOCK_M
        # the last row that sees the last key: i <= j - o + left
        last = gl.minimum(key0 + n_keys - 1 - diag + win_left, seq_q - 1)
        m_end = gl.cdiv(gl.maximum(last, -1) + 1, BLOCK_M)
        n_m = gl.maximum(m_end - m_start, 0)
    else:
        if CAUSAL:  # the first query block that sees any of the CTA's keys
            m_start = gl.maximum(key0 - diag, 0) // BLOCK_M
        n_m = n_blocks - m_start
    return m_start, n_m


@gluon.jit
def _slope2(var, b, hq, VAR: gl.constexpr):
    """This (batch, q head)'s ALiBi slope in the log2 domain (0.0 without ALiBi)."""
    if VAR & 4:
        slopes = var[4]
        return gl.load(slopes + b * var[5] + hq) * 1.4426950408889634
    else:
        return 0.0


@gluon.jit
def _tanh(x):
    """tanh.approx.f32: one MUFU op, relative error about 2^-11 (fp16/bf16 inputs, as the
    forward's and the `tl` kernels' fast tanh)."""
    return gl.inline_asm_elementwise(
        "tanh.approx.f32 $0, $1;", "=r,r", [x], dtype=gl.float32, is_pure=True, pack=1
    )


@gluon.jit
def _scale_k(k_tile, cap_in, kbar):
    """This consumer's K tile times cap_in, rounded to its dtype in place, then the other
    consumer's (dQ reads both tiles) awaited: before any matmul reads them."""
    KEYS: gl.constexpr = k_tile.shape[0]
    HEAD_DIM: gl.constexpr = k_tile.shape[1]
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    gl.static_assert(KEYS * HEAD_DIM >= 128 * 8, "one 8-element row piece per thread at least")
    k = k_tile.load(layout)
    k_tile.store((k.to(gl.float32) * cap_in).to(k_tile.dtype))
    fence_async_shared()
    mbarrier.arrive(kbar, count=1)
    mbarrier.wait(kbar, 0)


@gluon.jit
def _var_p(s_t, lse2, m0, my_key0, seq_q, seq_k, qk_scale, var, slope2, dtype: gl.constexpr,
           CAUSAL: gl.constexpr, VAR: gl.constexpr):  # fmt: skip
    """(Pᵀ in `dtype`, the fp32 tile that multiplies dPᵀ - delta) of a consumer's Sᵀ = K Qᵀ
    (raw dots) for query rows [m0, m0 + BLOCK_M) and keys [my_key0, my_key0 + KEYS),
    with the variant: masked where a key is past seq_k, outside the window, past the
    diagonal (causal) or, with a softcap, where a row is past seq_q (its zero-filled lse2
    would let P reach 2^cap_out, inf in fp16, and inf · 0 in dV). Both tiles are made
    score by score before the mask, so each score's tanh and fp32 P die at once: the
    registers live here are the dense kernel's (P in fp32 and in `dtype`)."""
    win_left, win_right, cap_in, cap_out = var[0], var[1], var[2], var[3]
    KEYS: gl.constexpr = s_t.shape[0]
    BLOCK_M: gl.constexpr = s_t.shape[1]
    layout: gl.constexpr = s_t.type.layout
    row_l: gl.constexpr = gl.SliceLayout(1, layout)
    col_l: gl.constexpr = gl.SliceLayout(0, layout)
    diag = seq_k - seq_q
    if VAR & 8:  # K already scaled by cap_in (`_scale_k`)
        th = _tanh(s_t)
        x = th * cap_out
    elif VAR & 2:
        th = _tanh(s_t * cap_in)
        x = th * cap_out
    else:
        x = s_t * qk_scale
    if VAR & 4:
        # distances from this consumer's first key, exact small integers in fp32 (the
        # visible ones; far ones only need P to underflow)
        colf = (gl.arange(0, BLOCK_M, layout=col_l) + (m0 + diag - my_key0)).to(gl.float32)
        rowf = gl.arange(0, KEYS, layout=row_l).to(gl.float32)
        if CAUSAL:
            # every visible key has j <= i + o: -m·(i + o - j) = m·(j - key0) - m·(i + o - key0),
            # a key term and a row term (with lse2) instead of |·| per score; a masked
            # score's P may overflow here, and the mask below sets it to 0
            x = x + gl.expand_dims(slope2 * rowf, 1)
            x = x - gl.expand_dims(slope2 * colf + lse2, 0)
        else:
            dist = gl.expand_dims(colf, 0) - gl.expand_dims(rowf, 1)
            x = x - slope2 * gl.abs(dist) - gl.expand_dims(lse2, 0)
    else:
        x = x - gl.expand_dims(lse2, 0)
    p = gl.exp2(x)
    if VAR & 2:
        pg_t = p * (1.0 - th * th)
        p_t = p.to(dtype)
    else:  # as the dense kernel: P in dtype after the mask
        p_t = p
    need = my_key0 + KEYS > seq_k
    if VAR & 1:
        # masked unless the whole block is visible: its last row's left edge at or before
        # the first key, its first row's right edge at or after the last key
        need = need | (m0 + BLOCK_M - 1 + diag - win_left > my_key0)
        need = need | (my_key0 + KEYS - 1 > m0 + diag + win_right)
    elif CAUSAL:
        need = need | (my_key0 + KEYS - 1 > m0 + diag)
    if VAR & 2:
        need = need | (m0 + BLOCK_M > seq_q)
    if need:
        keys = my_key0 + gl.arange(0, KEYS, layout=row_l)
        rows = m0 + gl.arange(0, BLOCK_M, layout=col_l)
        keep = gl.expand_dims(keys < seq_k, 1)
        if VAR & 1:  # visible when -right <= (i + o) - j <= left
            d = gl.expand_dims(rows + diag, 0) - gl.expand_dims(keys, 1)
            keep = keep & (d <= win_left) & (d >= -win_right)
        elif CAUSAL:
            keep = keep & (gl.expand_dims(keys, 1) <= gl.expand_dims(rows + diag, 0))
        if VAR & 2:
            keep = keep & gl.expand_dims(rows < seq_q, 0)
        p_t = gl.where(keep, p_t, gl.zeros_like(p_t))
        if VAR & 2:
            pg_t = gl.where(keep, pg_t, 0.0)
    if VAR & 2:
        return p_t, pg_t
    else:
        return p_t.to(dtype), p_t
