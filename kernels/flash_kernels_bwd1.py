"""The one-pass backward `@triton.jit` kernels of our FlashAttention-2 (experimental,
`deterministic=False`: slower on the H200 as measured; flash_kernels_bwd.py holds the
default two-kernel backward).

One program owns BLOCK_HELD keys (FlashConfig.bwd_block_n) of one (batch, kv head), holds
K, V and the fp32 dK/dV accumulators for its whole life, loops over every query head of
its GQA group and streams BLOCK_STREAMED query rows (bwd_block_m) per step. Per
(key block, query block) pair it runs five matmuls, in the log2 domain of the forward:

    Sᵀ = K Qᵀ,  Pᵀ = exp2(Sᵀ · scale · log2e − lse2)   (lse2 = +inf rows: P = 0)
    dV += Pᵀ dO,  dPᵀ = V dOᵀ,  dSᵀ = Pᵀ ∘ (dPᵀ − delta)
    dK += dSᵀ Q,  dQ_ws += dS K   (fp32 workspace, atomic adds)

The dQ partials of every key block meet in an fp32 workspace (B, Hq, Sq, HEAD_DIM), zeroed
by the launcher, through `tl.atomic_add` on a block of pointers (relaxed: only the sum
matters) or, with USE_TMA, the reduce-add of a device-side tensor descriptor
(`tensor_descriptor.atomic_add`, sm_90+). `_bwd1_dq_postprocess_kernel` then writes
dQ = workspace · scale in the input dtype. The order of the atomic adds varies from run
to run, so dQ is not bitwise reproducible (dK and dV are: their programs own them).

Causal (bottom-right): a key block's first query block is the first that sees any of its
keys; fully masked query blocks are never visited and only the blocks that straddle the
diagonal pay the mask (ON_DIAGONAL). Names, flags and the compile-time shape checks are
those of flash_kernels.py; launched by fa_bench.kernels.flash_attention.

Triton decides when these functions are defined whether to interpret them, so
TRITON_INTERPRET must be set before this module (or triton) is first imported.
"""

import triton
import triton.language as tl

from fa_bench.kernels.flash_kernels import check_shapes, load_rows, store_rows


@triton.jit
def _bwd1_inner(
    # the held keys' accumulators and tiles, and the key offsets
    dk, dv, k, v, offs_n,
    # this q head's Q, dO, lse2, delta and dQ workspace, streamed
    q_base, do_base, lse_base, delta_base, dq_base, dq_desc, stride_qs, stride_dos,
    # the query rows [lo, hi) to stream; offsets; sizes and the log2-domain scale
    lo, hi, offs_d, seq_q, seq_k, causal_off, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_STREAMED: tl.constexpr,
    # ON_DIAGONAL: the query blocks that straddle these keys' causal diagonal (masked);
    # EVEN_K False: the held block has keys past the end, whose P is masked to 0 so that
    # an overflowing exp2 there cannot reach dQ as inf · 0.
    ON_DIAGONAL: tl.constexpr, EVEN_Q: tl.constexpr, EVEN_K: tl.constexpr,
    MASK_D: tl.constexpr, USE_TMA: tl.constexpr, DOT_PREC: tl.constexpr,
):  # fmt: skip
    for start_m in range(lo, hi, BLOCK_STREAMED):
        offs_m = start_m + tl.arange(0, BLOCK_STREAMED)
        q = load_rows(q_base, offs_m, stride_qs, offs_d, seq_q, HEAD_DIM, not EVEN_Q, MASK_D)
        do = load_rows(do_base, offs_m, stride_dos, offs_d, seq_q, HEAD_DIM, not EVEN_Q, MASK_D)
        if EVEN_Q:
            lse2 = tl.load(lse_base + offs_m)
            delta = tl.load(delta_base + offs_m)
        else:
            # rows past the end get lse2 = +inf, hence p = 0 and ds = 0
            lse2 = tl.load(lse_base + offs_m, mask=offs_m < seq_q, other=float("inf"))
            delta = tl.load(delta_base + offs_m, mask=offs_m < seq_q, other=0.0)
        qk_t = tl.dot(k, tl.trans(q), input_precision=DOT_PREC)  # (BLOCK_HELD, BLOCK_STREAMED)
        p_t = tl.math.exp2(qk_t * qk_scale - lse2[None, :])
        if ON_DIAGONAL:
            p_t = tl.where(offs_n[:, None] <= offs_m[None, :] + causal_off, p_t, 0.0)
        if not EVEN_K:
            p_t = tl.where(offs_n[:, None] < seq_k, p_t, 0.0)
        dv = tl.dot(p_t.to(do.dtype), do, dv, input_precision=DOT_PREC)
        dp_t = tl.dot(v, tl.trans(do), input_precision=DOT_PREC)
        ds_t = (p_t * (dp_t - delta[None, :])).to(q.dtype)
        dk = tl.dot(ds_t, q, dk, input_precision=DOT_PREC)
        # this key block's share of dQ (unscaled: the postprocessing applies the scale)
        dq = tl.dot(tl.trans(ds_t), k, input_precision=DOT_PREC)  # (BLOCK_STREAMED, D_PAD)
        if USE_TMA:
            # bounds are this head's [seq_q, HEAD_DIM]: tail rows and padding are dropped
            dq_desc.atomic_add([0, start_m, 0], dq[None, :, :])
        else:
            ptrs = dq_base + offs_m[:, None] * HEAD_DIM + offs_d[None, :]
            if EVEN_Q and not MASK_D:
                tl.atomic_add(ptrs, dq, sem="relaxed")
            else:
                keep = (offs_m[:, None] < seq_q) & (offs_d[None, :] < HEAD_DIM)
                tl.atomic_add(ptrs, dq, mask=keep, sem="relaxed")
    return dk, dv


@triton.jit
def _bwd1_kernel(
    # tensors: inputs, dO, dK/dV to write, the saved lse2 and delta, the dQ workspace
    # (B, Hq, Sq, HEAD_DIM) fp32, contiguous, zeroed
    Q, K, V, DO, DK, DV, LSE, DELTA, DQ_WS,
    # strides in elements (batch, head, seq); the last dimension's stride is 1
    stride_qb, stride_qh, stride_qs, stride_kb, stride_kh, stride_ks,
    stride_vb, stride_vh, stride_vs, stride_dob, stride_doh, stride_dos,
    stride_dkb, stride_dkh, stride_dks, stride_dvb, stride_dvh, stride_dvs,
    # sizes, scale · log2(e) for the scores and the plain scale for dK
    heads_q, heads_kv, group, seq_q, seq_k, qk_scale, sm_scale,
    # constexpr: register tile shapes (held keys, streamed query rows) and code paths
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    BLOCK_HELD: tl.constexpr, BLOCK_STREAMED: tl.constexpr,
    CAUSAL: tl.constexpr, EVEN_Q: tl.constexpr, EVEN_K: tl.constexpr,
    USE_TMA: tl.constexpr, DOT_PREC: tl.constexpr,
):  # fmt: skip
    """One program: BLOCK_HELD keys of one (batch, kv head); loops over the group's q heads
    and streams BLOCK_STREAMED query rows at a time. Causal grids put the key block on
    axis 1 (launched slowest) so that every head's first, heaviest blocks go first."""
    check_shapes(HEAD_DIM, HEAD_DIM_PAD, BLOCK_HELD, BLOCK_STREAMED)
    MASK_D: tl.constexpr = HEAD_DIM != HEAD_DIM_PAD
    if CAUSAL:
        pid_n = tl.program_id(1)
        off_bh = tl.program_id(0)
    else:
        pid_n = tl.program_id(0)
        off_bh = tl.program_id(1)
    off_b = (off_bh // heads_kv).to(tl.int64)
    off_hk = (off_bh % heads_kv).to(tl.int64)
    n0 = pid_n * BLOCK_HELD
    offs_n = n0 + tl.arange(0, BLOCK_HELD)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    k_base = K + off_b * stride_kb + off_hk * stride_kh
    v_base = V + off_b * stride_vb + off_hk * stride_vh
    # Keys past the end load as 0; their dK/dV rows are never stored.
    k = load_rows(k_base, offs_n, stride_ks, offs_d, seq_k, HEAD_DIM, not EVEN_K, MASK_D)
    v = load_rows(v_base, offs_n, stride_vs, offs_d, seq_k, HEAD_DIM, not EVEN_K, MASK_D)
    dk = tl.zeros([BLOCK_HELD, HEAD_DIM_PAD], dtype=tl.float32)
    dv = tl.zeros([BLOCK_HELD, HEAD_DIM_PAD], dtype=tl.float32)

    causal_off = seq_k - seq_q
    m_tiles_end = tl.cdiv(seq_q, BLOCK_STREAMED) * BLOCK_STREAMED
    if CAUSAL:
        # rows < n0 - off see none of these keys; rows >= n0 + BLOCK_HELD - 1 - off see all
        m_lo = (tl.maximum(n0 - causal_off, 0) // BLOCK_STREAMED) * BLOCK_STREAMED
        m_mid = tl.cdiv(tl.maximum(n0 + BLOCK_HELD - 1 - causal_off, 0), BLOCK_STREAMED)
        m_mid = tl.minimum(m_mid * BLOCK_STREAMED, m_tiles_end)
    else:
        m_lo = 0
        m_mid = 0
    for g in range(group):
        off_h = off_hk * group + g
        q_base = Q + off_b * stride_qb + off_h * stride_qh
        do_base = DO + off_b * stride_dob + off_h * stride_doh
        row0 = (off_b * heads_q + off_h) * seq_q
        dq_base = DQ_WS + row0 * HEAD_DIM
        if USE_TMA:
            # one (batch, q head) of the workspace seen as [1, seq_q, HEAD_DIM]
            dq_desc = tl.make_tensor_descriptor(
                dq_base, [1, seq_q, HEAD_DIM], [seq_q * HEAD_DIM, HEAD_DIM, 1],
                [1, BLOCK_STREAMED, HEAD_DIM_PAD],
            )  # fmt: skip
        else:
            dq_desc = None
        dk, dv = _bwd1_inner(
            dk, dv, k, v, offs_n, q_base, do_base, LSE + row0, DELTA + row0, dq_base, dq_desc,
            stride_qs, stride_dos, m_lo, m_mid, offs_d, seq_q, seq_k, causal_off, qk_scale,
            HEAD_DIM, BLOCK_STREAMED, True, EVEN_Q, EVEN_K, MASK_D, USE_TMA, DOT_PREC,
        )  # fmt: skip
        dk, dv = _bwd1_inner(
            dk, dv, k, v, offs_n, q_base, do_base, LSE + row0, DELTA + row0, dq_base, dq_desc,
            stride_qs, stride_dos, m_mid, seq_q, offs_d, seq_q, seq_k, causal_off, qk_scale,
            HEAD_DIM, BLOCK_STREAMED, False, EVEN_Q, EVEN_K, MASK_D, USE_TMA, DOT_PREC,
        )  # fmt: skip
    dk = dk * sm_scale
    dk_base = DK + off_b * stride_dkb + off_hk * stride_dkh
    dv_base = DV + off_b * stride_dvb + off_hk * stride_dvh
    store_rows(
        dk_base, offs_n, stride_dks, offs_d, seq_k, dk.to(DK.dtype.element_ty),
        HEAD_DIM, not EVEN_K, MASK_D,
    )  # fmt: skip
    store_rows(
        dv_base, offs_n, stride_dvs, offs_d, seq_k, dv.to(DV.dtype.element_ty),
        HEAD_DIM, not EVEN_K, MASK_D,
    )  # fmt: skip


@triton.jit
def _bwd1_dq_postprocess_kernel(
    # tensors: the fp32 workspace (B, Hq, Sq, HEAD_DIM), contiguous, and dQ to write
    DQ_WS, DQ,
    # dQ's strides in elements (batch, head, seq); the last dimension's stride is 1
    stride_dqb, stride_dqh, stride_dqs,
    # sizes and the softmax scale (dQ = scale · Σ dS K)
    heads_q, seq_q, sm_scale,
    # constexpr: register tile shapes
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, BLOCK_M: tl.constexpr,
    DQ_PERM: tl.constexpr = False,
):  # fmt: skip
    """dQ[row] = scale · workspace[row] in dQ's dtype, for BLOCK_M rows per program.
    DQ_PERM: the workspace holds each row's columns permuted within every 32 (the Gluon
    backward's staging order, flash_gluon_bwd_dq._staged): column c = [g|j1 j0|a|b e]
    (bits) is read from [g|a|j1 j0|b e]."""
    check_shapes(HEAD_DIM, HEAD_DIM_PAD, BLOCK_M, BLOCK_M)
    MASK_D: tl.constexpr = HEAD_DIM != HEAD_DIM_PAD
    pid_m = tl.program_id(0)
    off_bh = tl.program_id(1)
    off_b = (off_bh // heads_q).to(tl.int64)
    off_h = (off_bh % heads_q).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    ws_base = DQ_WS + off_bh.to(tl.int64) * seq_q * HEAD_DIM
    src_d = offs_d
    if DQ_PERM:
        high, low = (offs_d & ~31) | (((offs_d >> 2) & 1) << 4), offs_d & 3
        src_d = high | (((offs_d >> 3) & 3) << 2) | low
    dq = load_rows(ws_base, offs_m, HEAD_DIM, src_d, seq_q, HEAD_DIM, True, MASK_D)
    dq_base = DQ + off_b * stride_dqb + off_h * stride_dqh
    store_rows(
        dq_base, offs_m, stride_dqs, offs_d, seq_q, (dq * sm_scale).to(DQ.dtype.element_ty),
        HEAD_DIM, True, MASK_D,
    )  # fmt: skip
