"""The `@triton.jit` FP8 (e4m3) forward of our FlashAttention (issue 21, item 3). Launched by
fa_bench.kernels.flash_fp8, which documents the API; the dense kernels' conventions hold
(flash_kernels.py: log2-domain scores, lse2 = +inf for rows that see no key, bottom-right
causal, a program holds BLOCK_M query rows and streams BLOCK_N keys, two loops: the keys
every row sees whole, then the masked diagonal / tail).

What differs from the 16-bit forward:
- Q and K are float8e4nv; S = q8 · k8ᵀ accumulates in fp32 on the tensor cores and the
  per-tensor descales are folded into the log2-domain scale once per program
  (qk_scale = q_descale · k_descale · scale · log2 e, read from device memory: no host sync).
- P is quantised to e4m3 for the PV matmul. exp2(s − m) lies in [0, 1], where e4m3 has
  only its subnormals below 2⁻⁶ (step 2⁻⁹); the kernel computes exp2(s − m + P_EXP) instead,
  P in [0, 2^P_EXP] (256 ≤ 448, e4m3's largest finite value), so the row maximum is exactly
  256 and values down to 2⁻¹⁴ of it stay normal (FlashAttention-3's fp8 path shifts its
  softmax the same way). The row sum l is taken over the same shifted fp32 P, so the
  factor cancels in acc / l; lse2 subtracts P_EXP again.
- V arrives K-major for the PV matmul: Hopper's fp8 wgmma reads its B operand K-major
  only, and for P·V the reduction runs over keys, so V is stored (D, S) per head (the host
  passes stride_vs == 1). The kernel loads a (HEAD_DIM_PAD, BLOCK_N) tile along the keys
  and transposes the view, which costs no data movement.
- The output is bf16: acc / l · v_descale.
"""

import triton
import triton.language as tl

from fa_bench.kernels.flash_kernels import check_shapes, key_ranges, load_rows, store_rows

# P is computed as exp2(s - m + P_EXP): in [0, 2^P_EXP], within e4m3's range (max 448).
P_EXP = tl.constexpr(8.0)


@triton.jit
def _load_v_kmajor(
    v_base, cols, stride_vs, stride_vd, offs_d, seq_k,
    HEAD_DIM: tl.constexpr, MASK_ROWS: tl.constexpr, MASK_D: tl.constexpr,
):  # fmt: skip
    """V's (BLOCK_N, HEAD_DIM_PAD) tile, read as its (HEAD_DIM_PAD, BLOCK_N) transpose from
    the K-major layout (stride_vs == 1): contiguous along the keys, as wgmma wants."""
    ptrs = v_base + offs_d[:, None] * stride_vd + cols[None, :] * stride_vs
    if MASK_ROWS and MASK_D:
        vt = tl.load(ptrs, mask=(cols[None, :] < seq_k) & (offs_d[:, None] < HEAD_DIM), other=0.0)
    elif MASK_ROWS:
        vt = tl.load(ptrs, mask=cols[None, :] < seq_k, other=0.0)
    elif MASK_D:
        vt = tl.load(ptrs, mask=offs_d[:, None] < HEAD_DIM, other=0.0)
    else:
        vt = tl.load(ptrs)
    return tl.trans(vt)


@triton.jit
def _fp8_inner(
    acc, l_i, m_i, q,
    k_desc, vt_desc, k_base, v_base, stride_ks, stride_vs, stride_vd,
    lo, hi, offs_m, offs_d, seq_k, causal_off, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
    DIAGONAL_OR_TAIL: tl.constexpr, CAUSAL: tl.constexpr, MASK_D: tl.constexpr,
    USE_TMA: tl.constexpr,
):  # fmt: skip
    """The online softmax over keys [lo, hi), as flash_kernels._fwd_inner, with P shifted
    by P_EXP and quantised to e4m3 for the PV matmul."""
    offs_n = tl.arange(0, BLOCK_N)
    for start_n in tl.range(lo, hi, BLOCK_N):
        cols = start_n + offs_n
        if USE_TMA:
            k = k_desc.load([start_n, 0])
        else:
            k = load_rows(
                k_base, cols, stride_ks, offs_d, seq_k, HEAD_DIM, DIAGONAL_OR_TAIL, MASK_D
            )
        qk = tl.dot(q, tl.trans(k), out_dtype=tl.float32)
        if DIAGONAL_OR_TAIL:
            keep = cols[None, :] < seq_k
            if CAUSAL:
                keep = keep & (cols[None, :] <= offs_m[:, None] + causal_off)
            qk = tl.where(keep, qk * qk_scale, float("-inf"))
            m_ij = tl.maximum(m_i, tl.max(qk, 1))
            # a row with no visible key so far keeps m = -inf: subtract 0 instead of -inf
            m_safe = tl.where(m_ij == float("-inf"), 0.0, m_ij)
            p = tl.math.exp2(qk - (m_safe[:, None] - P_EXP))
            alpha = tl.math.exp2(m_i - m_safe)
        else:
            m_ij = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            p = tl.math.exp2(qk * qk_scale - (m_ij[:, None] - P_EXP))
            alpha = tl.math.exp2(m_i - m_ij)
        l_ij = tl.sum(p, 1)
        acc = acc * alpha[:, None]
        if USE_TMA:  # V's (HEAD_DIM_PAD, BLOCK_N) block of its (D, S) storage, viewed (N, D)
            v = tl.trans(vt_desc.load([0, start_n]))
        else:
            v = _load_v_kmajor(
                v_base, cols, stride_vs, stride_vd, offs_d, seq_k, HEAD_DIM, DIAGONAL_OR_TAIL,
                MASK_D,
            )  # fmt: skip
        acc = tl.dot(p.to(tl.float8e4nv), v, acc, out_dtype=tl.float32)
        l_i = l_i * alpha + l_ij
        m_i = m_ij
    return acc, l_i, m_i


@triton.jit
def _fwd_fp8_kernel(
    # tensors: fp8 inputs, bf16 output, lse2 (B, Hq, Sq) fp32, the three fp32 descales
    Q, K, V, Out, LSE, Q_DESCALE, K_DESCALE, V_DESCALE,
    # strides in elements (batch, head, seq; V also its head_dim stride: K-major, see above)
    stride_qb, stride_qh, stride_qs, stride_kb, stride_kh, stride_ks,
    stride_vb, stride_vh, stride_vs, stride_vd, stride_ob, stride_oh, stride_os,
    # sizes (group = heads_q // heads_kv) and scale · log2(e), before the descales
    heads_q, group, seq_q, seq_k, sm_scale_log2,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, EVEN_Q: tl.constexpr, USE_TMA: tl.constexpr,
):  # fmt: skip
    """One program: BLOCK_M query rows of one (batch, q head); streams the visible keys.
    USE_TMA: device-side tensor descriptors (sm_90+, 16-byte aligned strides) for Q, K,
    V (its (D, S) storage) and O. (No warp specialisation: triton 3.6's, on a one-loop
    variant of this kernel, gave wrong outputs on the H200; docs/kernel.md.)"""
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
        vt_desc = tl.make_tensor_descriptor(
            v_base, [HEAD_DIM, seq_k], [stride_vd, 1], [HEAD_DIM_PAD, BLOCK_N]
        )
        q = q_desc.load([m0, 0])
    else:
        k_desc = None
        vt_desc = None
        q = load_rows(q_base, offs_m, stride_qs, offs_d, seq_q, HEAD_DIM, not EVEN_Q, MASK_D)
    qk_scale = tl.load(Q_DESCALE) * tl.load(K_DESCALE) * sm_scale_log2

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], dtype=tl.float32)

    causal_off = seq_k - seq_q
    n_full, n_end = key_ranges(m0, seq_k, causal_off, BLOCK_M, BLOCK_N, CAUSAL)
    acc, l_i, m_i = _fp8_inner(
        acc, l_i, m_i, q, k_desc, vt_desc, k_base, v_base, stride_ks, stride_vs, stride_vd,
        0, n_full, offs_m, offs_d, seq_k, causal_off, qk_scale,
        HEAD_DIM, BLOCK_N, False, CAUSAL, MASK_D, USE_TMA,
    )  # fmt: skip
    acc, l_i, m_i = _fp8_inner(
        acc, l_i, m_i, q, k_desc, vt_desc, k_base, v_base, stride_ks, stride_vs, stride_vd,
        n_full, n_end, offs_m, offs_d, seq_k, causal_off, qk_scale,
        HEAD_DIM, BLOCK_N, True, CAUSAL, MASK_D, USE_TMA,
    )  # fmt: skip

    # Rows with no visible key: output 0, lse2 = +inf (as the dense forward).
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    acc = acc * (tl.load(V_DESCALE) / l_safe)[:, None]
    lse2 = tl.where(empty, float("inf"), m_i + tl.math.log2(l_safe) - P_EXP)
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
