"""The `@triton.jit` kernels of our decode attention (FlashDecoding): a split-KV kernel
and the combine kernel that merges the splits by their log-sum-exp. Launched by
fa_bench.kernels.decode_attention, which documents the layouts and the rules (the number
of splits, the key block, the row block).

Conventions, shared with the prefill kernels (fa_bench.kernels.flash_attention):
- scores live in the log2 domain: s2 = (q·k) · scale · log2(e), so exp2 replaces exp, and
  the kernels write lse2 = log2(sum_j exp2(s2_j)); the launcher turns it into a natural
  log for the caller;
- causal is bottom-right: query token t of a sequence with context length L (and Sq new
  tokens) sees keys j <= L - Sq + t.

One program of the split kernel owns one (sequence, KV head, row block, split). Its rows
are the (query token, query head) pairs of the KV head's GQA group, row r = t · GROUP + g,
so one load of a key block serves every query head of the group and every new token (the
whole point of decoding with GQA: the cache is read once, not GROUP times). A split is a
contiguous run of key blocks of its own sequence; a split past the sequence's last block
is empty and writes lse2 = -inf with a zero output, which the combine weighs by 0.

Paged caches: a key block either lies inside one page (BLOCK_N divides PAGE_SIZE: one
block-table read per block) or covers whole pages (PAGE_SIZE divides BLOCK_N: each key row
reads its page's entry, a gather of BLOCK_N / PAGE_SIZE distinct entries), so small pages
need not mean small blocks.

A split is either a run of consecutive key blocks or (interleave) every num_splits-th
block; see `_decode_split_kernel`.

Triton decides when these functions are defined whether to interpret them, so
TRITON_INTERPRET must be set before this module (or triton) is first imported.
"""

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from fa_bench.kernels.decode_merge import _merge_tile_if_last
from fa_bench.kernels.flash_kernels import check_shapes


@triton.jit
def _load_block(ptrs, cols, seqlen, offs_d, HEAD_DIM: tl.constexpr, MASKED, MASK_D):
    """Load a (BLOCK_N, HEAD_DIM_PAD) key or value block. MASKED: keys past the sequence
    length read as 0 (a contiguous cache may end mid-block; a page's stale tail may hold
    anything, NaN included, and must not reach the sums); MASK_D: padding columns."""
    if MASKED and MASK_D:
        return tl.load(
            ptrs, mask=(cols[:, None] < seqlen) & (offs_d[None, :] < HEAD_DIM), other=0.0
        )
    elif MASKED:
        return tl.load(ptrs, mask=cols[:, None] < seqlen, other=0.0)
    elif MASK_D:
        return tl.load(ptrs, mask=offs_d[None, :] < HEAD_DIM, other=0.0)
    else:
        return tl.load(ptrs)


@triton.jit
def _attend(
    # the online-softmax state of the program's rows, the rows' queries, and the last key
    # each row sees (seqlen - SEQ_Q + t)
    acc, l_i, m_i, q, last_key,
    # K/V bases of this (sequence, KV head): the batch offset is in them for a contiguous
    # cache, the page offset is added per block for a paged one
    k_base, v_base, stride_kp, stride_ks, stride_vp, stride_vs, bt_base,
    # the key blocks blk_lo, blk_lo + step, ... below blk_hi to stream, the sequence length
    # and the log2-domain scale
    blk_lo, blk_hi, step, seqlen, offs_d, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
    # PAGED / PAGE_SIZE: constexpr so that a contiguous cache pays no block-table read and
    # the page arithmetic of a power-of-two page is shifts
    PAGED: tl.constexpr, PAGE_SIZE: tl.constexpr,
    # MASKED: this loop covers the blocks that hold the causal diagonal or the sequence's
    # end; the other loop only blocks every row sees whole, so it pays no mask
    MASKED: tl.constexpr, MASK_D: tl.constexpr, DOT_PREC: tl.constexpr,
):  # fmt: skip
    offs_n = tl.arange(0, BLOCK_N)
    for blk in range(blk_lo, blk_hi, step):
        start_n = blk * BLOCK_N
        cols = start_n + offs_n
        if PAGED:
            if BLOCK_N <= PAGE_SIZE:
                # the block lies in one page: one table entry
                page = tl.load(bt_base + start_n // PAGE_SIZE).to(tl.int64)
                in_page = start_n % PAGE_SIZE + offs_n
                k_rows = page * stride_kp + in_page * stride_ks
                v_rows = page * stride_vp + in_page * stride_vs
            else:
                # the block spans BLOCK_N / PAGE_SIZE pages: each key row looks up its own
                # (a gather of a few distinct entries); entries past the sequence's pages
                # may be anything (-1 in the tests), so the masked loop does not read them
                if MASKED:
                    pages = tl.load(bt_base + cols // PAGE_SIZE, mask=cols < seqlen, other=0)
                else:
                    pages = tl.load(bt_base + cols // PAGE_SIZE)
                pages = pages.to(tl.int64)
                in_page = cols % PAGE_SIZE
                k_rows = pages * stride_kp + in_page * stride_ks
                v_rows = pages * stride_vp + in_page * stride_vs
        else:
            k_rows = cols.to(tl.int64) * stride_ks
            v_rows = cols.to(tl.int64) * stride_vs
        k = _load_block(
            k_base + k_rows[:, None] + offs_d[None, :], cols, seqlen, offs_d, HEAD_DIM,
            MASKED, MASK_D,
        )  # fmt: skip
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PREC)
        if MASKED:
            keep = (cols[None, :] < seqlen) & (cols[None, :] <= last_key[:, None])
            qk = tl.where(keep, qk * qk_scale, float("-inf"))
            m_ij = tl.maximum(m_i, tl.max(qk, 1))
            # a row that has seen no key in this split keeps m = -inf: subtract 0 instead
            m_safe = tl.where(m_ij == float("-inf"), 0.0, m_ij)
            p = tl.math.exp2(qk - m_safe[:, None])
            alpha = tl.math.exp2(m_i - m_safe)
        else:
            m_ij = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            p = tl.math.exp2(qk * qk_scale - m_ij[:, None])
            alpha = tl.math.exp2(m_i - m_ij)
        v = _load_block(
            v_base + v_rows[:, None] + offs_d[None, :], cols, seqlen, offs_d, HEAD_DIM,
            MASKED, MASK_D,
        )  # fmt: skip
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=DOT_PREC)
        l_i = l_i * alpha + tl.sum(p, 1)
        m_i = m_ij
    return acc, l_i, m_i


@triton.jit
def _decode_split_kernel(
    # tensors: q (B, Sq, Hq, D); the caches (contiguous (B, S_max, Hkv, D) or paged
    # (num_pages, page_size, Hkv, D)); cache_seqlens (B,) int32; block_table (B, max_pages)
    # int32 (paged only); o (B, Sq, Hq, D) and lse2 (B, Hq, Sq) fp32, written directly when
    # there is one split; else the fp32 workspaces o_part (B, Sq, Hq, splits, D) and
    # lse_part (B, Sq, Hq, splits), contiguous
    Q, K, V, SeqLens, BlockTable, Out, Lse, OPart, LsePart,
    # FUSED only: one int32 per (sequence, KV head, row block), 0 between launches: how
    # many of its splits have written their partials (see the end of the kernel)
    Counters,
    # strides in elements; the last dimension's stride is 1. stride_kb is the batch stride
    # of a contiguous cache (0 when paged), stride_kp the page stride (0 when contiguous)
    stride_qb, stride_qs, stride_qh,
    stride_kb, stride_kp, stride_ks, stride_kh,
    stride_vb, stride_vp, stride_vs, stride_vh,
    stride_btb, stride_ob, stride_os, stride_oh, stride_lb, stride_lh,
    # sizes and scale · log2(e)
    heads_kv, row_blocks, qk_scale,
    # constexpr: the register tiles (HEAD_DIM_PAD, BLOCK_ROWS, BLOCK_N) must be
    # compile-time; GROUP and SEQ_Q turn the row -> (token, head) split into shifts and
    # the causal bound into constants; SPLIT selects the workspace store
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    GROUP: tl.constexpr, SEQ_Q: tl.constexpr,
    BLOCK_ROWS: tl.constexpr, BLOCK_N: tl.constexpr,
    PAGED: tl.constexpr, PAGE_SIZE: tl.constexpr, SPLIT: tl.constexpr, DOT_PREC: tl.constexpr,
    # how the splits share a sequence's key blocks (runs or interleaved, see below)
    INTERLEAVE: tl.constexpr,
    # SPLIT only: the last split program of a row block to finish combines its rows
    # (FUSED), else the combine kernel does; SPLITS_PAD: the splits padded to a power of two
    FUSED: tl.constexpr = False, SPLITS_PAD: tl.constexpr = 1,
    # programmatic dependent launch (sm_90): the combine kernel, launched with launch_pdl,
    # may start once every split program has started (see `_decode_combine_kernel`)
    PDL: tl.constexpr = False,
    # every block through the masked loop (DecodeConfig.one_loop): one pipelined loop
    ONE_LOOP: tl.constexpr = False,
    # FUSED only: the last program merges its row block's rows at once, CHUNK splits'
    # partials in flight together (fa_bench.kernels.decode_merge), not row by row
    MERGE_TILE: tl.constexpr = False, CHUNK: tl.constexpr = 1,
):  # fmt: skip
    """One program: the rows of one row block of one (sequence, KV head) against one
    split of that sequence's keys."""
    check_shapes(HEAD_DIM, HEAD_DIM_PAD, BLOCK_ROWS, BLOCK_N)
    if PDL:
        # at the start: the combine's launch and its programs' start-up then overlap this
        # kernel's whole run instead of following its last program
        gdc_launch_dependents()
    if PAGED:
        tl.static_assert(
            PAGE_SIZE % BLOCK_N == 0 or BLOCK_N % PAGE_SIZE == 0,
            "a key block lies in one page or covers whole pages",
        )
    MASK_D: tl.constexpr = HEAD_DIM != HEAD_DIM_PAD
    pid = tl.program_id(0)
    split = tl.program_id(1)
    num_splits = tl.num_programs(1)
    row_block = pid % row_blocks
    off_bh = pid // row_blocks
    off_b = (off_bh // heads_kv).to(tl.int64)
    off_hk = (off_bh % heads_kv).to(tl.int64)
    seqlen = tl.load(SeqLens + off_b)

    # rows r = t * GROUP + g: query token t, query head off_hk * GROUP + g
    rows = row_block * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    row_ok = rows < GROUP * SEQ_Q
    tok = rows // GROUP
    head = off_hk * GROUP + rows % GROUP
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    q_ptrs = (
        Q + off_b * stride_qb + tok[:, None] * stride_qs + head[:, None] * stride_qh
        + offs_d[None, :]
    )  # fmt: skip
    q = tl.load(q_ptrs, mask=row_ok[:, None] & (offs_d[None, :] < HEAD_DIM), other=0.0)
    last_key = seqlen - SEQ_Q + tok

    # This split's share of the sequence's key blocks. Runs (interleave 0): blocks
    # [split · per, (split + 1) · per), per = cdiv(blocks, splits), so the last splits of
    # a short sequence may be short or empty. Interleaved (1): blocks split, split + S,
    # split + 2S, ...: the programs running at one time read neighbouring blocks (a
    # copy's access pattern) rather than points a power-of-two distance apart.
    n_blocks = tl.cdiv(seqlen, BLOCK_N)
    if INTERLEAVE:
        step = num_splits
        blk_lo = split
        blk_hi = n_blocks
    else:
        step = 1
        per_split = tl.cdiv(n_blocks, num_splits)
        blk_lo = split * per_split
        blk_hi = tl.minimum(blk_lo + per_split, n_blocks)
    # keys [0, n_full) are seen by every row (row t = 0 sees up to seqlen - SEQ_Q) and lie
    # in whole blocks inside the sequence: no mask there. The masked loop starts at the
    # split's first block at or past them.
    full_blocks = tl.maximum(seqlen - SEQ_Q + 1, 0) // BLOCK_N
    masked_lo = blk_lo + tl.cdiv(tl.maximum(full_blocks - blk_lo, 0), step) * step
    if ONE_LOOP:
        # no unmasked loop (below): the masked one streams the whole split
        masked_lo = blk_lo

    k_base = K + off_b * stride_kb + off_hk * stride_kh
    v_base = V + off_b * stride_vb + off_hk * stride_vh
    bt_base = BlockTable + off_b * stride_btb
    m_i = tl.full([BLOCK_ROWS], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_ROWS], dtype=tl.float32)
    acc = tl.zeros([BLOCK_ROWS, HEAD_DIM_PAD], dtype=tl.float32)
    if not ONE_LOOP:
        acc, l_i, m_i = _attend(
            acc, l_i, m_i, q, last_key, k_base, v_base, stride_kp, stride_ks, stride_vp,
            stride_vs, bt_base, blk_lo, tl.minimum(blk_hi, full_blocks), step, seqlen,
            offs_d, qk_scale,
            HEAD_DIM, BLOCK_N, PAGED, PAGE_SIZE, False, MASK_D, DOT_PREC,
        )  # fmt: skip
    acc, l_i, m_i = _attend(
        acc, l_i, m_i, q, last_key, k_base, v_base, stride_kp, stride_ks, stride_vp,
        stride_vs, bt_base, masked_lo, blk_hi, step, seqlen, offs_d, qk_scale,
        HEAD_DIM, BLOCK_N, PAGED, PAGE_SIZE, True, MASK_D, DOT_PREC,
    )  # fmt: skip

    # A row that saw no key in this split (an empty split, or keys beyond its causal
    # bound): output 0 and lse2 = -inf, so the combine gives it weight 0. With one split
    # every row sees at least one key (seqlen >= SEQ_Q).
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    acc = acc / l_safe[:, None]
    lse2 = tl.where(empty, float("-inf"), m_i + tl.math.log2(l_safe))
    d_ok = offs_d[None, :] < HEAD_DIM
    if SPLIT:
        heads_q = heads_kv * GROUP
        part_row = ((off_b * SEQ_Q + tok) * heads_q + head) * num_splits + split
        tl.store(LsePart + part_row, lse2, mask=row_ok)
        o_ptrs = OPart + part_row[:, None] * HEAD_DIM + offs_d[None, :]
        tl.store(o_ptrs, acc, mask=row_ok[:, None] & d_ok)
        if FUSED and MERGE_TILE:
            _merge_tile_if_last(
                OPart, LsePart, Out, Lse, Counters + pid, off_b, off_hk, row_block,
                stride_ob, stride_os, stride_oh, stride_lb, stride_lh, heads_q, num_splits,
                HEAD_DIM, HEAD_DIM_PAD, GROUP, SEQ_Q, BLOCK_ROWS, CHUNK,
            )  # fmt: skip
        elif FUSED:
            _combine_if_last(
                OPart, LsePart, Out, Lse, Counters + pid, off_b, off_hk, row_block,
                stride_ob, stride_os, stride_oh, stride_lb, stride_lh, heads_q, num_splits,
                HEAD_DIM, HEAD_DIM_PAD, SPLITS_PAD, GROUP, SEQ_Q, BLOCK_ROWS,
            )  # fmt: skip
    else:
        tl.store(Lse + off_b * stride_lb + head * stride_lh + tok, lse2, mask=row_ok)
        o_ptrs = (
            Out + off_b * stride_ob + tok[:, None] * stride_os + head[:, None] * stride_oh
            + offs_d[None, :]
        )  # fmt: skip
        tl.store(o_ptrs, acc.to(Out.dtype.element_ty), mask=row_ok[:, None] & d_ok)


@triton.jit
def _combine_row(
    OPart, LsePart, Out, Lse, row, off_b, off_t, off_h,
    stride_ob, stride_os, stride_oh, stride_lb, stride_lh, num_splits,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, SPLITS_PAD: tl.constexpr,
    CACHE: tl.constexpr,
):  # fmt: skip
    """One output row (sequence b, token t, query head h; row = (b · Sq + t) · Hq + h):
    o = the splits' outputs weighted by exp2(lse2_s - max), lse2 = max + log2(sum of the
    weights). CACHE: the loads' cache modifier (".cg" where other SMs wrote the
    partials during this launch: past the L1, which is not coherent)."""
    offs_s = tl.arange(0, SPLITS_PAD)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    s_ok = offs_s < num_splits
    lse = tl.load(
        LsePart + row * num_splits + offs_s, mask=s_ok, other=float("-inf"), cache_modifier=CACHE
    )
    m = tl.max(lse, 0)  # finite: every row sees a key in some split
    # empty splits (lse2 = -inf) and the padding weigh exactly 0
    w = tl.where(lse == float("-inf"), 0.0, tl.math.exp2(lse - m))
    o_ptrs = OPart + (row * num_splits + offs_s)[:, None] * HEAD_DIM + offs_d[None, :]
    parts = tl.load(
        o_ptrs, mask=s_ok[:, None] & (offs_d[None, :] < HEAD_DIM), other=0.0, cache_modifier=CACHE
    )
    total = tl.sum(w, 0)
    o = tl.sum(parts * w[:, None], 0) / total
    out_ptrs = Out + off_b * stride_ob + off_t * stride_os + off_h * stride_oh + offs_d
    tl.store(out_ptrs, o.to(Out.dtype.element_ty), mask=offs_d < HEAD_DIM)
    tl.store(Lse + off_b * stride_lb + off_h * stride_lh + off_t, m + tl.math.log2(total))


@triton.jit
def _combine_if_last(
    OPart, LsePart, Out, Lse, counter, off_b, off_hk, row_block,
    stride_ob, stride_os, stride_oh, stride_lb, stride_lh, heads_q, num_splits,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, SPLITS_PAD: tl.constexpr,
    GROUP: tl.constexpr, SEQ_Q: tl.constexpr, BLOCK_ROWS: tl.constexpr,
):  # fmt: skip
    """The fused combine: called by every split program of a row block after it stored
    its partials; the last of them to arrive combines the row block's rows and puts the
    counter back to 0 for the next launch (so a planned launch is re-launchable as is).

    Ordering: the barrier makes every thread's partial stores precede the one thread's
    atomic in the CTA; the atomic is acq_rel at GPU scope, so the release sequence on the
    counter carries each split program's stores to the program whose increment comes
    last, and its acquire (then the barrier again) orders them before its loads."""
    tl.debug_barrier()
    arrived = tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu")
    tl.debug_barrier()
    if arrived == num_splits - 1:
        # the row block's rows, one at a time: each reads all the splits of its row at
        # once, as the combine kernel's program does (the same arithmetic, the same bits)
        first = row_block * BLOCK_ROWS
        last = tl.minimum(first + BLOCK_ROWS, GROUP * SEQ_Q)
        for r in range(first, last):
            off_t = r // GROUP
            off_h = off_hk * GROUP + r % GROUP
            row = (off_b * SEQ_Q + off_t) * heads_q + off_h
            _combine_row(
                OPart, LsePart, Out, Lse, row, off_b, off_t, off_h,
                stride_ob, stride_os, stride_oh, stride_lb, stride_lh, num_splits,
                HEAD_DIM, HEAD_DIM_PAD, SPLITS_PAD, ".cg",
            )  # fmt: skip
        tl.atomic_xchg(counter, 0, sem="relaxed", scope="gpu")


@triton.jit
def _decode_combine_kernel(
    # the split kernel's workspaces (contiguous), the output and lse2 (see above)
    OPart, LsePart, Out, Lse,
    stride_ob, stride_os, stride_oh, stride_lb, stride_lh,
    heads_q, seq_q, num_splits,
    # constexpr: register tiles
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, SPLITS_PAD: tl.constexpr,
    # launched with launch_pdl after a split kernel with PDL: wait for that grid to finish
    # (and its writes to be visible) before reading its partials
    PDL: tl.constexpr = False,
):  # fmt: skip
    """One program per output row (sequence b, token t, query head h), `_combine_row`."""
    if PDL:
        gdc_wait()
    row = tl.program_id(0).to(tl.int64)  # = (b * seq_q + t) * heads_q + h
    off_h = row % heads_q
    off_t = (row // heads_q) % seq_q
    off_b = row // (heads_q * seq_q)
    _combine_row(
        OPart, LsePart, Out, Lse, row, off_b, off_t, off_h,
        stride_ob, stride_os, stride_oh, stride_lb, stride_lh, num_splits,
        HEAD_DIM, HEAD_DIM_PAD, SPLITS_PAD, "",
    )  # fmt: skip
