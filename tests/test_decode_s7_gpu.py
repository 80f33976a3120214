"""GPU (`-m gpu`): the decode launches session 7 measures at batch 8 x 8k (issue 20,
tools/gpu/decode_s7_ab.py's candidates: split counts 4-16, 32/64-key blocks at 2-5
stages, 2 and 4 warps, one block loop, with and without PDL) and the heuristic's own
launches at those shapes, each against the float64 reference built from the gathered
pages: ragged lengths (1, Sq, a page boundary, mid-page, the capacity), shuffled block
tables with NaN in every unused page slot, Sq 1 and 4, GQA 4 and 8; bf16 held to twice
plain PyTorch attention's error in the same dtype plus the rounding floor, as
tests/test_decode_kernel.py's GPU tests; and the planned launch (bound) bit for bit the
JIT launch of the same config.
"""

from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("triton")

from test_decode_kernel import _dtype_reference, make_inputs, reference

from fa_bench.kernels import decode_attention
from fa_bench.kernels.decode_config import DecodeConfig
from fa_bench.kernels.decode_plan import plan_decode

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available() or INTERPRETED, reason="needs CUDA")
pytestmark = [pytest.mark.gpu, needs_cuda]

# (num_splits, DecodeConfig fields): decode_s7_ab.py's candidates, contiguous and paged
CONTIG = [
    (None, {}),
    (None, {"one_loop": True}),
    (4, {"block_n": 64, "num_stages": 3, "one_loop": True}),
    (6, {"block_n": 64, "num_stages": 2}),
    (12, {"block_n": 64, "num_stages": 2}),
    (16, {"block_n": 32, "num_stages": 3}),
    (8, {"block_n": 64, "num_stages": 2, "num_warps": 2}),
    (8, {"pdl": False, "one_loop": True}),
    (2, {"block_n": 64, "num_stages": 6}),
    (1, {"block_n": 64, "num_stages": 7}),
    (2, {"block_n": 128, "num_stages": 4}),
    (4, {"block_n": 64, "num_stages": 4}),
]
PAGED = [
    (None, {}),
    (None, {"one_loop": True}),
    (8, {"block_n": 64, "num_stages": 4, "one_loop": True}),
    (4, {"block_n": 64, "num_stages": 5}),
    (16, {"block_n": 32, "num_stages": 5}),
    (16, {"block_n": 64, "num_stages": 3}),
    (8, {"block_n": 32, "num_stages": 4, "one_loop": True}),
    (8, {"block_n": 32, "num_stages": 5, "num_warps": 2}),
    (2, {"block_n": 64, "num_stages": 8}),
    (4, {"block_n": 64, "num_stages": 7}),
]
# ragged: 1 (Sq at Sq 4), a page of 64, mid-page, the capacity, a page and a key; at 16
# splits of 32 keys the longest has 5 blocks per split, the shorter ones empty splits
LENGTHS = [2100, 1, 64, 1025, 2100, 333, 65, 2048]


def _check(sq: int, hq: int, page_size: int, splits, kw: dict) -> None:
    lengths = [max(n, sq) for n in LENGTHS]
    q, k, v, seqlens, table = make_inputs(
        lengths, sq, hq, 8, 128, page_size=page_size, dtype=torch.bfloat16, device="cuda"
    )
    config = DecodeConfig(**kw)
    o = decode_attention(
        q, k, v, cache_seqlens=seqlens, block_table=table, num_splits=splits, config=config
    )
    want = reference(q, k, v, seqlens, table)[0]
    base = (_dtype_reference(q, k, v, seqlens, table).double().cpu() - want).abs().max().item()
    err = (o.double().cpu() - want).abs().max().item()
    floor = torch.finfo(torch.bfloat16).eps * want.abs().max().item()
    assert err <= 2 * base + floor, (err, base, floor)
    # the planned launch (bound after its first run) is the JIT launch, bit for bit
    plan = plan_decode(q, k, v, cache_seqlens=seqlens, block_table=table, num_splits=splits,
                       config=config)  # fmt: skip
    plan.run()
    torch.testing.assert_close(plan.run(), o, atol=0, rtol=0)
    assert plan.bound, plan.bound_reason


@pytest.mark.parametrize(("sq", "hq"), [(4, 32), (1, 64)])
@pytest.mark.parametrize(("splits", "kw"), CONTIG)
def test_gpu_contiguous_launches_match_float64(sq, hq, splits, kw) -> None:
    _check(sq, hq, 0, splits, kw)


@pytest.mark.parametrize(("sq", "hq"), [(4, 32), (1, 64)])
@pytest.mark.parametrize(("splits", "kw"), PAGED)
def test_gpu_paged_launches_match_float64(sq, hq, splits, kw) -> None:
    _check(sq, hq, 64, splits, kw)


@pytest.mark.parametrize("page_size", [16, 256])
@pytest.mark.parametrize("kw", [{}, {"one_loop": True}])
def test_gpu_other_pages_sq4_match_float64(page_size, kw) -> None:
    _check(4, 32, page_size, None, kw)
