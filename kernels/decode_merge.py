"""The decode kernel's tile merge (issue 20, session 8): the splits' partial outputs of one
(sequence, KV head, row block) merged for all its rows at once, i.e. the GQA group x Sq
rows of a split program, in one program. Two users:

- the split kernel's fused combine (`DecodeConfig(fused_combine=True, merge_tile=True)`):
  the last split program of a row block to finish merges it (`_merge_tile_if_last`), so
  there is no second launch and the merges of the row blocks that finish early overlap
  the split kernel's tail;
- the tile combine kernel (`fused_combine=False, merge_tile=True`): one program per row
  block instead of one per output row, after the split kernel (by PDL where it is on).

Why a tile: session 5's fused combine merged a row block's rows one after the other, each
row waiting on its partials from the L2 (16 round trips at GQA 4 x Sq 4); here every
split's partials for every row are loaded in one go (CHUNK splits at a time: the loads of
a chunk are independent of each other and of the arithmetic, so they are in flight
together) and merged online: a running max m, the running sum l and the output rescaled
as a split with a larger lse2 arrives (the prefill kernels' online softmax over splits
instead of keys). The result equals the combine kernel's (max first, then the weights)
within fp32 rounding; the order of the sums differs.

Conventions as fa_bench.kernels.decode_kernels: lse2 in the log2 domain, a split that
saw no key of a row stored lse2 = -inf and a zero output (weight exactly 0 here), the
workspaces o_part (B, Sq, Hq, splits, D) and lse_part (B, Sq, Hq, splits) fp32,
contiguous. TRITON_INTERPRET must be set before this module is first imported.
"""

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait


@triton.jit
def _merge_rows(
    OPart, LsePart, Out, Lse, off_b, off_hk, row_block,
    stride_ob, stride_os, stride_oh, stride_lb, stride_lh, heads_q, num_splits,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, GROUP: tl.constexpr,
    SEQ_Q: tl.constexpr, BLOCK_ROWS: tl.constexpr, CHUNK: tl.constexpr, CACHE: tl.constexpr,
):  # fmt: skip
    """Merge the splits of one row block's rows (r = t · GROUP + g) and write their o and
    lse2. CACHE: the loads' cache modifier (".cg" where other SMs wrote the partials
    during this launch: past the L1, which is not coherent)."""
    rows = row_block * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    row_ok = rows < GROUP * SEQ_Q
    tok = rows // GROUP
    head = off_hk * GROUP + rows % GROUP
    # the row's first split in the workspaces (off_b is int64: no overflow)
    part_row = ((off_b * SEQ_Q + tok) * heads_q + head) * num_splits
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    d_ok = offs_d[None, :] < HEAD_DIM
    m = tl.full([BLOCK_ROWS], float("-inf"), dtype=tl.float32)
    l_sum = tl.zeros([BLOCK_ROWS], dtype=tl.float32)
    acc = tl.zeros([BLOCK_ROWS, HEAD_DIM_PAD], dtype=tl.float32)
    # num_stages=1: the chunk's loads are already in flight together; a software
    # pipeline over chunks would only add shared memory to the split kernel
    for s0 in tl.range(0, num_splits, CHUNK, num_stages=1):
        for c in tl.static_range(CHUNK):
            s = s0 + c
            # (a tensor compare: s and num_splits are plain ints in the interpreter)
            ok = row_ok & (rows * 0 + s < num_splits)
            lse = tl.load(LsePart + part_row + s, mask=ok, other=float("-inf"),
                          cache_modifier=CACHE)  # fmt: skip
            part = tl.load(
                OPart + (part_row + s)[:, None] * HEAD_DIM + offs_d[None, :],
                mask=ok[:, None] & d_ok, other=0.0, cache_modifier=CACHE,
            )  # fmt: skip
            m_new = tl.maximum(m, lse)
            # rows that have seen only empty splits so far keep m = -inf: subtract 0
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.math.exp2(m - m_safe)  # exp2(-inf) = 0: nothing merged yet
            w = tl.math.exp2(lse - m_safe)  # an empty split (lse2 = -inf) weighs 0
            acc = acc * alpha[:, None] + part * w[:, None]
            l_sum = l_sum * alpha + w
            m = m_new
    # every real row sees a key in some split (l > 0); padding rows are not stored
    l_safe = tl.where(l_sum == 0.0, 1.0, l_sum)
    o = acc / l_safe[:, None]
    o_ptrs = (
        Out + off_b * stride_ob + tok[:, None] * stride_os + head[:, None] * stride_oh
        + offs_d[None, :]
    )  # fmt: skip
    tl.store(o_ptrs, o.to(Out.dtype.element_ty), mask=row_ok[:, None] & d_ok)
    tl.store(Lse + off_b * stride_lb + head * stride_lh + tok, m + tl.math.log2(l_safe),
             mask=row_ok)  # fmt: skip


@triton.jit
def _merge_tile_if_last(
    OPart, LsePart, Out, Lse, counter, off_b, off_hk, row_block,
    stride_ob, stride_os, stride_oh, stride_lb, stride_lh, heads_q, num_splits,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, GROUP: tl.constexpr,
    SEQ_Q: tl.constexpr, BLOCK_ROWS: tl.constexpr, CHUNK: tl.constexpr,
):  # fmt: skip
    """The fused combine with the tile merge: called by every split program of a row
    block after it stored its partials; the last to arrive merges the row block and puts
    the counter back to 0 for the next launch. Ordering as decode_kernels'
    `_combine_if_last`: the barrier puts every thread's partial stores before the one
    atomic of the CTA, acq_rel at GPU scope carries each program's stores to the program
    whose increment comes last, and its acquire (then the barrier) orders its loads."""
    tl.debug_barrier()
    arrived = tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu")
    tl.debug_barrier()
    if arrived == num_splits - 1:
        _merge_rows(
            OPart, LsePart, Out, Lse, off_b, off_hk, row_block,
            stride_ob, stride_os, stride_oh, stride_lb, stride_lh, heads_q, num_splits,
            HEAD_DIM, HEAD_DIM_PAD, GROUP, SEQ_Q, BLOCK_ROWS, CHUNK, ".cg",
        )  # fmt: skip
        tl.atomic_xchg(counter, 0, sem="relaxed", scope="gpu")


@triton.jit
def _decode_combine_tile_kernel(
    # the split kernel's workspaces (contiguous), the output and lse2
    OPart, LsePart, Out, Lse,
    stride_ob, stride_os, stride_oh, stride_lb, stride_lh,
    heads_kv, row_blocks, num_splits,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, GROUP: tl.constexpr,
    SEQ_Q: tl.constexpr, BLOCK_ROWS: tl.constexpr, CHUNK: tl.constexpr,
    # launched with launch_pdl after a split kernel with PDL: wait for that grid
    PDL: tl.constexpr = False,
):  # fmt: skip
    """One program per (sequence, KV head, row block), the split kernel's first grid
    axis: `_merge_rows`."""
    if PDL:
        gdc_wait()
    pid = tl.program_id(0)
    row_block = pid % row_blocks
    off_bh = pid // row_blocks
    off_b = (off_bh // heads_kv).to(tl.int64)
    off_hk = (off_bh % heads_kv).to(tl.int64)
    _merge_rows(
        OPart, LsePart, Out, Lse, off_b, off_hk, row_block,
        stride_ob, stride_os, stride_oh, stride_lb, stride_lh, heads_kv * GROUP, num_splits,
        HEAD_DIM, HEAD_DIM_PAD, GROUP, SEQ_Q, BLOCK_ROWS, CHUNK, "",
    )  # fmt: skip
