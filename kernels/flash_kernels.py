"""The `@triton.jit` kernels of our FlashAttention-2, in the order they run: forward,
backward preprocessing (delta = rowsum(dO·O)), dK/dV, dQ. Launched by
fa_bench.kernels.flash_attention, which documents the conventions (log2-domain scores,
lse2 = +inf for rows that see no key, bottom-right causal, a deterministic backward).

Triton decides when these functions are defined whether to interpret them, so
TRITON_INTERPRET must be set before this module is first imported.
"""

import triton
import triton.language as tl


@triton.jit
def _load_rows(base, rows, stride, offs_d, n_rows, HEAD_DIM: tl.constexpr, MASK_ROWS, MASK_D):
    """Load a (len(rows), HEAD_DIM_PAD) tile; masks are constexpr so full tiles pay none."""
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
def _store_rows(
    base, rows, stride, offs_d, n_rows, value, HEAD_DIM: tl.constexpr, MASK_ROWS, MASK_D
):
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
def _key_ranges(
    m0, seq_k, causal_off, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr
):
    """For the query rows [m0, m0 + BLOCK_M): keys [0, n_full) are seen by every row and
    need no mask; [n_full, n_end) need the causal or tail mask; keys past n_end are
    skipped (fully masked blocks cost nothing)."""
    n_even = (seq_k // BLOCK_N) * BLOCK_N
    if CAUSAL:
        n_full = tl.minimum((tl.maximum(m0 + causal_off + 1, 0) // BLOCK_N) * BLOCK_N, n_even)
        n_end = tl.maximum(tl.minimum(m0 + BLOCK_M + causal_off, seq_k), 0)
    else:
        n_full = n_even
        n_end = seq_k
    return n_full, n_end


@triton.jit
def _fwd_inner(
    acc, l_i, m_i, q,
    # K/V: descriptors (TMA path) or base pointers of this (batch, kv head)
    k_desc, v_desc, k_base, v_base, stride_ks, stride_vs,
    lo, hi, offs_m, offs_d, seq_k, causal_off, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
    # MASKED: this loop covers the diagonal / key tail blocks; the other loop only blocks
    # that every row of the tile sees fully, so it pays no mask at all.
    MASKED: tl.constexpr, CAUSAL: tl.constexpr, MASK_D: tl.constexpr,
    USE_TMA: tl.constexpr, WARP_SPECIALIZE: tl.constexpr, DOT_PREC: tl.constexpr,
):  # fmt: skip
    offs_n = tl.arange(0, BLOCK_N)
    for start_n in tl.range(lo, hi, BLOCK_N, warp_specialize=WARP_SPECIALIZE):
        cols = start_n + offs_n
        if USE_TMA:
            k = k_desc.load([start_n, 0])
        else:
            k = _load_rows(k_base, cols, stride_ks, offs_d, seq_k, HEAD_DIM, MASKED, MASK_D)
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PREC)
        if MASKED:
            keep = cols[None, :] < seq_k
            if CAUSAL:
                keep = keep & (cols[None, :] <= offs_m[:, None] + causal_off)
            qk = tl.where(keep, qk * qk_scale, float("-inf"))
            m_ij = tl.maximum(m_i, tl.max(qk, 1))
            # a row with no visible key so far keeps m = -inf: subtract 0 instead of -inf
            m_safe = tl.where(m_ij == float("-inf"), 0.0, m_ij)
            p = tl.math.exp2(qk - m_safe[:, None])
            alpha = tl.math.exp2(m_i - m_safe)
        else:
            m_ij = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            p = tl.math.exp2(qk * qk_scale - m_ij[:, None])
            alpha = tl.math.exp2(m_i - m_ij)
        l_ij = tl.sum(p, 1)
        acc = acc * alpha[:, None]
        if USE_TMA:
            v = v_desc.load([start_n, 0])
        else:
            v = _load_rows(v_base, cols, stride_vs, offs_d, seq_k, HEAD_DIM, MASKED, MASK_D)
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PREC)
        l_i = l_i * alpha + l_ij
        m_i = m_ij
    return acc, l_i, m_i


@triton.jit
def _fwd_kernel(
    Q, K, V, Out, LSE,
    # strides in elements (batch, head, seq); the last dimension's stride is 1
    stride_qb, stride_qh, stride_qs, stride_kb, stride_kh, stride_ks,
    stride_vb, stride_vh, stride_vs, stride_ob, stride_oh, stride_os,
    heads_q, group, seq_q, seq_k, qk_scale,
    # constexpr: tile shapes and HEAD_DIM_PAD size register tiles (must be compile-time);
    # the flags select code paths so that full tiles carry no masks.
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, EVEN_M: tl.constexpr,
    USE_TMA: tl.constexpr, WARP_SPECIALIZE: tl.constexpr, DOT_PREC: tl.constexpr,
):  # fmt: skip
    tl.static_assert(HEAD_DIM <= HEAD_DIM_PAD)
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
        q = _load_rows(q_base, offs_m, stride_qs, offs_d, seq_q, HEAD_DIM, not EVEN_M, MASK_D)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], dtype=tl.float32)

    causal_off = seq_k - seq_q
    n_full, n_end = _key_ranges(m0, seq_k, causal_off, BLOCK_M, BLOCK_N, CAUSAL)
    acc, l_i, m_i = _fwd_inner(
        acc, l_i, m_i, q, k_desc, v_desc, k_base, v_base, stride_ks, stride_vs,
        0, n_full, offs_m, offs_d, seq_k, causal_off, qk_scale,
        HEAD_DIM, BLOCK_N, False, CAUSAL, MASK_D, USE_TMA, WARP_SPECIALIZE, DOT_PREC,
    )  # fmt: skip
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
    lse_ptrs = LSE + off_bh.to(tl.int64) * seq_q + offs_m
    if EVEN_M:
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
        _store_rows(o_base, offs_m, stride_os, offs_d, seq_q, out, HEAD_DIM, not EVEN_M, MASK_D)


@triton.jit
def _bwd_preprocess_kernel(
    Out, DO, DELTA,
    stride_ob, stride_oh, stride_os, stride_dob, stride_doh, stride_dos,
    heads_q, seq_q,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, BLOCK_M: tl.constexpr,
):  # fmt: skip
    """delta[row] = sum_d dO[row, d] · O[row, d] in fp32."""
    pid_m = tl.program_id(0)
    off_bh = tl.program_id(1)
    off_b = (off_bh // heads_q).to(tl.int64)
    off_h = (off_bh % heads_q).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    o_base = Out + off_b * stride_ob + off_h * stride_oh
    do_base = DO + off_b * stride_dob + off_h * stride_doh
    o = _load_rows(o_base, offs_m, stride_os, offs_d, seq_q, HEAD_DIM, True, True)
    do = _load_rows(do_base, offs_m, stride_dos, offs_d, seq_q, HEAD_DIM, True, True)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)
    tl.store(DELTA + off_bh.to(tl.int64) * seq_q + offs_m, delta, mask=offs_m < seq_q)


@triton.jit
def _bwd_dkdv_inner(
    dk, dv, k, v,
    q_base, do_base, lse_base, delta_base, stride_qs, stride_dos,
    lo, hi, offs_n, offs_d, seq_q, causal_off, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
    MASKED: tl.constexpr, EVEN_M: tl.constexpr, MASK_D: tl.constexpr, DOT_PREC: tl.constexpr,
):  # fmt: skip
    for start_m in range(lo, hi, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        q = _load_rows(q_base, offs_m, stride_qs, offs_d, seq_q, HEAD_DIM, not EVEN_M, MASK_D)
        do = _load_rows(do_base, offs_m, stride_dos, offs_d, seq_q, HEAD_DIM, not EVEN_M, MASK_D)
        if EVEN_M:
            lse2 = tl.load(lse_base + offs_m)
            delta = tl.load(delta_base + offs_m)
        else:
            # rows past the end get lse2 = +inf, hence p = 0
            lse2 = tl.load(lse_base + offs_m, mask=offs_m < seq_q, other=float("inf"))
            delta = tl.load(delta_base + offs_m, mask=offs_m < seq_q, other=0.0)
        qk_t = tl.dot(k, tl.trans(q), input_precision=DOT_PREC)  # (BLOCK_N, BLOCK_M)
        p_t = tl.math.exp2(qk_t * qk_scale - lse2[None, :])
        if MASKED:
            p_t = tl.where(offs_n[:, None] <= offs_m[None, :] + causal_off, p_t, 0.0)
        dv = tl.dot(p_t.to(do.dtype), do, dv, input_precision=DOT_PREC)
        dp_t = tl.dot(v, tl.trans(do), input_precision=DOT_PREC)
        ds_t = p_t * (dp_t - delta[None, :])
        dk = tl.dot(ds_t.to(q.dtype), q, dk, input_precision=DOT_PREC)
    return dk, dv


@triton.jit
def _bwd_dkdv_kernel(
    Q, K, V, DO, DK, DV, LSE, DELTA,
    stride_qb, stride_qh, stride_qs, stride_kb, stride_kh, stride_ks,
    stride_vb, stride_vh, stride_vs, stride_dob, stride_doh, stride_dos,
    stride_dkb, stride_dkh, stride_dks, stride_dvb, stride_dvh, stride_dvs,
    heads_q, heads_kv, group, seq_q, seq_k, qk_scale, sm_scale,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, EVEN_M: tl.constexpr, EVEN_N: tl.constexpr, DOT_PREC: tl.constexpr,
):  # fmt: skip
    """One program: BLOCK_N keys of one (batch, kv head); loops over the group's q heads."""
    MASK_D: tl.constexpr = HEAD_DIM != HEAD_DIM_PAD
    pid_n = tl.program_id(0)
    off_bh = tl.program_id(1)
    off_b = (off_bh // heads_kv).to(tl.int64)
    off_hk = (off_bh % heads_kv).to(tl.int64)
    n0 = pid_n * BLOCK_N
    offs_n = n0 + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    k_base = K + off_b * stride_kb + off_hk * stride_kh
    v_base = V + off_b * stride_vb + off_hk * stride_vh
    # Keys past the end load as 0; their dK/dV rows are computed but never stored.
    k = _load_rows(k_base, offs_n, stride_ks, offs_d, seq_k, HEAD_DIM, not EVEN_N, MASK_D)
    v = _load_rows(v_base, offs_n, stride_vs, offs_d, seq_k, HEAD_DIM, not EVEN_N, MASK_D)
    dk = tl.zeros([BLOCK_N, HEAD_DIM_PAD], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM_PAD], dtype=tl.float32)

    causal_off = seq_k - seq_q
    m_tiles_end = tl.cdiv(seq_q, BLOCK_M) * BLOCK_M
    if CAUSAL:
        # rows < n0 - off see none of these keys; rows >= n0 + BLOCK_N - 1 - off see all
        m_lo = (tl.maximum(n0 - causal_off, 0) // BLOCK_M) * BLOCK_M
        m_mid = tl.cdiv(tl.maximum(n0 + BLOCK_N - 1 - causal_off, 0), BLOCK_M) * BLOCK_M
        m_mid = tl.minimum(m_mid, m_tiles_end)
    else:
        m_lo = 0
        m_mid = 0
    for g in range(group):
        off_h = off_hk * group + g
        q_base = Q + off_b * stride_qb + off_h * stride_qh
        do_base = DO + off_b * stride_dob + off_h * stride_doh
        row0 = (off_b * heads_q + off_h) * seq_q
        dk, dv = _bwd_dkdv_inner(
            dk, dv, k, v, q_base, do_base, LSE + row0, DELTA + row0, stride_qs, stride_dos,
            m_lo, m_mid, offs_n, offs_d, seq_q, causal_off, qk_scale,
            HEAD_DIM, BLOCK_M, True, EVEN_M, MASK_D, DOT_PREC,
        )  # fmt: skip
        dk, dv = _bwd_dkdv_inner(
            dk, dv, k, v, q_base, do_base, LSE + row0, DELTA + row0, stride_qs, stride_dos,
            m_mid, seq_q, offs_n, offs_d, seq_q, causal_off, qk_scale,
            HEAD_DIM, BLOCK_M, False, EVEN_M, MASK_D, DOT_PREC,
        )  # fmt: skip
    dk = dk * sm_scale
    dk_base = DK + off_b * stride_dkb + off_hk * stride_dkh
    dv_base = DV + off_b * stride_dvb + off_hk * stride_dvh
    _store_rows(
        dk_base, offs_n, stride_dks, offs_d, seq_k, dk.to(DK.dtype.element_ty),
        HEAD_DIM, not EVEN_N, MASK_D,
    )  # fmt: skip
    _store_rows(
        dv_base, offs_n, stride_dvs, offs_d, seq_k, dv.to(DV.dtype.element_ty),
        HEAD_DIM, not EVEN_N, MASK_D,
    )  # fmt: skip


@triton.jit
def _bwd_dq_inner(
    dq, q, do, lse2, delta, k_base, v_base, stride_ks, stride_vs,
    lo, hi, offs_m, offs_d, seq_k, causal_off, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
    MASKED: tl.constexpr, CAUSAL: tl.constexpr, MASK_D: tl.constexpr, DOT_PREC: tl.constexpr,
):  # fmt: skip
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        # Keys past the end load as k = v = 0: they add ds · 0 to dQ, so no score mask.
        k = _load_rows(k_base, offs_n, stride_ks, offs_d, seq_k, HEAD_DIM, MASKED, MASK_D)
        v = _load_rows(v_base, offs_n, stride_vs, offs_d, seq_k, HEAD_DIM, MASKED, MASK_D)
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PREC)
        p = tl.math.exp2(qk * qk_scale - lse2[:, None])
        if MASKED and CAUSAL:
            p = tl.where(offs_n[None, :] <= offs_m[:, None] + causal_off, p, 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=DOT_PREC)
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=DOT_PREC)
    return dq


@triton.jit
def _bwd_dq_kernel(
    Q, K, V, DO, DQ, LSE, DELTA,
    stride_qb, stride_qh, stride_qs, stride_kb, stride_kh, stride_ks,
    stride_vb, stride_vh, stride_vs, stride_dob, stride_doh, stride_dos,
    stride_dqb, stride_dqh, stride_dqs,
    heads_q, group, seq_q, seq_k, qk_scale, sm_scale,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, EVEN_M: tl.constexpr, DOT_PREC: tl.constexpr,
):  # fmt: skip
    """One program: BLOCK_M query rows of one (batch, q head); streams the visible keys."""
    MASK_D: tl.constexpr = HEAD_DIM != HEAD_DIM_PAD
    if CAUSAL:
        pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    else:
        pid_m = tl.program_id(0)
    off_bh = tl.program_id(1)
    off_b = (off_bh // heads_q).to(tl.int64)
    off_h = (off_bh % heads_q).to(tl.int64)
    off_hk = off_h // group
    m0 = pid_m * BLOCK_M
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    q_base = Q + off_b * stride_qb + off_h * stride_qh
    do_base = DO + off_b * stride_dob + off_h * stride_doh
    k_base = K + off_b * stride_kb + off_hk * stride_kh
    v_base = V + off_b * stride_vb + off_hk * stride_vh
    q = _load_rows(q_base, offs_m, stride_qs, offs_d, seq_q, HEAD_DIM, not EVEN_M, MASK_D)
    do = _load_rows(do_base, offs_m, stride_dos, offs_d, seq_q, HEAD_DIM, not EVEN_M, MASK_D)
    row0 = off_bh.to(tl.int64) * seq_q
    if EVEN_M:
        lse2 = tl.load(LSE + row0 + offs_m)
        delta = tl.load(DELTA + row0 + offs_m)
    else:
        lse2 = tl.load(LSE + row0 + offs_m, mask=offs_m < seq_q, other=float("inf"))
        delta = tl.load(DELTA + row0 + offs_m, mask=offs_m < seq_q, other=0.0)
    dq = tl.zeros([BLOCK_M, HEAD_DIM_PAD], dtype=tl.float32)

    causal_off = seq_k - seq_q
    n_full, n_end = _key_ranges(m0, seq_k, causal_off, BLOCK_M, BLOCK_N, CAUSAL)
    dq = _bwd_dq_inner(
        dq, q, do, lse2, delta, k_base, v_base, stride_ks, stride_vs,
        0, n_full, offs_m, offs_d, seq_k, causal_off, qk_scale,
        HEAD_DIM, BLOCK_N, False, CAUSAL, MASK_D, DOT_PREC,
    )  # fmt: skip
    dq = _bwd_dq_inner(
        dq, q, do, lse2, delta, k_base, v_base, stride_ks, stride_vs,
        n_full, n_end, offs_m, offs_d, seq_k, causal_off, qk_scale,
        HEAD_DIM, BLOCK_N, True, CAUSAL, MASK_D, DOT_PREC,
    )  # fmt: skip
    dq = dq * sm_scale
    dq_base = DQ + off_b * stride_dqb + off_h * stride_dqh
    _store_rows(
        dq_base, offs_m, stride_dqs, offs_d, seq_q, dq.to(DQ.dtype.element_ty),
        HEAD_DIM, not EVEN_M, MASK_D,
    )  # fmt: skip
