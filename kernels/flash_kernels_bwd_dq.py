"""The two-kernel backward's dQ `@triton.jit` kernel (split from flash_kernels_bwd.py,
which re-exports it): one program holds BLOCK_HELD query rows of one (batch, q head) and
streams the visible keys; full key blocks load unmasked (a packed sequence's too: its
ranges come from its own length), the diagonal and tail blocks masked. Names, flags, the
compile-time shape checks and when TRITON_INTERPRET must be set are flash_kernels.py's;
the variants' helpers are called through their module (fv).
"""

import triton
import triton.language as tl

from fa_bench.kernels import flash_kernels_variants as fv
from fa_bench.kernels.flash_kernels import check_shapes, key_ranges, load_rows, store_rows


@triton.jit
def _bwd_dq_inner(
    # the held query rows' accumulator, tiles, lse2 and delta
    dq, q, do, lse2, delta,
    # K/V base pointers of this (batch, kv head), streamed
    k_base, v_base, stride_ks, stride_vs,
    # the keys [lo, hi) to stream; offsets; sizes and the log2-domain scale
    lo, hi, offs_m, offs_d, seq_k, causal_off, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_STREAMED: tl.constexpr,
    # DIAGONAL_OR_TAIL: as in _fwd_inner (masked loads; causal mask on the scores)
    DIAGONAL_OR_TAIL: tl.constexpr, CAUSAL: tl.constexpr, MASK_D: tl.constexpr,
    DOT_PREC: tl.constexpr,
    # the variants, as in _bwd_dkdv_inner
    win_left=None, win_right=None, softcap2=None, slope2=None,
    WINDOW: tl.constexpr = False, SOFTCAP: tl.constexpr = False, ALIBI: tl.constexpr = False,
):  # fmt: skip
    for start_n in range(lo, hi, BLOCK_STREAMED):
        offs_n = start_n + tl.arange(0, BLOCK_STREAMED)
        # Keys past the end load as k = v = 0: they add ds · 0 to dQ, so no score mask.
        k = load_rows(k_base, offs_n, stride_ks, offs_d, seq_k, HEAD_DIM, DIAGONAL_OR_TAIL,
                       MASK_D)  # fmt: skip
        v = load_rows(v_base, offs_n, stride_vs, offs_d, seq_k, HEAD_DIM, DIAGONAL_OR_TAIL,
                       MASK_D)  # fmt: skip
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PREC)
        if SOFTCAP or ALIBI:
            s2, th = fv.variant_scores(
                qk, qk_scale, softcap2, slope2, offs_m, offs_n, causal_off, SOFTCAP, ALIBI, False
            )
            p = tl.math.exp2(s2 - lse2[:, None])
        else:
            p = tl.math.exp2(qk * qk_scale - lse2[:, None])
        if DIAGONAL_OR_TAIL and (WINDOW or SOFTCAP or ALIBI):
            # a tail key's score is no longer bounded by the row's: exp2 may overflow,
            # and inf · 0 would reach dQ, so the tail is masked too
            keep = offs_n[None, :] < seq_k
            if WINDOW:
                keep = keep & fv.window_keep(offs_m, offs_n, causal_off, win_left, win_right, False)
            elif CAUSAL:
                keep = keep & (offs_n[None, :] <= offs_m[:, None] + causal_off)
            p = tl.where(keep, p, 0.0)
        elif DIAGONAL_OR_TAIL and CAUSAL:
            p = tl.where(offs_n[None, :] <= offs_m[:, None] + causal_off, p, 0.0)
        if SOFTCAP:
            # through c · tanh(s / c), folded into P before the dot: one tile lives across
            # it, as without a softcap
            p = p * (1.0 - th * th)
        dp = tl.dot(do, tl.trans(v), input_precision=DOT_PREC)
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=DOT_PREC)
    return dq


@triton.jit
def _bwd_dq_kernel(
    # tensors: inputs, dO, the gradient to write, and the saved lse2 and delta
    Q, K, V, DO, DQ, LSE, DELTA,
    # strides in elements (batch, head, seq); the last dimension's stride is 1
    stride_qb, stride_qh, stride_qs, stride_kb, stride_kh, stride_ks,
    stride_vb, stride_vh, stride_vs, stride_dob, stride_doh, stride_dos,
    stride_dqb, stride_dqh, stride_dqs,
    # sizes, scale · log2(e) for the scores and the plain scale for dQ (VARLEN: seq_q
    # and seq_k are the packed totals)
    heads_q, group, seq_q, seq_k, qk_scale, sm_scale,
    # constexpr: register tile shapes (held query rows, streamed keys) and code paths
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    BLOCK_HELD: tl.constexpr, BLOCK_STREAMED: tl.constexpr,
    CAUSAL: tl.constexpr, EVEN_Q: tl.constexpr, DOT_PREC: tl.constexpr,
    # the variants, as in _fwd_kernel (None / False when off)
    win_left=None, win_right=None, softcap2=None, Slopes=None, stride_slope_b=None,
    CuQ=None, CuK=None, Sched=None,
    WINDOW: tl.constexpr = False, SOFTCAP: tl.constexpr = False, ALIBI: tl.constexpr = False,
    VARLEN: tl.constexpr = False, DP_FIRST: tl.constexpr = False,  # DP_FIRST: dK/dV's only
    # dK/dV's only: its streamed rows (dQ's full blocks load unmasked), its masked loop
    CLAMP: tl.constexpr = False, DIAG_STAGES: tl.constexpr = None,
):  # fmt: skip
    """One program: BLOCK_HELD query rows of one (batch, q head); streams the visible keys
    BLOCK_STREAMED at a time."""
    check_shapes(HEAD_DIM, HEAD_DIM_PAD, BLOCK_HELD, BLOCK_STREAMED)
    MASK_D: tl.constexpr = HEAD_DIM != HEAD_DIM_PAD
    if VARLEN >= 2:
        # a packed batch's (sequence, row block) from its table, heaviest first (rows 2-3
        # of Sched), the q heads on the fast axis (a GQA group's side by side); -1: none
        seq_of = tl.load(Sched + 2 * tl.num_programs(1) + tl.program_id(1))
        if seq_of < 0:
            return
        pid_m = tl.load(Sched + 3 * tl.num_programs(1) + tl.program_id(1))
        off_bh = seq_of * heads_q + tl.program_id(0)
    elif VARLEN:
        # the row block on the slow axis, the last (causal: heaviest) first, over every
        # sequence: a long sequence's heavy blocks do not trail the grid
        if CAUSAL:
            pid_m = tl.num_programs(1) - 1 - tl.program_id(1)
        else:
            pid_m = tl.program_id(1)
        off_bh = tl.program_id(0)
    else:
        if CAUSAL:
            pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
        else:
            pid_m = tl.program_id(0)
        off_bh = tl.program_id(1)
    off_b = (off_bh // heads_q).to(tl.int64)
    off_h = (off_bh % heads_q).to(tl.int64)
    off_hk = off_h // group
    m0 = pid_m * BLOCK_HELD
    offs_m = m0 + tl.arange(0, BLOCK_HELD)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    if VARLEN:
        row0 = off_h * seq_q  # lse2 and delta are (H, T): seq_q is the total here
        q_start, seq_q = fv.sequence(CuQ, off_b)
        k_start, seq_k = fv.sequence(CuK, off_b)
        if m0 >= seq_q:
            return
        row0 += q_start
        q_base = Q + q_start.to(tl.int64) * stride_qs + off_h * stride_qh
        do_base = DO + q_start.to(tl.int64) * stride_dos + off_h * stride_doh
        k_base = K + k_start.to(tl.int64) * stride_ks + off_hk * stride_kh
        v_base = V + k_start.to(tl.int64) * stride_vs + off_hk * stride_vh
    else:
        q_base = Q + off_b * stride_qb + off_h * stride_qh
        do_base = DO + off_b * stride_dob + off_h * stride_doh
        k_base = K + off_b * stride_kb + off_hk * stride_kh
        v_base = V + off_b * stride_vb + off_hk * stride_vh
    q = load_rows(q_base, offs_m, stride_qs, offs_d, seq_q, HEAD_DIM, not EVEN_Q, MASK_D)
    do = load_rows(do_base, offs_m, stride_dos, offs_d, seq_q, HEAD_DIM, not EVEN_Q, MASK_D)
    if not VARLEN:
        row0 = off_bh.to(tl.int64) * seq_q
    if EVEN_Q:
        lse2 = tl.load(LSE + row0 + offs_m)
        delta = tl.load(DELTA + row0 + offs_m)
    else:
        lse2 = tl.load(LSE + row0 + offs_m, mask=offs_m < seq_q, other=float("inf"))
        delta = tl.load(DELTA + row0 + offs_m, mask=offs_m < seq_q, other=0.0)
    dq = tl.zeros([BLOCK_HELD, HEAD_DIM_PAD], dtype=tl.float32)

    causal_off = seq_k - seq_q
    if ALIBI:
        slope2 = fv.alibi_slope2(Slopes, stride_slope_b, off_b, off_h, ALIBI)
    else:
        slope2 = None
    # the keys in up to three ranges, each through the one helper with its mask a
    # constexpr: a window's masked lead [lo, n_lo_full), then (the static loop) whole
    # blocks unmasked [n_lo_full or 0, n_full) and the masked diagonal and tail
    # [n_full, n_end)
    if WINDOW:
        lo, n_lo_full, n_full, n_end = fv.window_ranges(
            m0, seq_k, causal_off - win_left, causal_off + win_right, BLOCK_HELD, BLOCK_STREAMED
        )
        dq = _bwd_dq_inner(
            dq, q, do, lse2, delta, k_base, v_base, stride_ks, stride_vs,
            lo, n_lo_full, offs_m, offs_d, seq_k, causal_off, qk_scale,
            HEAD_DIM, BLOCK_STREAMED, True, CAUSAL, MASK_D, DOT_PREC,
            win_left, win_right, softcap2, slope2, WINDOW, SOFTCAP, ALIBI,
        )  # fmt: skip
    else:
        n_full, n_end = key_ranges(m0, seq_k, causal_off, BLOCK_HELD, BLOCK_STREAMED, CAUSAL)
    for masked in tl.static_range(2):
        dq = _bwd_dq_inner(
            dq, q, do, lse2, delta, k_base, v_base, stride_ks, stride_vs,
            n_full if masked else (n_lo_full if WINDOW else 0), n_end if masked else n_full,
            offs_m, offs_d, seq_k, causal_off, qk_scale,
            HEAD_DIM, BLOCK_STREAMED, masked == 1, CAUSAL,
            MASK_D, DOT_PREC, win_left, win_right, softcap2, slope2, WINDOW, SOFTCAP, ALIBI,
        )  # fmt: skip
    dq = dq * sm_scale
    if VARLEN:
        dq_base = DQ + q_start.to(tl.int64) * stride_dqs + off_h * stride_dqh
    else:
        dq_base = DQ + off_b * stride_dqb + off_h * stride_dqh
    store_rows(
        dq_base, offs_m, stride_dqs, offs_d, seq_q, dq.to(DQ.dtype.element_ty),
        HEAD_DIM, not EVEN_Q, MASK_D,
    )  # fmt: skip
