"""The backward `@triton.jit` kernels of our FlashAttention-2, in the order they run:
preprocessing (delta = rowsum(dO·O), in flash_kernels_bwd_pre.py, re-exported here),
dK/dV, dQ (in flash_kernels_bwd_dq.py, re-exported here). Names, flags and the compile-time shape
checks are those of flash_kernels.py (the forward and the tile helpers, which these
share); launched by fa_bench.kernels.flash_attention.

Triton decides when these functions are defined whether to interpret them, so
TRITON_INTERPRET must be set before this module (or triton) is first imported.
"""

import triton
import triton.language as tl

from fa_bench.kernels.flash_kernels import check_shapes, load_rows, store_rows
from fa_bench.kernels.flash_kernels_bwd_dq import _bwd_dq_kernel  # noqa: F401
from fa_bench.kernels.flash_kernels_bwd_pre import _bwd_preprocess_kernel  # noqa: F401
from fa_bench.kernels.flash_kernels_variants import (
    alibi_slope2,
    dkdv_p_t,
    sequence,
    window_ranges,
)


@triton.jit
def _bwd_dkdv_inner(
    # the held keys' accumulators and tiles
    dk, dv, k, v,
    # this q head's Q, dO, lse2 and delta, streamed
    q_base, do_base, lse_base, delta_base, stride_qs, stride_dos,
    # the query rows [lo, hi) to stream; offsets; sizes and the log2-domain scale
    lo, hi, offs_n, offs_d, seq_q, causal_off, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_STREAMED: tl.constexpr,
    # ON_DIAGONAL: the query blocks that straddle these keys' causal diagonal, whose scores
    # need the causal mask; the other loop's blocks see every held key.
    ON_DIAGONAL: tl.constexpr, EVEN_Q: tl.constexpr, MASK_D: tl.constexpr,
    DOT_PREC: tl.constexpr,
    # the variants (flash_kernels_variants.py): runtime values, None when off; with a
    # WINDOW, ON_DIAGONAL means "the window's edge blocks" (masked by the window)
    win_left=None, win_right=None, softcap2=None, slope2=None,
    WINDOW: tl.constexpr = False, SOFTCAP: tl.constexpr = False, ALIBI: tl.constexpr = False,
    DP_FIRST: tl.constexpr = False,
    # CLAMP (a packed batch): Q/dO rows load unmasked from row indices clamped to
    # row_cap (the packed tensor's last row, relative to this sequence's start): rows
    # past the sequence read the next sequence's (finite) rows, whose lse2 loads as +inf
    # (masked 1-D load), so their P is 0 and they add nothing; no 2-D row mask in the loop
    row_cap=None, CLAMP: tl.constexpr = False,
    # GAP (CLAMP 2): steps at or past gap_at run gap_by rows further (the diagonal blocks,
    # then the sequence's tail block in the same masked loop)
    gap_at=None, gap_by=None, GAP: tl.constexpr = False,
    # this loop's software-pipeline depth (None: the launch's num_stages)
    STAGES: tl.constexpr = None,
):  # fmt: skip
    for start_m in tl.range(lo, hi, BLOCK_STREAMED, num_stages=STAGES):
        if GAP:
            row_start = tl.where(start_m < gap_at, start_m, start_m + gap_by)
        else:
            row_start = start_m
        offs_m = row_start + tl.arange(0, BLOCK_STREAMED)
        if CLAMP:
            rows = tl.minimum(offs_m, row_cap)
            q = load_rows(q_base, rows, stride_qs, offs_d, seq_q, HEAD_DIM, False, MASK_D)
            do = load_rows(do_base, rows, stride_dos, offs_d, seq_q, HEAD_DIM, False, MASK_D)
        else:
            q = load_rows(q_base, offs_m, stride_qs, offs_d, seq_q, HEAD_DIM, not EVEN_Q, MASK_D)
            do = load_rows(do_base, offs_m, stride_dos, offs_d, seq_q, HEAD_DIM, not EVEN_Q, MASK_D)
        if EVEN_Q:
            lse2 = tl.load(lse_base + offs_m)
            delta = tl.load(delta_base + offs_m)
        else:
            # rows past the end get lse2 = +inf, hence p = 0
            lse2 = tl.load(lse_base + offs_m, mask=offs_m < seq_q, other=float("inf"))
            delta = tl.load(delta_base + offs_m, mask=offs_m < seq_q, other=0.0)
        qk_t = tl.dot(k, tl.trans(q), input_precision=DOT_PREC)  # (BLOCK_HELD, BLOCK_STREAMED)
        if DP_FIRST:
            # V·dOᵀ does not need P: issued first, its (asynchronous on sm_90) matmul can
            # run while P's elementwise work does, which otherwise sits between two dots
            dp_t = tl.dot(v, tl.trans(do), input_precision=DOT_PREC)
            p_t, pg_t = dkdv_p_t(
                qk_t, lse2, offs_m, offs_n, causal_off, qk_scale, ON_DIAGONAL,
                win_left, win_right, softcap2, slope2, WINDOW, SOFTCAP, ALIBI,
            )  # fmt: skip
            dv = tl.dot(p_t.to(do.dtype), do, dv, input_precision=DOT_PREC)
        else:
            p_t, pg_t = dkdv_p_t(
                qk_t, lse2, offs_m, offs_n, causal_off, qk_scale, ON_DIAGONAL,
                win_left, win_right, softcap2, slope2, WINDOW, SOFTCAP, ALIBI,
            )  # fmt: skip
            dv = tl.dot(p_t.to(do.dtype), do, dv, input_precision=DOT_PREC)
            dp_t = tl.dot(v, tl.trans(do), input_precision=DOT_PREC)
        ds_t = pg_t * (dp_t - delta[None, :])
        dk = tl.dot(ds_t.to(q.dtype), q, dk, input_precision=DOT_PREC)
    return dk, dv


@triton.jit
def _dkdv_packed_loops(
    dk, dv, k, v, q_base, do_base, lse_base, delta_base, stride_qs, stride_dos,
    m_lo, m_mid, offs_n, offs_d, seq_q, causal_off, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_STREAMED: tl.constexpr, CAUSAL: tl.constexpr,
    MASK_D: tl.constexpr, DOT_PREC: tl.constexpr, softcap2, slope2,
    SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, DP_FIRST: tl.constexpr, row_cap,
    CLAMP: tl.constexpr, DIAG_STAGES: tl.constexpr,
):  # fmt: skip
    """A packed sequence's query rows for dK/dV without a window (CLAMP 2, 3): one loop
    over its whole row blocks below the diagonal with no mask at all (every row in them is
    the sequence's), as the dense kernel's; the diagonal blocks [m_lo, m_mid) (causal) and
    the ragged tail block masked, with clamped loads. CLAMP 2: the tail block in the
    diagonal's loop (after it: two loops, as the dense kernel); 3: in a third loop, last
    (the masked loads' order of sums, bit for bit). DIAG_STAGES: the masked loop's
    pipeline depth (None: the launch's)."""
    m_even = tl.maximum((seq_q // BLOCK_STREAMED) * BLOCK_STREAMED, m_mid)
    if CLAMP == 2:
        diag_hi = m_mid + tl.maximum(seq_q - m_even, 0)
    else:
        diag_hi = m_mid
    dk, dv = _bwd_dkdv_inner(
        dk, dv, k, v, q_base, do_base, lse_base, delta_base, stride_qs, stride_dos,
        m_lo, diag_hi, offs_n, offs_d, seq_q, causal_off,
        qk_scale, HEAD_DIM, BLOCK_STREAMED, CAUSAL, False, MASK_D, DOT_PREC,
        None, None, softcap2, slope2, False, SOFTCAP, ALIBI, DP_FIRST,
        row_cap, 2, m_mid, m_even - m_mid, CLAMP == 2, DIAG_STAGES,
    )  # fmt: skip
    dk, dv = _bwd_dkdv_inner(
        dk, dv, k, v, q_base, do_base, lse_base, delta_base, stride_qs, stride_dos,
        m_mid, m_even, offs_n, offs_d, seq_q, causal_off, qk_scale,
        HEAD_DIM, BLOCK_STREAMED, False, True, MASK_D, DOT_PREC,
        None, None, softcap2, slope2, False, SOFTCAP, ALIBI, DP_FIRST,
    )  # fmt: skip
    if CLAMP == 3:
        dk, dv = _bwd_dkdv_inner(
            dk, dv, k, v, q_base, do_base, lse_base, delta_base, stride_qs, stride_dos,
            m_even, seq_q, offs_n, offs_d, seq_q, causal_off, qk_scale,
            HEAD_DIM, BLOCK_STREAMED, False, False, MASK_D, DOT_PREC,
            None, None, softcap2, slope2, False, SOFTCAP, ALIBI, DP_FIRST,
            row_cap, 2, None, None, False, DIAG_STAGES,
        )  # fmt: skip
    return dk, dv


@triton.jit
def _bwd_dkdv_kernel(
    # tensors: inputs, dO, the gradients to write, and the saved lse2 and delta
    Q, K, V, DO, DK, DV, LSE, DELTA,
    # strides in elements (batch, head, seq); the last dimension's stride is 1
    stride_qb, stride_qh, stride_qs, stride_kb, stride_kh, stride_ks,
    stride_vb, stride_vh, stride_vs, stride_dob, stride_doh, stride_dos,
    stride_dkb, stride_dkh, stride_dks, stride_dvb, stride_dvh, stride_dvs,
    # sizes, scale · log2(e) for the scores and the plain scale for dK (VARLEN: seq_q
    # and seq_k are the packed totals)
    heads_q, heads_kv, group, seq_q, seq_k, qk_scale, sm_scale,
    # constexpr: register tile shapes (held keys, streamed query rows) and code paths
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    BLOCK_HELD: tl.constexpr, BLOCK_STREAMED: tl.constexpr,
    CAUSAL: tl.constexpr, EVEN_Q: tl.constexpr, EVEN_K: tl.constexpr, DOT_PREC: tl.constexpr,
    # the variants, as in _fwd_kernel (None / False when off)
    win_left=None, win_right=None, softcap2=None, Slopes=None, stride_slope_b=None,
    CuQ=None, CuK=None, Sched=None,
    WINDOW: tl.constexpr = False, SOFTCAP: tl.constexpr = False, ALIBI: tl.constexpr = False,
    VARLEN: tl.constexpr = False, DP_FIRST: tl.constexpr = False, CLAMP: tl.constexpr = False,
    DIAG_STAGES: tl.constexpr = None,
):  # fmt: skip
    """One program: BLOCK_HELD keys of one (batch, kv head); streams BLOCK_STREAMED query
    rows at a time and loops over the group's q heads."""
    check_shapes(HEAD_DIM, HEAD_DIM_PAD, BLOCK_HELD, BLOCK_STREAMED)
    MASK_D: tl.constexpr = HEAD_DIM != HEAD_DIM_PAD
    if VARLEN >= 2:
        # a packed batch's (sequence, key block) from its table, heaviest first
        # (flash_varlen_sched: rows 0-1 of Sched; -1: none). VARLEN 2: the table on the
        # fast axis, so the programs side by side are one kv head's and stream the same
        # Q/dO rows (L2 keeps them); 3: the kv heads on the fast axis
        if VARLEN == 2:
            slot, entries, head = tl.program_id(0), tl.num_programs(0), tl.program_id(1)
        else:
            slot, entries, head = tl.program_id(1), tl.num_programs(1), tl.program_id(0)
        seq_of = tl.load(Sched + slot)
        if seq_of < 0:
            return
        pid_n = tl.load(Sched + entries + slot)
        off_bh = seq_of * heads_kv + head
    elif VARLEN:
        # the key block on the slow axis: every sequence's first (causal: heaviest) blocks
        # go first, so a long sequence's do not trail the grid
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
    if VARLEN:
        total_q = seq_q
        q_start, seq_q = sequence(CuQ, off_b)
        k_start, seq_k = sequence(CuK, off_b)
        if n0 >= seq_k:
            return
        k_base = K + k_start.to(tl.int64) * stride_ks + off_hk * stride_kh
        v_base = V + k_start.to(tl.int64) * stride_vs + off_hk * stride_vh
    else:
        k_base = K + off_b * stride_kb + off_hk * stride_kh
        v_base = V + off_b * stride_vb + off_hk * stride_vh
    # Keys past the end load as 0; their dK/dV rows are computed but never stored.
    k = load_rows(k_base, offs_n, stride_ks, offs_d, seq_k, HEAD_DIM, not EVEN_K, MASK_D)
    v = load_rows(v_base, offs_n, stride_vs, offs_d, seq_k, HEAD_DIM, not EVEN_K, MASK_D)
    dk = tl.zeros([BLOCK_HELD, HEAD_DIM_PAD], dtype=tl.float32)
    dv = tl.zeros([BLOCK_HELD, HEAD_DIM_PAD], dtype=tl.float32)

    causal_off = seq_k - seq_q
    m_tiles_end = tl.cdiv(seq_q, BLOCK_STREAMED) * BLOCK_STREAMED
    if WINDOW:
        # the rows that see some held key, those that see all of them (no mask)
        m_lo, m_mid, m_full_end, m_hi = window_ranges(
            n0, seq_q, -causal_off - win_right, -causal_off + win_left,
            BLOCK_HELD, BLOCK_STREAMED,
        )  # fmt: skip
    elif CAUSAL:
        # rows < n0 - off see none of these keys; rows >= n0 + BLOCK_HELD - 1 - off see all
        m_lo = (tl.maximum(n0 - causal_off, 0) // BLOCK_STREAMED) * BLOCK_STREAMED
        m_mid = tl.cdiv(tl.maximum(n0 + BLOCK_HELD - 1 - causal_off, 0), BLOCK_STREAMED)
        m_mid = m_mid * BLOCK_STREAMED
        m_mid = tl.minimum(m_mid, m_tiles_end)
    else:
        m_lo = 0
        m_mid = 0
    if not WINDOW:
        m_full_end = seq_q
    if CLAMP:
        row_cap = total_q - 1 - q_start  # the packed tensor's last row, sequence-relative
    else:
        row_cap = None
    # CLAMP 2: a window's middle loop holds whole blocks of the sequence only: no mask
    MID_EVEN: tl.constexpr = EVEN_Q or CLAMP >= 2
    MID_CLAMP: tl.constexpr = CLAMP == 1
    for g in range(group):
        off_h = off_hk * group + g
        if VARLEN:
            q_base = Q + q_start.to(tl.int64) * stride_qs + off_h * stride_qh
            do_base = DO + q_start.to(tl.int64) * stride_dos + off_h * stride_doh
            row0 = off_h * total_q + q_start  # lse2 and delta are (H, T)
        else:
            q_base = Q + off_b * stride_qb + off_h * stride_qh
            do_base = DO + off_b * stride_dob + off_h * stride_doh
            row0 = (off_b * heads_q + off_h) * seq_q
        if ALIBI:
            slope2 = alibi_slope2(Slopes, stride_slope_b, off_b, off_h, ALIBI)
        else:
            slope2 = None
        if CLAMP >= 2 and not WINDOW:
            dk, dv = _dkdv_packed_loops(
                dk, dv, k, v, q_base, do_base, LSE + row0, DELTA + row0, stride_qs,
                stride_dos, m_lo, m_mid, offs_n, offs_d, seq_q, causal_off, qk_scale,
                HEAD_DIM, BLOCK_STREAMED, CAUSAL, MASK_D, DOT_PREC, softcap2, slope2,
                SOFTCAP, ALIBI, DP_FIRST, row_cap, CLAMP, DIAG_STAGES,
            )  # fmt: skip
        else:
            dk, dv = _bwd_dkdv_inner(
                dk, dv, k, v, q_base, do_base, LSE + row0, DELTA + row0, stride_qs, stride_dos,
                m_lo, m_mid, offs_n, offs_d, seq_q, causal_off, qk_scale,
                HEAD_DIM, BLOCK_STREAMED, True, EVEN_Q, MASK_D, DOT_PREC,
                win_left, win_right, softcap2, slope2, WINDOW, SOFTCAP, ALIBI, DP_FIRST,
                row_cap, CLAMP,
            )  # fmt: skip
            dk, dv = _bwd_dkdv_inner(
                dk, dv, k, v, q_base, do_base, LSE + row0, DELTA + row0, stride_qs, stride_dos,
                m_mid, m_full_end, offs_n, offs_d, seq_q, causal_off, qk_scale,
                HEAD_DIM, BLOCK_STREAMED, False, MID_EVEN, MASK_D, DOT_PREC,
                win_left, win_right, softcap2, slope2, WINDOW, SOFTCAP, ALIBI, DP_FIRST,
                row_cap, MID_CLAMP,
            )  # fmt: skip
            if WINDOW:
                dk, dv = _bwd_dkdv_inner(
                    dk, dv, k, v, q_base, do_base, LSE + row0, DELTA + row0, stride_qs,
                    stride_dos, m_full_end, m_hi, offs_n, offs_d, seq_q, causal_off, qk_scale,
                    HEAD_DIM, BLOCK_STREAMED, True, EVEN_Q, MASK_D, DOT_PREC,
                    win_left, win_right, softcap2, slope2, WINDOW, SOFTCAP, ALIBI, DP_FIRST,
                    row_cap, CLAMP,
                )  # fmt: skip
    dk = dk * sm_scale
    if VARLEN:
        dk_base = DK + k_start.to(tl.int64) * stride_dks + off_hk * stride_dkh
        dv_base = DV + k_start.to(tl.int64) * stride_dvs + off_hk * stride_dvh
    else:
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
