"""GPU (`-m gpu`), issue 20 session 8: the tile merges compiled, where programs really run
at once (the interpreter runs them one after another, so only there do the fused
combine's arrival counter and its memory ordering meet concurrency):

- every merge (`rows`, `tile`, `fused-tile`) against the float64 reference in bf16, held
  to twice plain PyTorch attention's error plus the rounding floor
  (tests/test_decode_kernel.py's rule): ragged lengths (1 or Sq, a page boundary,
  mid-page, the capacity), shuffled block tables with NaN in unused slots, contiguous
  and pages 16/64/256, Sq 1 and 4, GQA 4 and 8, 3 to 128 splits (empty splits);
- the tile merges within one rounding of the row-by-row combine;
- planned launches re-run 200 times back to back, bit for bit, the counters back at 0,
  at batch 8 x 8k's launch and at a many-split batch-1 launch; the bound launch bit for
  bit the JIT's.
"""

from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("triton")

from test_decode_fused import _assert_same_up_to_rounding
from test_decode_kernel import _dtype_reference, make_inputs, reference

from fa_bench.kernels import decode_attention
from fa_bench.kernels.decode_config import DecodeConfig
from fa_bench.kernels.decode_plan import plan_decode

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available() or INTERPRETED, reason="needs CUDA")
pytestmark = [pytest.mark.gpu, needs_cuda]

MERGES = {
    "rows": DecodeConfig(fused_combine=False, merge_tile=False),
    "tile": DecodeConfig(fused_combine=False, merge_tile=True),
    "fused-tile": DecodeConfig(fused_combine=True, merge_tile=True),
}
LENGTHS = [2100, 1, 64, 1025, 2100, 333, 65, 2048]


def _inputs(sq, hq, page, lengths=LENGTHS):
    lengths = [max(n, sq) for n in lengths]
    return make_inputs(lengths, sq, hq, 8, 128, page_size=page, dtype=torch.bfloat16,
                       device="cuda")  # fmt: skip


def _call(inputs, splits, config):
    q, k, v, seqlens, table = inputs
    return decode_attention(q, k, v, cache_seqlens=seqlens, block_table=table,
                            num_splits=splits, config=config, return_lse=True)  # fmt: skip


@pytest.mark.parametrize("merge", ["tile", "fused-tile"])
@pytest.mark.parametrize(
    ("sq", "hq", "page", "splits"),
    [(4, 32, 64, 8), (4, 32, 0, 8), (1, 64, 64, 8), (1, 64, 0, 3), (1, 32, 256, 16),
     (4, 32, 16, 128), (1, 32, 0, None)],
)  # fmt: skip
def test_gpu_tile_merges_match_float64_and_the_row_combine(merge, sq, hq, page, splits):
    inputs = _inputs(sq, hq, page)
    got = _call(inputs, splits, MERGES[merge])
    want = reference(*inputs)[0]
    base = (_dtype_reference(*inputs).double().cpu() - want).abs().max().item()
    err = (got[0].double().cpu() - want).abs().max().item()
    floor = torch.finfo(torch.bfloat16).eps * want.abs().max().item()
    assert torch.isfinite(got[0]).all() and err <= 2 * base + floor, (err, base, floor)
    rows = _call(inputs, splits, MERGES["rows"])
    _assert_same_up_to_rounding(got, rows, want)


@pytest.mark.parametrize("merge", ["tile", "fused-tile"])
@pytest.mark.parametrize(
    ("batch", "ctx", "sq", "page"), [(8, 8192, 4, 64), (8, 8192, 1, 0), (1, 32768, 1, 0)]
)
def test_gpu_planned_merges_relaunch_bit_for_bit(merge, batch, ctx, sq, page):
    # the heuristic's split launch at these shapes (8 splits at batch 8 x 8k, more at
    # batch 1 x 32k): many programs finishing at once, all racing for the counters
    q, k, v, seqlens, table = make_inputs([ctx] * batch, sq, 32, 8, 128, page_size=page,
                                          dtype=torch.bfloat16, device="cuda")  # fmt: skip
    plan = plan_decode(q, k, v, cache_seqlens=seqlens, block_table=table, config=MERGES[merge])
    first = plan.run().clone()
    first_lse = plan.lse().clone()
    assert plan.launch.num_splits > 1 and plan.bound, (plan.launch, plan.bound_reason)
    assert len(plan._calls) == (1 if merge == "fused-tile" else 2)
    for _ in range(200):  # back to back: a counter left behind or a torn merge shows
        plan.run()
    torch.cuda.synchronize()
    assert torch.equal(plan.o, first) and torch.equal(plan.lse(), first_lse)
    if merge == "fused-tile":
        assert not plan._calls[0][2][9].any()  # the counters, back at 0
    # the JIT launch of the same config: the same bits
    jit = decode_attention(q, k, v, cache_seqlens=seqlens, block_table=table,
                           num_splits=plan.launch.num_splits, config=MERGES[merge])  # fmt: skip
    assert torch.equal(jit, first)


# decode_s8_ab.py's extra launches with the merges: one block loop, 4 splits (contiguous
# 64 keys at 3 stages, paged 64 keys at 5), no PDL
EXTRAS = [
    (None, {"fused_combine": True, "merge_tile": True, "one_loop": True}),
    (4, {"block_n": 64, "num_stages": 3, "fused_combine": True, "merge_tile": True}),
    (4, {"block_n": 64, "num_stages": 3, "merge_tile": True}),
    (None, {"merge_tile": True, "pdl": False}),
]


@pytest.mark.parametrize("page", [0, 64])
@pytest.mark.parametrize(("splits", "kw"), EXTRAS)
def test_gpu_the_ab_extras_match_float64(page, splits, kw):
    if page and kw.get("num_stages") == 3:
        kw = {**kw, "num_stages": 5}  # the paged 4-split launch of the A/B
    inputs = _inputs(4, 32, page)
    o, _ = _call(inputs, splits, DecodeConfig(**kw))
    want = reference(*inputs)[0]
    base = (_dtype_reference(*inputs).double().cpu() - want).abs().max().item()
    err = (o.double().cpu() - want).abs().max().item()
    floor = torch.finfo(torch.bfloat16).eps * want.abs().max().item()
    assert torch.isfinite(o).all() and err <= 2 * base + floor, (err, base, floor)


# the default combine (the heuristic's, or $FA_BENCH_DECODE_COMBINE's: a GPU script's
# in-process pick) at batch 8 x 8k's launch and with many splits
@pytest.mark.parametrize(("sq", "hq", "page", "splits"), [(4, 32, 64, None), (1, 64, 0, 16)])
def test_gpu_the_default_combine_matches_float64_and_relaunches(sq, hq, page, splits):
    inputs = _inputs(sq, hq, page)
    q, k, v, seqlens, table = inputs
    plan = plan_decode(q, k, v, cache_seqlens=seqlens, block_table=table, num_splits=splits)
    first = plan.run().clone()
    for _ in range(50):
        plan.run()
    torch.cuda.synchronize()
    assert torch.equal(plan.o, first), plan.launch
    want = reference(*inputs)[0]
    base = (_dtype_reference(*inputs).double().cpu() - want).abs().max().item()
    err = (first.double().cpu() - want).abs().max().item()
    floor = torch.finfo(torch.bfloat16).eps * want.abs().max().item()
    assert torch.isfinite(first).all() and err <= 2 * base + floor, (err, base, floor, plan.launch)
