"""The decode kernel's fused combine (issue 20): with several splits, the last split
program of each (sequence, KV head, row block) to finish merges the splits in the same
launch (DecodeConfig(fused_combine=True)); the two-kernel path stays for A/B.

CPU: the interpreter (fp32) against the float64 reference of tests/test_decode_kernel.py
over issue 20's CPU matrix (ragged lengths including 1 and a page boundary, pages that do
and do not divide the lengths, shuffled tables, Sq > 1, GQA 1/4/8, split counts including
more splits than blocks), the counters left at zero for the next launch, repeated calls
and planned runs that reuse them. GPU (`-m gpu`): the fused launch within rounding of
the two-kernel one (the compiled kernels may order the combine's sums differently; one
split: the same launch, bit for bit), and a planned fused launch re-launched 200 times
bit for bit with its counters back at 0.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

pytest.importorskip("triton")

from test_decode_kernel import FP32_TOL, make_inputs, reference

from fa_bench.kernels import decode_attention
from fa_bench.kernels.decode_attention import _launch_calls, plan_launch
from fa_bench.kernels.decode_config import DecodeConfig, check_config
from fa_bench.kernels.decode_plan import plan_decode
from fa_bench.kernels.flash_config import pad_pow2

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
cpu_only = pytest.mark.skipif(not INTERPRETED, reason="needs TRITON_INTERPRET=1 (CPU runs)")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available() or INTERPRETED, reason="needs CUDA")

FUSED = DecodeConfig(fused_combine=True)
TWO = DecodeConfig(fused_combine=False)


def _check_fused(lengths, sq, hq, hkv, d, *, page_size=0, num_splits=None, seed=0, config=FUSED):
    q, k, v, seqlens, table = make_inputs(lengths, sq, hq, hkv, d, page_size=page_size, seed=seed)
    o, lse = decode_attention(q, k, v, cache_seqlens=seqlens, block_table=table,
                              num_splits=num_splits, return_lse=True, config=config)  # fmt: skip
    want_o, want_lse = reference(q, k, v, seqlens, table)
    torch.testing.assert_close(o.double(), want_o, **FP32_TOL)
    torch.testing.assert_close(lse.double(), want_lse, **FP32_TOL)
    return q, k, v, seqlens, table


# ---------------------------------------------------------------------------------------
# CPU: which launches a call makes


def test_the_fused_launch_is_one_kernel_and_the_two_kernel_launch_two() -> None:
    q, k, v, seqlens, _ = make_inputs([40, 9], 1, 4, 2, 16)
    for config, kernels in ((FUSED, 1), (TWO, 2)):
        launch = plan_launch(q, k, None, 3, config)
        assert launch.num_splits == 3 and launch.fused_combine is (kernels == 1)
        _, _, calls = _launch_calls(q, k, v, seqlens, None, 0.25, launch)
        assert len(calls) == kernels
        args, kw = calls[0][2], calls[0][3]
        assert kw["FUSED"] is (kernels == 1) and kw["SPLITS_PAD"] == (
            pad_pow2(3) if kernels == 1 else 1
        )
        if kernels == 1:  # one zeroed counter per (sequence, KV head, row block)
            counters = args[9]
            assert counters.dtype == torch.int32 and counters.tolist() == [0] * 4
    # one split: no combine either way, one launch
    launch = plan_launch(q, k, None, 1, FUSED)
    assert len(_launch_calls(q, k, v, seqlens, None, 0.25, launch)[2]) == 1


@pytest.mark.parametrize("bad", [1, "yes", 0.0])
def test_a_bad_fused_combine_is_refused_naming_it(bad) -> None:
    with pytest.raises(
        ValueError, match=f"config.fused_combine must be a bool or None, got {bad!r}"
    ):
        check_config(DecodeConfig(fused_combine=bad), None)


# ---------------------------------------------------------------------------------------
# CPU: the interpreter against float64


@cpu_only
@pytest.mark.parametrize(
    ("lengths", "page_size", "num_splits"),
    [
        ([1, 16, 45], 16, 3),  # length 1, exactly one page, 45 not a multiple of 16
        ([45, 96], 48, 2),  # page 48: 96 on a boundary, 45 inside the first page
        ([33, 7], 32, 12),  # more splits than any sequence has blocks: most are empty
    ],
    ids=["p16-s3", "p48-s2", "p32-s12-empty"],
)
def test_fused_paged_ragged_matches_float64(lengths, page_size, num_splits):
    _check_fused(lengths, 1, 4, 1, 32, page_size=page_size, num_splits=num_splits)


@cpu_only
@pytest.mark.slow
@pytest.mark.parametrize(
    ("lengths", "sq", "group", "num_splits"),
    [
        ([130, 3], 3, 1, 3),  # Sq > 1 with L == Sq, GQA 1
        ([70, 64], 4, 8, 2),  # GQA 8, 64 exactly one block
        ([129], 1, 4, 40),  # 3 blocks, 40 splits
        ([200, 31], 2, 4, None),  # the heuristic's split count
    ],
    ids=["sq3-g1-s3", "sq4-g8-s2", "g4-s40", "sq2-g4-auto"],
)
def test_fused_contiguous_matches_float64(lengths, sq, group, num_splits):
    _check_fused(lengths, sq, 2 * group, 2, 40, num_splits=num_splits)


@cpu_only
@pytest.mark.slow
def test_fused_two_row_blocks_and_speculative_pages():
    # GROUP 8 × Sq 16: two row blocks, each with its own counter
    _check_fused([40, 17], 16, 8, 1, 16, num_splits=3)
    _check_fused([5, 50], 5, 4, 2, 16, page_size=16, num_splits=2)


@cpu_only
@pytest.mark.slow
def test_fused_and_two_kernel_agree_in_the_interpreter():
    # the same per-row arithmetic (_combine_row): the same bits in the interpreter
    q, k, v, seqlens, table = make_inputs([77, 300, 16], 2, 8, 2, 32, page_size=16, seed=3)
    outs = [decode_attention(q, k, v, cache_seqlens=seqlens, block_table=table, num_splits=5,
                             return_lse=True, config=c) for c in (FUSED, TWO)]  # fmt: skip
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])


@cpu_only
def test_repeated_planned_runs_reuse_the_counters_and_follow_new_contents():
    q, k, v, seqlens, table = make_inputs([90, 33], 1, 8, 2, 16, page_size=16, seed=1)
    plan = plan_decode(q, k, v, cache_seqlens=seqlens, block_table=table, num_splits=4,
                       config=FUSED)  # fmt: skip
    counters = plan._calls[0][2][9]
    assert plan.launch.fused_combine and len(plan._calls) == 1
    first = plan.run().clone()
    assert counters.tolist() == [0] * 4  # put back by the launch that used them
    for _ in range(2):
        assert torch.equal(plan.run(), first)
        assert counters.tolist() == [0] * 4
    torch.testing.assert_close(first.double(), reference(q, k, v, seqlens, table)[0], **FP32_TOL)
    q.mul_(-0.5)  # new contents, the same storage: the next run follows them
    again = plan.run()
    torch.testing.assert_close(again.double(), reference(q, k, v, seqlens, table)[0], **FP32_TOL)


@cpu_only
@pytest.mark.slow
@pytest.mark.parametrize("page_size", [0, 16, 64])
@pytest.mark.parametrize("sq", [1, 4])
@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("num_splits", [2, 9, None])
def test_fused_grid_matches_float64(page_size, sq, group, num_splits):
    lengths = [sq, 16, 64, 100, 131]  # Sq itself, a page boundary, ragged
    _check_fused(lengths, sq, 2 * group, 2, 64, page_size=page_size, num_splits=num_splits,
                 seed=sq)  # fmt: skip


# ---------------------------------------------------------------------------------------
# GPU: the compiled fused launch against the two-kernel one


def _gpu_inputs(lengths, page_size, sq=1, hq=32, hkv=8, dtype=torch.bfloat16):
    return make_inputs(lengths, sq, hq, hkv, 128, page_size=page_size, dtype=dtype,
                       device="cuda")  # fmt: skip


def _assert_same_up_to_rounding(fused, two, want):
    """Fused and two-kernel outputs of one launch: the same per-row arithmetic, but the
    compiler may lay the [splits, D] tile out (so order its sums) differently in each
    kernel: lse2 alike to fp32 rounding, o to one rounding of its dtype, and no further
    from the float64 reference than the two-kernel output plus that rounding."""
    (o_f, lse_f), (o_t, lse_t) = fused, two
    torch.testing.assert_close(lse_f, lse_t, rtol=1e-6, atol=1e-6)
    eps = torch.finfo(o_f.dtype).eps
    torch.testing.assert_close(o_f.float(), o_t.float(), rtol=eps, atol=1e-6)
    floor = eps * want.abs().max().item()
    err_f = (o_f.double().cpu() - want).abs().max().item()
    err_t = (o_t.double().cpu() - want).abs().max().item()
    assert torch.isfinite(o_f).all() and err_f <= err_t + floor, (err_f, err_t, floor)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("page_size", [0, 64])
@pytest.mark.parametrize(("sq", "splits"), [(1, 7), (4, 16), (1, 128)])
def test_gpu_fused_matches_the_two_kernel_launch(page_size, sq, splits):
    # splits that do and do not fill a wave; 128: more splits than the short sequences'
    # blocks (empty splits)
    q, k, v, seqlens, table = _gpu_inputs([4097, 16, 3000, 1000], page_size, sq=sq)
    got = [decode_attention(q, k, v, cache_seqlens=seqlens, block_table=table,
                            num_splits=splits, return_lse=True, config=c)
           for c in (FUSED, TWO)]  # fmt: skip
    _assert_same_up_to_rounding(got[0], got[1], reference(q, k, v, seqlens, table)[0])


@pytest.mark.gpu
@needs_cuda
def test_gpu_one_split_is_the_same_launch_either_way():
    q, k, v, seqlens, table = _gpu_inputs([4097, 16, 3000], 64)
    got = [decode_attention(q, k, v, cache_seqlens=seqlens, block_table=table, num_splits=1,
                            return_lse=True, config=c) for c in (FUSED, TWO)]  # fmt: skip
    assert torch.equal(got[0][0], got[1][0]) and torch.equal(got[0][1], got[1][1])


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("page_size", [0, 16])
def test_gpu_fused_plan_relaunches_bit_for_bit(page_size):
    q, k, v, seqlens, table = _gpu_inputs([32768], page_size)
    plan = plan_decode(q, k, v, cache_seqlens=seqlens, block_table=table, config=FUSED)
    first = plan.run().clone()
    assert plan.launch.num_splits > 1 and len(plan._calls) == 1
    assert plan.bound, plan.bound_reason
    counters = plan._calls[0][2][9]
    for _ in range(200):  # many launches back to back: any counter left behind shows
        plan.run()
    torch.cuda.synchronize()
    assert torch.equal(plan.o, first) and not counters.any()
    config = DecodeConfig(fused_combine=False, block_n=plan.launch.block_n,
                          num_stages=plan.launch.num_stages)  # fmt: skip
    two = decode_attention(
        q,
        k,
        v,
        cache_seqlens=seqlens,
        block_table=table,
        num_splits=plan.launch.num_splits,
        return_lse=True,
        config=config,
    )
    _assert_same_up_to_rounding((first, plan.lse()), two, reference(q, k, v, seqlens, table)[0])


@cpu_only
@pytest.mark.slow
def test_the_adapter_takes_the_combine_as_an_option_and_names_it():
    from fa_bench import registry
    from fa_bench.case import Case
    from fa_bench.run.accuracy import check_accuracy
    from fa_bench.run.execute import make_inputs as case_inputs

    registry.load()
    case = Case(impl="triton", mode="decode", dtype="fp32", batch=2, heads_q=4, heads_kv=2,
                seqlen_q=1, seqlen_k=300, head_dim=16, causal=True, page_size=16)  # fmt: skip
    q, k, v, _ = case_inputs(case, torch.device("cpu"))
    impl = registry.get("triton")
    # merge_tile named too: the default merges a few splits' row block at once (tile); 2
    # splits fixed (on the interpreter's 4 SMs session 11's deeper pipeline takes 1)
    opts = {"num_splits": 2, "merge_tile": False}
    fused = impl.prepare(case, q, k, v, {**opts, "fused_combine": True})
    assert "5 stages, fused combine; JIT launch" in fused.backend
    assert check_accuracy(case, q, k, v, fused.fn(q, k, v))["passed"]
    two = impl.prepare(case, q, k, v, {**opts, "fused_combine": False}).backend
    assert "5 stages, combine kernel; JIT launch" in two
    one = impl.prepare(case, q, k, v, {"num_splits": 1, "fused_combine": True}).backend
    assert "combine" not in one  # one split: nothing to merge
