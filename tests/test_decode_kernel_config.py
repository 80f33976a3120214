"""The decode kernel's launch parameters (fa_bench.kernels.decode_config): key blocks that
cover several pages, interleaved splits, warps and stages, validation, and the rules
of the heuristic. CPU: the interpreter against test_decode_kernel's float64 reference
(NaN past every length and in unused pages, -1 in unused table entries). GPU (`-m gpu`):
the compiled launches in bf16 against plain PyTorch's error, as test_decode_kernel's.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

pytest.importorskip("triton")

from test_decode_kernel import (
    FP32_TOL,
    _dtype_reference,
    make_inputs,
    reference,
)

from fa_bench.kernels import decode_attention
from fa_bench.kernels.decode_config import (
    DecodeConfig,
    Launch,
    check_config,
    combine_defaults,
    resolve,
)

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
cpu_only = pytest.mark.skipif(not INTERPRETED, reason="needs TRITON_INTERPRET=1 (CPU runs)")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available() or INTERPRETED, reason="needs CUDA")


def run(lengths, sq, hq, hkv, *, page_size=0, num_splits=None, config=None, d=16, **kw):
    q, k, v, seqlens, table = make_inputs(lengths, sq, hq, hkv, d, page_size=page_size, **kw)
    o, lse = decode_attention(
        q, k, v, cache_seqlens=seqlens, block_table=table, num_splits=num_splits,
        config=config, return_lse=True,
    )  # fmt: skip
    return (o, lse), reference(q, k, v, seqlens, table)


def assert_matches(lengths, sq, hq, hkv, **kw):
    (o, lse), (want_o, want_lse) = run(lengths, sq, hq, hkv, **kw)
    torch.testing.assert_close(o.double(), want_o, **FP32_TOL)
    torch.testing.assert_close(lse.double(), want_lse, **FP32_TOL)


# ---------------------------------------------------------------------------------------
# CPU: the interpreter, fp32


slow = pytest.mark.slow


@cpu_only
@pytest.mark.parametrize(
    ("page_size", "block_n", "num_splits"),
    [
        (16, 64, 3),  # blocks of 4 pages
        pytest.param(16, 64, 1, marks=slow),
        pytest.param(16, 32, 1, marks=slow),
        pytest.param(16, 32, 3, marks=slow),
        pytest.param(32, 128, 1, marks=slow),
        pytest.param(32, 128, 3, marks=slow),
    ],
)
def test_blocks_covering_several_pages(page_size, block_n, num_splits):
    # lengths: 1, a page boundary, a block boundary, mid-page, one past a block; the
    # unused table entries (-1) past each sequence's pages are never read
    lengths = [1, page_size, block_n, 3 * page_size + 5, 2 * block_n + 1]
    assert_matches(lengths, 1, 4, 2, page_size=page_size, num_splits=num_splits,
                   config=DecodeConfig(block_n=block_n))  # fmt: skip


@cpu_only
@slow
def test_blocks_covering_pages_with_speculative_rows():
    # Sq 4: the causal diagonal crosses a page inside the last block
    assert_matches([66, 4, 130], 4, 8, 2, page_size=16, num_splits=2,
                   config=DecodeConfig(block_n=64))  # fmt: skip


@cpu_only
@pytest.mark.parametrize(
    ("page_size", "num_splits"),
    [(0, 7)]
    + [
        pytest.param(p, n, marks=slow)
        for p in (0, 16)
        for n in (2, 3, 7, 40)  # 40: more splits than blocks
        if (p, n) != (0, 7)
    ],
)
def test_interleaved_splits(page_size, num_splits):
    # ragged lengths with a short sequence whose blocks fall in the first splits only,
    # and Sq 3 whose masked blocks land in different splits
    assert_matches([200, 17, 3, 161], 3, 4, 1, page_size=page_size, num_splits=num_splits,
                   config=DecodeConfig(block_n=16, interleave=True))  # fmt: skip


@cpu_only
def test_interleaved_equals_runs():
    kw = dict(page_size=32, num_splits=5)
    (o_runs, lse_runs), _ = run([300, 77], 2, 4, 2, config=DecodeConfig(block_n=16), **kw)
    (o_int, lse_int), _ = run([300, 77], 2, 4, 2, config=DecodeConfig(16, interleave=True), **kw)
    torch.testing.assert_close(o_int, o_runs, **FP32_TOL)
    torch.testing.assert_close(lse_int, lse_runs, **FP32_TOL)


@cpu_only
@slow
@pytest.mark.parametrize(
    "config",
    [DecodeConfig(block_n=32, num_warps=2, num_stages=1), DecodeConfig(128, 8, 5, True)],
)
def test_warps_stages_and_wide_blocks(config):
    assert_matches([500, 129], 1, 8, 2, config=config, num_splits=2)


@pytest.mark.parametrize(
    ("config", "page_size", "message"),
    [
        ("bn64", None, "config must be a DecodeConfig or None, got str"),
        (DecodeConfig(block_n=48), None, "config.block_n must be a power of two"),
        (DecodeConfig(block_n=8), None, "from 16 to 256, got 8"),
        (DecodeConfig(block_n=512), None, "got 512"),
        (DecodeConfig(block_n=True), None, "got True"),
        (DecodeConfig(block_n=32), 48, "config.block_n 32 must divide page_size 48"),
        (DecodeConfig(num_warps=3), None, "config.num_warps must be one of"),
        (DecodeConfig(num_warps=4.0), None, "got 4.0"),
        (DecodeConfig(num_stages=0), None, "config.num_stages must be an integer from 1 to 8"),
        (DecodeConfig(num_stages=9), None, "got 9"),
        (DecodeConfig(interleave=1), None, "config.interleave must be a bool or None, got 1"),
    ],
)
def test_bad_config_names_field_and_value(config, page_size, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        check_config(config, page_size)


def test_valid_configs_pass():
    for page, bn in [(None, 256), (16, 64), (48, 16), (256, 64), (64, 256)]:
        check_config(DecodeConfig(block_n=bn, num_warps=8, num_stages=5, interleave=True), page)
    check_config(None, 16)


def test_decode_attention_checks_its_config():
    q, k, v, seqlens, table = make_inputs([20], 1, 2, 1, 16, page_size=48)
    with pytest.raises(ValueError, match=r"config\.block_n 32 must divide page_size 48"):
        decode_attention(q, k, v, cache_seqlens=seqlens, block_table=table,
                         config=DecodeConfig(block_n=32))  # fmt: skip


def test_resolve_keeps_set_fields_and_fills_the_rest():
    base = dict(programs=8, capacity=131072, page_size=None, sms=132)
    heur = resolve(None, None, **base)
    assert isinstance(heur, Launch) and heur.num_splits > 1
    fixed = resolve(DecodeConfig(128, 8, 2, True), 7, **base)
    # the combine fields a config leaves None follow the heuristic's rule (16 rows a program)
    fused, tile = combine_defaults(7, 16)
    assert fixed == Launch(block_n=128, num_warps=8, num_stages=2, interleave=True, num_splits=7,
                           fused_combine=fused, merge_tile=tile)  # fmt: skip
    partial = resolve(DecodeConfig(num_warps=2), None, **base)
    assert partial.num_warps == 2 and partial.block_n == heur.block_n
    assert partial.num_splits == heur.num_splits and partial.num_stages == heur.num_stages


# ---------------------------------------------------------------------------------------
# GPU: the compiled launches in bf16


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize(
    ("page_size", "config", "num_splits"),
    [
        (16, DecodeConfig(64, 4, 5), 5),  # a block over 4 pages, pipelined table reads
        (16, DecodeConfig(128, 8, 4), None),
        (64, DecodeConfig(64, 4, 6), 16),
        (256, DecodeConfig(128, 4, 5), 3),
        (0, DecodeConfig(128, 8, 3, True), 33),  # interleaved
        (0, DecodeConfig(32, 4, 6, True), 128),
        (0, DecodeConfig(256, 8, 2), 2),
    ],
)
def test_gpu_configs_within_pytorch_error(page_size, config, num_splits):
    lengths = [4097, 16, 1000, 8192, 1, 3333]
    q, k, v, seqlens, table = make_inputs(
        lengths, 1, 32, 8, 128, page_size=page_size, dtype=torch.bfloat16, device="cuda"
    )
    o = decode_attention(q, k, v, cache_seqlens=seqlens, block_table=table,
                         num_splits=num_splits, config=config)  # fmt: skip
    want = reference(q, k, v, seqlens, table)[0]
    base = (_dtype_reference(q, k, v, seqlens, table).double().cpu() - want).abs().max().item()
    err = (o.double().cpu() - want).abs().max().item()
    floor = torch.finfo(torch.bfloat16).eps * want.abs().max().item()
    assert err <= 2 * base + floor, (err, base, floor)


@cpu_only
def test_adapter_label_names_the_launch(monkeypatch):
    from fa_bench import registry
    from fa_bench.case import Case
    from fa_bench.run.execute import make_inputs as case_inputs

    registry.load()
    case = Case(impl="triton", mode="decode", dtype="fp32", batch=2, heads_q=4, heads_kv=2,
                seqlen_q=1, seqlen_k=300, head_dim=16, causal=True, page_size=16)  # fmt: skip
    q, k, v, _ = case_inputs(case, torch.device("cpu"))
    # the interpreter's 4 SMs: 4 programs want 2 splits; blocks of 16 keys fit pages of 16
    # the interpreter's 4 SMs, 4 programs far below saturation: as many splits as 10 key
    # blocks of 32 (pages of 16, two per block) allow at 4 blocks each
    # (without session 11's deeper pipeline, which would take one split of 64 keys here)
    monkeypatch.setenv("FA_BENCH_DECODE_DEEP", "0")
    label = registry.get("triton").prepare(case, q, k, v).backend
    assert label == (
        "triton-decode: paged (pages, 16, Hkv, D), shuffled block table; heuristic: "
        "2 splits, block_n 32, 4 warps, 5 stages, fused combine (tile); JIT launch (the "
        "interpreter launches through triton's JIT)"
    )
    fixed = registry.get("triton").prepare(case, q, k, v, {"num_splits": 5}).backend
    assert "; fixed splits: 5 splits, block_n 32," in fixed


def test_long_paged_blocks_give_way_to_one_wave():
    """Session 5's call D: batch 64 x 128k paged (512 programs) at the long-context 64-key
    blocks and 5 stages (3 programs per SM, d128 bf16) ran a partial second wave, 0.80-0.86
    x SDPA; the 32-key blocks fit 4 per SM, one wave, as at batch 64 x 32k (1.05 x copy)."""
    from fa_bench.kernels.decode_config import Tile, resolve, slots

    tile = Tile(16, 128, 2, True)
    assert (slots(tile, 64, 5), slots(tile, 32, 5)) == (3, 4)

    def launch(batch, ctx, page, config=None):
        got = resolve(config, None, programs=batch * 8, capacity=ctx, page_size=page, sms=132)
        return got.block_n, got.num_stages, got.num_splits

    for page in (16, 64, 256):
        assert launch(64, 131072, page) == (32, 5, 1)
    assert launch(8, 131072, 64)[:2] == (64, 5)  # 64 programs: one wave either way
    assert launch(1, 131072, 16) == (64, 5, 33)  # the tuned batch-1 launch stays
    assert launch(256, 65536, 64) == (64, 3, 1)  # two full waves or more: 64/3 stays
    assert launch(64, 131072, 64, DecodeConfig(block_n=64)) == (64, 5, 1)  # fixed: kept
