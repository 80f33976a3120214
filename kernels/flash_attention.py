"""FlashAttention-2 forward and backward in Triton, with GQA, bottom-right causal masking,
arbitrary sequence lengths, head dims that are multiples of 8 up to 256, and any strides
whose last one is 1.

Reads top-down: the `@triton.jit` kernels (forward, backward preprocessing, dK/dV, dQ),
then the launchers, then the `torch.autograd.Function`, then `flash_attention`.

Conventions inside the kernels:
- scores live in the log2 domain: s2 = (q·k) · scale · log2(e), so exp2 replaces exp;
- the forward saves lse2 = log2(sum_j exp2(s2_j)) per query row; a row that sees no key
  (causal with seqlen_q > seqlen_k) gets lse2 = +inf, so the backward's
  p = exp2(s2 - lse2) is 0 there and its gradients are 0 with no special case;
- causal is bottom-right: query i sees key j iff j <= i + (seqlen_k - seqlen_q);
- the backward is deterministic: dK/dV programs own one KV block and loop over every query
  head of the GQA group; dQ is a separate kernel; no atomics anywhere.
"""

from __future__ import annotations

import functools
import math
import os

import torch
import triton
import triton.language as tl

from fa_bench.kernels.flash_config import FlashConfig, select_config

_LOG2E = 1.4426950408889634
_LN2 = 0.6931471805599453
_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


# ---------------------------------------------------------------------------------------
# Kernels
# ---------------------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------------------
# Launchers
# ---------------------------------------------------------------------------------------


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def _shapes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> str:
    return f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"


def _validate(q: object, k: object, v: object, scale: float | None) -> None:
    """Raise TypeError/ValueError (with the shapes) for inputs the kernels cannot take."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    shapes = _shapes(q, k, v)
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"q, k, v must be 4-D (batch, heads, seqlen, head_dim); got {shapes}")
    if q.dtype not in _DTYPES:
        raise TypeError(f"unsupported dtype {q.dtype} (fp16, bf16, fp32); {shapes}")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"q, k, v must share a dtype, got {q.dtype}/{k.dtype}/{v.dtype}")
    batch, heads_q, seq_q, head_dim = q.shape
    _, heads_kv, seq_k, _ = k.shape
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape; got {shapes}")
    if k.shape[0] != batch or k.shape[3] != head_dim:
        raise ValueError(f"q and k/v must agree on batch and head_dim; got {shapes}")
    if min(batch, heads_q, seq_q, heads_kv, seq_k, head_dim) < 1:
        raise ValueError(f"every dimension must be >= 1; got {shapes}")
    if heads_q % heads_kv:
        raise ValueError(
            f"heads_q ({heads_q}) must be a multiple of heads_kv ({heads_kv}); {shapes}"
        )
    if head_dim % 8 or head_dim > 256:
        raise ValueError(f"head_dim must be a multiple of 8 and <= 256, got {head_dim}; {shapes}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}/{k.device}/{v.device}")
    if q.device.type == "cpu" and not _interpreting():
        raise ValueError(
            f"CPU tensors need the Triton interpreter (TRITON_INTERPRET=1 before import); {shapes}"
        )
    if q.device.type not in ("cpu", "cuda"):
        raise ValueError(f"unsupported device {q.device}; {shapes}")
    if scale is not None and not (isinstance(scale, (int, float)) and scale > 0):
        raise ValueError(f"scale must be a positive number, got {scale!r}")


def _last_dim_unit(t: torch.Tensor) -> torch.Tensor:
    """Any strides work as long as the last one is 1; otherwise copy."""
    return t if t.stride(-1) == 1 else t.contiguous()


def _strides(t: torch.Tensor) -> tuple[int, int, int]:
    return t.stride(0), t.stride(1), t.stride(2)


def _pad_dim(head_dim: int) -> int:
    return max(16, triton.next_power_of_2(head_dim))


def _dot_precision(dtype: torch.dtype) -> str:
    # fp32 inputs: exact fp32 products (tf32 would miss the float64 accuracy bound).
    return "ieee" if dtype == torch.float32 else "tf32"


@functools.cache
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def _resolve_config(
    config: FlashConfig | None, q: torch.Tensor, seqlen_k: int, causal: bool, mode: str
) -> FlashConfig:
    if config is not None:
        if not isinstance(config, FlashConfig):
            raise TypeError(f"config must be a FlashConfig, got {type(config).__name__}")
        return config
    # The tuning cache (`fa-bench sweep --save-best`) when it has this key, else the
    # heuristic; the cache index is re-read only when the file changes.
    seqlen = max(q.shape[2], seqlen_k)
    return select_config(q.shape[-1], q.dtype, causal, q.device, seqlen, mode)[0]


_ALLOCATOR_SET = False


def _ensure_tma_allocator() -> None:
    """Device-side descriptors need global scratch; Triton asks this allocator for it."""
    global _ALLOCATOR_SET
    if not _ALLOCATOR_SET:

        def alloc(size: int, alignment: int, stream: int | None) -> torch.Tensor:
            return torch.empty(size, dtype=torch.int8, device="cuda")

        triton.set_allocator(alloc)
        _ALLOCATOR_SET = True


def _tma_ok(*tensors: torch.Tensor) -> bool:
    """TMA needs sm_90+, 16-byte aligned bases and 16-byte multiple strides."""
    if _interpreting() or tensors[0].device.type != "cuda":
        return False
    if _capability(tensors[0].device.index or 0)[0] < 9:
        return False
    for t in tensors:
        size = t.element_size()
        if t.data_ptr() % 16 or any((s * size) % 16 for s in _strides(t)):
            return False
    return True


def _forward(q, k, v, causal: bool, scale: float, cfg: FlashConfig):
    batch, heads_q, seq_q, head_dim = q.shape
    heads_kv, seq_k = k.shape[1], k.shape[2]
    o = torch.empty_like(q)  # keeps q's layout: a (B, S, H, D) view in gives one out
    lse2 = torch.empty((batch, heads_q, seq_q), device=q.device, dtype=torch.float32)
    use_tma = cfg.use_tma and _tma_ok(q, k, v, o)
    if use_tma:
        _ensure_tma_allocator()
    grid = (triton.cdiv(seq_q, cfg.block_m), batch * heads_q)
    _fwd_kernel[grid](
        q, k, v, o, lse2,
        *_strides(q), *_strides(k), *_strides(v), *_strides(o),
        heads_q, heads_q // heads_kv, seq_q, seq_k, scale * _LOG2E,
        HEAD_DIM=head_dim, HEAD_DIM_PAD=_pad_dim(head_dim),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        CAUSAL=causal, EVEN_M=seq_q % cfg.block_m == 0,
        USE_TMA=use_tma, WARP_SPECIALIZE=use_tma and cfg.warp_specialize,
        DOT_PREC=_dot_precision(q.dtype),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    return o, lse2


def _backward(do, q, k, v, o, lse2, causal: bool, scale: float, cfg: FlashConfig):
    batch, heads_q, seq_q, head_dim = q.shape
    heads_kv, seq_k = k.shape[1], k.shape[2]
    group = heads_q // heads_kv
    pad = _pad_dim(head_dim)
    do = _last_dim_unit(do)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    delta = torch.empty_like(lse2)
    pre_block = 64
    _bwd_preprocess_kernel[(triton.cdiv(seq_q, pre_block), batch * heads_q)](
        o, do, delta, *_strides(o), *_strides(do), heads_q, seq_q,
        HEAD_DIM=head_dim, HEAD_DIM_PAD=pad, BLOCK_M=pre_block,
    )  # fmt: skip
    small, large = cfg.bwd_block_m, cfg.bwd_block_n
    prec = _dot_precision(q.dtype)
    _bwd_dkdv_kernel[(triton.cdiv(seq_k, large), batch * heads_kv)](
        q, k, v, do, dk, dv, lse2, delta,
        *_strides(q), *_strides(k), *_strides(v), *_strides(do), *_strides(dk), *_strides(dv),
        heads_q, heads_kv, group, seq_q, seq_k, scale * _LOG2E, scale,
        HEAD_DIM=head_dim, HEAD_DIM_PAD=pad, BLOCK_M=small, BLOCK_N=large,
        CAUSAL=causal, EVEN_M=seq_q % small == 0, EVEN_N=seq_k % large == 0, DOT_PREC=prec,
        num_warps=cfg.bwd_num_warps, num_stages=cfg.bwd_num_stages,
    )  # fmt: skip
    _bwd_dq_kernel[(triton.cdiv(seq_q, large), batch * heads_q)](
        q, k, v, do, dq, lse2, delta,
        *_strides(q), *_strides(k), *_strides(v), *_strides(do), *_strides(dq),
        heads_q, group, seq_q, seq_k, scale * _LOG2E, scale,
        HEAD_DIM=head_dim, HEAD_DIM_PAD=pad, BLOCK_M=large, BLOCK_N=small,
        CAUSAL=causal, EVEN_M=seq_q % large == 0, DOT_PREC=prec,
        num_warps=cfg.bwd_num_warps, num_stages=cfg.bwd_num_stages,
    )  # fmt: skip
    return dq, dk, dv


# ---------------------------------------------------------------------------------------
# Autograd
# ---------------------------------------------------------------------------------------


class _FlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, scale, config):
        o, lse2 = _forward(q, k, v, causal, scale, config)
        ctx.save_for_backward(q, k, v, o, lse2)
        ctx.causal, ctx.scale, ctx.config = causal, scale, config
        ctx.mark_non_differentiable(lse2)
        return o, lse2

    @staticmethod
    def backward(ctx, do, _dlse2):
        q, k, v, o, lse2 = ctx.saved_tensors
        dq, dk, dv = _backward(do, q, k, v, o, lse2, ctx.causal, ctx.scale, ctx.config)
        return dq, dk, dv, None, None, None


# ---------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------


def flash_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    scale: float | None = None,
    return_lse: bool = False,
    config: FlashConfig | None = None,
):
    """softmax(q kᵀ · scale [+ bottom-right causal mask]) v, differentiable in q, k, v.

    q: (batch, heads_q, seqlen_q, head_dim); k, v: (batch, heads_kv, seqlen_k, head_dim),
    heads_q a multiple of heads_kv (GQA: q head h reads kv head h // (heads_q // heads_kv)).
    Any strides whose last one is 1 (a (B, S, H, D) tensor's `.transpose(1, 2)` needs no
    copy). fp16, bf16 or fp32; head_dim a multiple of 8 up to 256. `scale` defaults to
    1/sqrt(head_dim). Causal with seqlen_q > seqlen_k leaves the first rows without any
    key: their output is 0, their lse -inf, their gradients 0.

    With `return_lse=True` also returns the natural-log log-sum-exp of each row's scaled
    scores, (batch, heads_q, seqlen_q) fp32, not differentiable. `config` overrides the
    tile heuristic (`fa_bench.kernels.flash_config.default_config`).
    """
    _validate(q, k, v, scale)
    q, k, v = _last_dim_unit(q), _last_dim_unit(k), _last_dim_unit(v)
    causal = bool(causal)
    scale = float(scale) if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    cfg = _resolve_config(config, q, k.shape[2], causal, "fwd_bwd" if q.requires_grad else "fwd")
    o, lse2 = _FlashAttention.apply(q, k, v, causal, scale, cfg)
    if not return_lse:
        return o
    # internal +inf marks rows without keys; the public lse is log(0) = -inf there
    lse = torch.where(torch.isinf(lse2), float("-inf"), lse2 * _LN2)
    return o, lse
