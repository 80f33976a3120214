"""The `@triton.jit` kernels of our FlashAttention-2: the tile helpers and the forward
here, the backward (preprocessing, dK/dV, dQ) in flash_kernels_bwd.py. Launched by
fa_bench.kernels.flash_attention, which documents the conventions (log2-domain scores,
lse2 = +inf for rows that see no key, bottom-right causal, a deterministic backward).

Names used throughout:
- a program *holds* one tile for its whole life and *streams* the other operand's tiles
  through a loop. The forward and dQ hold query rows and stream keys; dK/dV holds keys
  and streams query rows. The forward calls its tiles BLOCK_M (query rows, held) and
  BLOCK_N (keys, streamed), the backward kernels BLOCK_HELD and BLOCK_STREAMED
  (FlashConfig's bwd_block_n and bwd_block_m, see kernels/flash_config.py);
- EVEN_Q: seq_q is a multiple of this kernel's query tile, EVEN_K: seq_k is a multiple of
  its key tile (so those loads and stores need no row mask);
- MASK_D: head_dim is padded (HEAD_DIM < HEAD_DIM_PAD), so loads and stores mask the
  padding columns;
- DIAGONAL_OR_TAIL / ON_DIAGONAL: which of a kernel's two loops this is, the one over the
  blocks that need masks (causal diagonal, sequence tail) or the one over blocks that
  need none;
- WINDOW, SOFTCAP, ALIBI, VARLEN: issue 19's variants (flash_kernels_variants.py has
  their helpers and semantics); off, they compile to the dense code.
Shape assumptions are checked at compile time with `tl.static_assert`: tiles are powers
of two of at least 16 rows (`tl.dot`), HEAD_DIM_PAD a power of two >= 16 that holds
HEAD_DIM.

Triton decides when these functions are defined whether to interpret them, so
TRITON_INTERPRET must be set before this module (or triton) is first imported.
"""

import triton
import triton.language as tl

from fa_bench.kernels.flash_kernels_variants import (
    alibi_slope2,
    sequence,
    variant_scores,
    window_keep,
    window_ranges,
)

# `tl.dot` takes no operand dimension under 16: the smallest tile and head_dim pad.
MIN_DOT = tl.constexpr(16)


@triton.jit
def check_shapes(
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    BLOCK_A: tl.constexpr, BLOCK_B: tl.constexpr,
):  # fmt: skip
    """The kernels' shape assumptions, checked at compile time (emits no code): the padded
    head_dim holds HEAD_DIM and is a power of two >= 16, and so is each tile (`tl.dot`)."""
    tl.static_assert(HEAD_DIM <= HEAD_DIM_PAD, "HEAD_DIM_PAD must hold HEAD_DIM")
    tl.static_assert(
        HEAD_DIM_PAD >= MIN_DOT and (HEAD_DIM_PAD & (HEAD_DIM_PAD - 1)) == 0,
        "HEAD_DIM_PAD must be a power of two >= 16",
    )
    tl.static_assert(
        BLOCK_A >= MIN_DOT and (BLOCK_A & (BLOCK_A - 1)) == 0,
        "every tile must be a power of two >= 16 (tl.dot)",
    )
    tl.static_assert(
        BLOCK_B >= MIN_DOT and (BLOCK_B & (BLOCK_B - 1)) == 0,
        "every tile must be a power of two >= 16 (tl.dot)",
    )


@triton.jit
def load_rows(base, rows, stride, offs_d, n_rows, HEAD_DIM: tl.constexpr, MASK_ROWS, MASK_D):
    """Load a (len(rows), HEAD_DIM_PAD) tile; masks are constexpr so full tiles pay none.
    MASK_ROWS: rows past n_rows read as 0; MASK_D: columns past HEAD_DIM read as 0."""
    ptrs = base + rows[:, None] * stride + offs_d[None, :]
    if MASK_ROWS and MASK_D:
        return tl.load(
            ptrs, mask=(rows[:, None] < n_rows) & (offs_d[None, :] < HEAD_DIM), other=0.0
        )
    elif MASK_ROWS:
        return tl.load(ptrs, mask=rows[:, None] < n_rows, other=0.0)
    elif MASK_D:
        return tl.load(ptrs, mask=offs_d[None, :] < HEAD_DIM, other=0.0)
    else:
        return tl.load(ptrs)


@triton.jit
def store_rows(
    base, rows, stride, offs_d, n_rows, value, HEAD_DIM: tl.constexpr, MASK_ROWS, MASK_D
):
    """Store a tile; rows past n_rows (MASK_ROWS) and padding columns (MASK_D) are skipped."""
    ptrs = base + rows[:, None] * stride + offs_d[None, :]
    if MASK_ROWS and MASK_D:
        tl.store(ptrs, value, mask=(rows[:, None] < n_rows) & (offs_d[None, :] < HEAD_DIM))
    elif MASK_ROWS:
        tl.store(ptrs, value, mask=rows[:, None] < n_rows)
    elif MASK_D:
        tl.store(ptrs, value, mask=offs_d[None, :] < HEAD_DIM)
    else:
        tl.store(ptrs, value)


@triton.jit
def key_ranges(
    m0, seq_k, causal_off,
    BLOCK_HELD: tl.constexpr, BLOCK_STREAMED: tl.constexpr, CAUSAL: tl.constexpr,
):  # fmt: skip
    """For the held query rows [m0, m0 + BLOCK_HELD), streaming BLOCK_STREAMED keys per
    step: keys [0, n_full) are seen by every row and need no mask; [n_full, n_end) need the
    causal or tail mask; keys past n_end are skipped (fully masked blocks cost nothing)."""
    n_even = (seq_k // BLOCK_STREAMED) * BLOCK_STREAMED
    if CAUSAL:
        n_full = tl.minimum(
            (tl.maximum(m0 + causal_off + 1, 0) // BLOCK_STREAMED) * BLOCK_STREAMED, n_even
        )
        n_end = tl.maximum(tl.minimum(m0 + BLOCK_HELD + causal_off, seq_k), 0)
    else:
        n_full = n_even
        n_end = seq_k
    return n_full, n_end


@triton.jit
def _fwd_inner(
    # the online-softmax state of the held query rows, and the rows themselves
    acc, l_i, m_i, q,
    # K/V: descriptors (TMA path) or base pointers of this (batch, kv head)
    k_desc, v_desc, k_base, v_base, stride_ks, stride_vs,
    # the keys [lo, hi) to stream; row/column offsets; sizes and the log2-domain scale
    lo, hi, offs_m, offs_d, seq_k, causal_off, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
    # DIAGONAL_OR_TAIL: this loop covers the diagonal / key tail blocks; the other loop
    # only blocks that every row of the tile sees fully, so it pays no mask at all.
    DIAGONAL_OR_TAIL: tl.constexpr, CAUSAL: tl.constexpr, MASK_D: tl.constexpr,
    USE_TMA: tl.constexpr, WARP_SPECIALIZE: tl.constexpr, DOT_PREC: tl.constexpr,
    # the variants (flash_kernels_variants.py): runtime values, None when off
    win_left=None, win_right=None, softcap2=None, slope2=None,
    WINDOW: tl.constexpr = False, SOFTCAP: tl.constexpr = False, ALIBI: tl.constexpr = False,
    # WINDOW, unmasked loop: its first blocks, below left_full, are the window's left edge
    # and take the window mask (see _fwd_variant_loops)
    left_full=None,
):  # fmt: skip
    offs_n = tl.arange(0, BLOCK_N)
    for start_n in tl.range(lo, hi, BLOCK_N, warp_specialize=WARP_SPECIALIZE):
        cols = start_n + offs_n
        if USE_TMA:
            k = k_desc.load([start_n, 0])
        else:
            k = load_rows(
                k_base, cols, stride_ks, offs_d, seq_k, HEAD_DIM, DIAGONAL_OR_TAIL, MASK_D
            )
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PREC)
        if SOFTCAP or ALIBI:
            s2, _ = variant_scores(
                qk, qk_scale, softcap2, slope2, offs_m, cols, causal_off, SOFTCAP, ALIBI, False
            )
        elif WINDOW:
            s2 = qk * qk_scale
        if DIAGONAL_OR_TAIL:
            keep = cols[None, :] < seq_k
            if WINDOW:
                keep = keep & window_keep(offs_m, cols, causal_off, win_left, win_right, False)
            elif CAUSAL:
                keep = keep & (cols[None, :] <= offs_m[:, None] + causal_off)
            if SOFTCAP or ALIBI or WINDOW:
                qk = tl.where(keep, s2, float("-inf"))
            else:
                qk = tl.where(keep, qk * qk_scale, float("-inf"))
            m_ij = tl.maximum(m_i, tl.max(qk, 1))
            # a row with no visible key so far keeps m = -inf: subtract 0 instead of -inf
            m_safe = tl.where(m_ij == float("-inf"), 0.0, m_ij)
            p = tl.math.exp2(qk - m_safe[:, None])
            alpha = tl.math.exp2(m_i - m_safe)
        elif WINDOW:
            # a branch, not a loop of its own: a third loop spilled registers on sm_90
            if start_n < left_full:
                keep = window_keep(offs_m, cols, causal_off, win_left, win_right, False)
                s2 = tl.where(keep, s2, float("-inf"))
            m_ij = tl.maximum(m_i, tl.max(s2, 1))
            m_safe = tl.where(m_ij == float("-inf"), 0.0, m_ij)
            p = tl.math.exp2(s2 - m_safe[:, None])
            alpha = tl.math.exp2(m_i - m_safe)
        elif SOFTCAP or ALIBI:
            m_ij = tl.maximum(m_i, tl.max(s2, 1))
            p = tl.math.exp2(s2 - m_ij[:, None])
            alpha = tl.math.exp2(m_i - m_ij)
        else:
            m_ij = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            p = tl.math.exp2(qk * qk_scale - m_ij[:, None])
            alpha = tl.math.exp2(m_i - m_ij)
        l_ij = tl.sum(p, 1)
        acc = acc * alpha[:, None]
        if USE_TMA:
            v = v_desc.load([start_n, 0])
        else:
            v = load_rows(
                v_base, cols, stride_vs, offs_d, seq_k, HEAD_DIM, DIAGONAL_OR_TAIL, MASK_D
            )
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PREC)
        l_i = l_i * alpha + l_ij
        m_i = m_ij
    return acc, l_i, m_i


@triton.jit
def _fwd_variant_loops(
    acc, l_i, m_i, q, k_desc, v_desc, k_base, v_base, stride_ks, stride_vs,
    m0, offs_m, offs_d, seq_k, causal_off, qk_scale,
    win_left, win_right, softcap2, slope2,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, MASK_D: tl.constexpr, USE_TMA: tl.constexpr,
    WARP_SPECIALIZE: tl.constexpr, DOT_PREC: tl.constexpr,
    WINDOW: tl.constexpr, SOFTCAP: tl.constexpr, ALIBI: tl.constexpr,
):  # fmt: skip
    """The forward's key loops with a window, softcap or ALiBi: first the blocks every row
    sees whole (no mask), then the masked ones. A window streams only the keys some row
    sees ([lo, hi) from window_ranges): [lo, hi_full) in the first loop, whose left-edge
    blocks below lo_full take the window mask in a branch, then the right edge
    [hi_full, hi) masked. Without a window, the dense loops (causal or not) with the
    softcap / ALiBi scores."""
    if WINDOW:
        lo, lo_full, hi_full, hi = window_ranges(
            m0, seq_k, causal_off - win_left, causal_off + win_right, BLOCK_M, BLOCK_N
        )
        # the first loop loads without a row mask: only whole blocks below hi (<= seq_k)
        hi_full = tl.maximum(tl.minimum(hi_full, (hi // BLOCK_N) * BLOCK_N), lo)
    else:
        lo = 0
        lo_full = None
        hi_full, hi = key_ranges(m0, seq_k, causal_off, BLOCK_M, BLOCK_N, CAUSAL)
    acc, l_i, m_i = _fwd_inner(
        acc, l_i, m_i, q, k_desc, v_desc, k_base, v_base, stride_ks, stride_vs,
        lo, hi_full, offs_m, offs_d, seq_k, causal_off, qk_scale,
        HEAD_DIM, BLOCK_N, False, CAUSAL, MASK_D, USE_TMA, WARP_SPECIALIZE, DOT_PREC,
        win_left, win_right, softcap2, slope2, WINDOW, SOFTCAP, ALIBI, lo_full,
    )  # fmt: skip
    acc, l_i, m_i = _fwd_inner(
        acc, l_i, m_i, q, k_desc, v_desc, k_base, v_base, stride_ks, stride_vs,
        hi_full, hi, offs_m, offs_d, seq_k, causal_off, qk_scale,
        HEAD_DIM, BLOCK_N, True, CAUSAL, MASK_D, USE_TMA, False, DOT_PREC,
        win_left, win_right, softcap2, slope2, WINDOW, SOFTCAP, ALIBI,
    )  # fmt: skip
    return acc, l_i, m_i


@triton.jit
def _fwd_kernel(
    # tensors: inputs, output, and lse2 (B, Hq, Sq) fp32 saved for the backward
    Q, K, V, Out, LSE,
    # strides in elements (batch, head, seq); the last dimension's stride is 1
    stride_qb, stride_qh, stride_qs, stride_kb, stride_kh, stride_ks,
    stride_vb, stride_vh, stride_vs, stride_ob, stride_oh, stride_os,
    # sizes (group = heads_q // heads_kv) and scale · log2(e); VARLEN: seq_q and seq_k
    # are the packed totals (the tensors are (1, H, T, D) views)
    heads_q, group, seq_q, seq_k, qk_scale,
    # constexpr: tile shapes and HEAD_DIM_PAD size register tiles (must be compile-time);
    # the flags select code paths so that full tiles carry no masks.
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, EVEN_Q: tl.constexpr,
    USE_TMA: tl.constexpr, WARP_SPECIALIZE: tl.constexpr, DOT_PREC: tl.constexpr,
    # the variants (flash_kernels_variants.py), None when off so that a dense launch
    # compiles to the same code: window bounds, softcap · log2(e), ALiBi slopes (fp32,
    # batch stride 0 for per-head slopes), cumulative lengths of a packed batch
    win_left=None, win_right=None, softcap2=None, Slopes=None, stride_slope_b=None,
    CuQ=None, CuK=None,
    WINDOW: tl.constexpr = False, SOFTCAP: tl.constexpr = False, ALIBI: tl.constexpr = False,
    VARLEN: tl.constexpr = False,
):  # fmt: skip
    """One program: BLOCK_M query rows of one (batch, q head); streams the visible keys.
    VARLEN: the batch index is the packed sequence's; programs past its end return."""
    check_shapes(HEAD_DIM, HEAD_DIM_PAD, BLOCK_M, BLOCK_N)
    MASK_D: tl.constexpr = HEAD_DIM != HEAD_DIM_PAD
    # Causal: launch the longest row blocks (the last ones) first for a balanced tail.
    if CAUSAL:
        pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    else:
        pid_m = tl.program_id(0)
    off_bh = tl.program_id(1)
    off_b = (off_bh // heads_q).to(tl.int64)
    off_h = (off_bh % heads_q).to(tl.int64)
    off_hk = off_h // group
    if VARLEN:
        lse_row0 = off_h * seq_q  # lse2 is (H, T): seq_q is the total here
        q_start, seq_q = sequence(CuQ, off_b)
        k_start, seq_k = sequence(CuK, off_b)
        if pid_m * BLOCK_M >= seq_q:
            return
        lse_row0 += q_start
        q_base = Q + q_start.to(tl.int64) * stride_qs + off_h * stride_qh
        k_base = K + k_start.to(tl.int64) * stride_ks + off_hk * stride_kh
        v_base = V + k_start.to(tl.int64) * stride_vs + off_hk * stride_vh
        o_base = Out + q_start.to(tl.int64) * stride_os + off_h * stride_oh
    else:
        q_base = Q + off_b * stride_qb + off_h * stride_qh
        k_base = K + off_b * stride_kb + off_hk * stride_kh
        v_base = V + off_b * stride_vb + off_hk * stride_vh
        o_base = Out + off_b * stride_ob + off_h * stride_oh

    m0 = pid_m * BLOCK_M
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    if USE_TMA:
        # Per-(batch, head) descriptors: bounds are this head's, tails read as zeros.
        q_desc = tl.make_tensor_descriptor(
            q_base, [seq_q, HEAD_DIM], [stride_qs, 1], [BLOCK_M, HEAD_DIM_PAD]
        )
        k_desc = tl.make_tensor_descriptor(
            k_base, [seq_k, HEAD_DIM], [stride_ks, 1], [BLOCK_N, HEAD_DIM_PAD]
        )
        v_desc = tl.make_tensor_descriptor(
            v_base, [seq_k, HEAD_DIM], [stride_vs, 1], [BLOCK_N, HEAD_DIM_PAD]
        )
        q = q_desc.load([m0, 0])
    else:
        k_desc = None
        v_desc = None
        q = load_rows(q_base, offs_m, stride_qs, offs_d, seq_q, HEAD_DIM, not EVEN_Q, MASK_D)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], dtype=tl.float32)

    causal_off = seq_k - seq_q
    if WINDOW or SOFTCAP or ALIBI:
        acc, l_i, m_i = _fwd_variant_loops(
            acc, l_i, m_i, q, k_desc, v_desc, k_base, v_base, stride_ks, stride_vs,
            m0, offs_m, offs_d, seq_k, causal_off, qk_scale,
            win_left, win_right, softcap2,
            alibi_slope2(Slopes, stride_slope_b, off_b, off_h, ALIBI),
            HEAD_DIM, BLOCK_M, BLOCK_N, CAUSAL, MASK_D, USE_TMA, WARP_SPECIALIZE, DOT_PREC,
            WINDOW, SOFTCAP, ALIBI,
        )  # fmt: skip
    else:
        n_full, n_end = key_ranges(m0, seq_k, causal_off, BLOCK_M, BLOCK_N, CAUSAL)
        acc, l_i, m_i = _fwd_inner(
            acc, l_i, m_i, q, k_desc, v_desc, k_base, v_base, stride_ks, stride_vs,
            0, n_full, offs_m, offs_d, seq_k, causal_off, qk_scale,
            HEAD_DIM, BLOCK_N, False, CAUSAL, MASK_D, USE_TMA, WARP_SPECIALIZE, DOT_PREC,
        )  # fmt: skip
        # warp specialization only on the long unmasked loop (see FlashConfig.warp_specialize)
        acc, l_i, m_i = _fwd_inner(
            acc, l_i, m_i, q, k_desc, v_desc, k_base, v_base, stride_ks, stride_vs,
            n_full, n_end, offs_m, offs_d, seq_k, causal_off, qk_scale,
            HEAD_DIM, BLOCK_N, True, CAUSAL, MASK_D, USE_TMA, False, DOT_PREC,
        )  # fmt: skip

    # Rows with no visible key: output 0, lse2 = +inf (see the module docstring).
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    acc = acc / l_safe[:, None]
    lse2 = tl.where(empty, float("inf"), m_i + tl.math.log2(l_safe))
    if VARLEN:
        lse_ptrs = LSE + lse_row0 + offs_m
    else:
        lse_ptrs = LSE + off_bh.to(tl.int64) * seq_q + offs_m
    if EVEN_Q:
        tl.store(lse_ptrs, lse2)
    else:
        tl.store(lse_ptrs, lse2, mask=offs_m < seq_q)
    out = acc.to(Out.dtype.element_ty)
    if USE_TMA:
        o_desc = tl.make_tensor_descriptor(
            o_base, [seq_q, HEAD_DIM], [stride_os, 1], [BLOCK_M, HEAD_DIM_PAD]
        )
        o_desc.store([m0, 0], out)
    else:
        store_rows(o_base, offs_m, stride_os, offs_d, seq_q, out, HEAD_DIM, not EVEN_Q, MASK_D)
