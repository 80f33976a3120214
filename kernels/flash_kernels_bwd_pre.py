"""The backward's preprocessing `@triton.jit` kernel, delta = rowsum(dO·O), shared by
the two-kernel and the one-pass backward (re-exported by flash_kernels_bwd, where the
launchers find it; its own module keeps flash_kernels_bwd under 400 lines).

Triton decides when these functions are defined whether to interpret them, so
TRITON_INTERPRET must be set before this module (or triton) is first imported.
"""

import triton
import triton.language as tl

from fa_bench.kernels.flash_kernels import check_shapes, load_rows, store_rows


@triton.jit
def _bwd_preprocess_kernel(
    # tensors: the forward's output, its gradient, and delta (B, Hq, Sq) fp32 to write
    Out, DO, DELTA,
    # strides in elements (batch, head, seq); the last dimension's stride is 1
    stride_ob, stride_oh, stride_os, stride_dob, stride_doh, stride_dos,
    # sizes
    heads_q, seq_q,
    # constexpr: register tile shapes
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, BLOCK_M: tl.constexpr,
    # the Gluon backward's fp32 dQ workspace (B, Hq, Sq, HEAD_DIM), contiguous, zeroed here
    # (None: not given, the kernel compiles as without it)
    DQ_WS=None,
):  # fmt: skip
    """delta[row] = sum_d dO[row, d] · O[row, d] in fp32, for BLOCK_M rows per program;
    with DQ_WS those rows of the workspace zeroed too (one launch for both: the Gluon
    backward's first, queued before the host builds the rest)."""
    # no tl.dot here, but its 64-row tile meets the same rule
    check_shapes(HEAD_DIM, HEAD_DIM_PAD, BLOCK_M, BLOCK_M)
    pid_m = tl.program_id(0)
    off_bh = tl.program_id(1)
    off_b = (off_bh // heads_q).to(tl.int64)
    off_h = (off_bh % heads_q).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    o_base = Out + off_b * stride_ob + off_h * stride_oh
    do_base = DO + off_b * stride_dob + off_h * stride_doh
    o = load_rows(o_base, offs_m, stride_os, offs_d, seq_q, HEAD_DIM, True, True)
    do = load_rows(do_base, offs_m, stride_dos, offs_d, seq_q, HEAD_DIM, True, True)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)
    tl.store(DELTA + off_bh.to(tl.int64) * seq_q + offs_m, delta, mask=offs_m < seq_q)
    if DQ_WS is not None:
        ws = DQ_WS + off_bh.to(tl.int64) * seq_q * HEAD_DIM
        zero = tl.zeros([BLOCK_M, HEAD_DIM_PAD], dtype=tl.float32)
        store_rows(ws, offs_m, HEAD_DIM, offs_d, seq_q, zero, HEAD_DIM, True,
                   HEAD_DIM != HEAD_DIM_PAD)  # fmt: skip
