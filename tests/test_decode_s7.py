"""Issue 20, session 7 (batch 8 x 8k at Sq 4 and 64/8 heads), on the CPU:
DecodeConfig.one_loop (every key block through the masked loop) checked, resolved and,
in the interpreter (fp32), against the float64 reference over ragged lengths, shuffled
pages, Sq 1/4, GQA 1/4/8 and several split counts; tools/gpu/decode_s7_targets.toml
holds every batch 8 x 8k case of the decode suite, with the suite's ids, first.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

pytest.importorskip("triton")

from test_decode_kernel import FP32_TOL, make_inputs, reference

from fa_bench.kernels import decode_attention
from fa_bench.kernels.decode_config import DecodeConfig, check_config, resolve

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
cpu_only = pytest.mark.skipif(not INTERPRETED, reason="needs TRITON_INTERPRET=1 (CPU runs)")
TOOLS = Path(__file__).resolve().parent.parent / "tools" / "gpu"


def test_one_loop_is_checked_and_resolved() -> None:
    with pytest.raises(ValueError, match=r"config.one_loop must be a bool or None, got 1"):
        check_config(DecodeConfig(one_loop=1), None)  # type: ignore[arg-type]
    kw = dict(programs=64, capacity=8192, page_size=None, sms=132)
    assert resolve(DecodeConfig(one_loop=True), None, **kw).one_loop is True
    assert resolve(DecodeConfig(one_loop=False), None, **kw).one_loop is False


def _run(lengths, sq, hq, hkv, page_size, splits, config, d=16):
    q, k, v, seqlens, table = make_inputs(lengths, sq, hq, hkv, d, page_size=page_size)
    o, lse = decode_attention(
        q, k, v, cache_seqlens=seqlens, block_table=table, num_splits=splits,
        config=config, return_lse=True,
    )  # fmt: skip
    return (o, lse), reference(q, k, v, seqlens, table)


@cpu_only
@pytest.mark.parametrize(
    ("page_size", "sq", "hq", "hkv", "splits", "block_n"),
    [
        (16, 4, 8, 2, 3, 16),  # Sq 4, GQA 4, shuffled pages, blocks within a page
        (0, 1, 8, 1, 2, 16),  # GQA 8, contiguous
        pytest.param(16, 1, 4, 4, 7, 32, marks=pytest.mark.slow),  # blocks of 2 pages
        pytest.param(32, 4, 8, 1, 40, 16, marks=pytest.mark.slow),  # splits > blocks
    ],
)
def test_one_loop_matches_float64(page_size, sq, hq, hkv, splits, block_n) -> None:
    # lengths: Sq, a page boundary, mid-page, one past a block
    lengths = [max(1, sq), 32, 53, 2 * block_n + 1]
    config = DecodeConfig(block_n=block_n, one_loop=True)
    (o, lse), (want_o, want_lse) = _run(lengths, sq, hq, hkv, page_size, splits, config)
    torch.testing.assert_close(o.double(), want_o, **FP32_TOL)
    torch.testing.assert_close(lse.double(), want_lse, **FP32_TOL)


@cpu_only
def test_one_loop_and_two_loops_agree() -> None:
    # the same blocks, the same order, the same arithmetic on whole blocks but for the
    # masks: within fp32 rounding of each other
    kw = dict(lengths=[70, 4, 33], sq=4, hq=4, hkv=2, page_size=16, splits=2)
    (o1, l1), _ = _run(**kw, config=DecodeConfig(block_n=16, one_loop=True))
    (o2, l2), _ = _run(**kw, config=DecodeConfig(block_n=16, one_loop=False))
    torch.testing.assert_close(o1, o2, **FP32_TOL)
    torch.testing.assert_close(l1, l2, **FP32_TOL)


def _order(name: str) -> list:
    from fa_bench import registry
    from fa_bench.commands.run_plan import interleave_impls
    from fa_bench.suite.expand import load_suite

    registry.load()
    return interleave_impls(load_suite(TOOLS / name).cases)


def test_the_targets_run_every_batch_8_x_8k_case_of_the_suite_first() -> None:
    from fa_bench.suite.expand import load_suite

    suite = [
        c
        for c in load_suite(Path(__file__).resolve().parent.parent / "suites" / "decode.toml").cases
        if c.impl in ("triton", "sdpa")
    ]
    ids = {c.id for c in suite}
    order = _order("decode_s7_targets.toml")
    assert all(c.id in ids for c in order)  # the suite's cases, the suite's ids
    want = {c.id for c in suite if (c.batch, c.seqlen_k) == (8, 8192)}
    assert len(want) == 24
    assert {c.id for c in order[:24]} == want
    # the call-0 misses (Sq 4, 64/8 heads) first
    assert {(c.seqlen_q, c.heads_q) for c in order[:8]} == {(4, 32), (1, 64)}
    assert [c.impl for c in order[:2]] == ["triton", "sdpa"]


@cpu_only
@pytest.mark.slow
def test_the_ab_tool_runs_end_to_end_in_the_interpreter(tmp_path) -> None:
    import json
    import subprocess
    import sys

    out = tmp_path / "ab.json"
    env = {**os.environ, "TRITON_INTERPRET": "1", "DEADLINE_S": "300"}
    done = subprocess.run(
        [sys.executable, str(TOOLS / "decode_s7_ab.py"), "--smoke", "--json", str(out)],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    variants = [r["variant"] for r in rows]
    # the table-order shape after the first three shapes (here: after both)
    assert variants == [
        "sdpa", "heuristic", "one loop", "s8 bn64 st4",
        "sdpa", "heuristic", "s16 bn64 st2",
        "sdpa", "shuffled table", "ordered table",
    ]  # fmt: skip
    # every candidate computes what the heuristic does; the ordered table the same bits
    assert all(r["max_diff"] < 1e-5 for r in rows if "max_diff" in r)
    assert rows[-1]["max_diff"] == 0.0
    assert "one-loop" in rows[2]["launch"] and rows[6]["launch"].startswith("s16 bn64")
    assert "| b2 hq16 sq4" in done.stdout


# the split kernel compiled for sm_90 (no GPU: triton.compile to cubin) at session 7's
# launches: key/value loads software pipelined (asynchronous copies), no spills, shared
# memory within the H200's 227 KB per block
_COMPILE = """
import os, re
os.environ.pop("TRITON_INTERPRET", None)
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from decode_sm90 import signature
from fa_bench.kernels import decode_kernels as dk

for group, sq, page, bn, stages, one in {launches!r}:
    consts = dict(HEAD_DIM=128, HEAD_DIM_PAD=128, GROUP=group, SEQ_Q=sq, BLOCK_ROWS=16,
                  BLOCK_N=bn, PAGED=bool(page), PAGE_SIZE=page, SPLIT=True,
                  DOT_PREC="tf32", INTERLEAVE=False, FUSED=False, SPLITS_PAD=1, PDL=True,
                  ONE_LOOP=one)
    sig = signature(dk._decode_split_kernel, consts, "bf16")
    attrs = {{(i,): [["tt.divisibility", 16]] for i, name in
             enumerate(dk._decode_split_kernel.arg_names) if name not in consts
             and (sig[name][0] == "*" or name.startswith("stride_"))}}
    src = ASTSource(fn=dk._decode_split_kernel, signature=sig, constexprs=consts, attrs=attrs)
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                       options=dict(num_warps=4, num_stages=stages))
    spills = len(re.findall(r"\\b(ld|st)\\.local", k.asm["ptx"]))
    copies = k.asm["ttgir"].count("async_copy_global_to_local")
    print(group, sq, page, bn, stages, one, copies, spills, k.metadata.shared)
"""
S7_LAUNCHES = [
    (4, 4, 0, 64, 2, True),  # Sq 4, one loop, contiguous
    (4, 4, 64, 32, 5, True),  # Sq 4, one loop, pages of 64
    (8, 1, 64, 64, 4, True),  # GQA 8, 64-key blocks, one loop
    (4, 4, 0, 64, 7, False),  # one program per SM, 6 blocks in flight
    (4, 1, 64, 64, 8, False),  # paged, 3 blocks in flight
]


@pytest.mark.slow
def test_session_7_launches_compile_for_sm90_pipelined() -> None:
    import subprocess
    import sys

    from decode_sm90 import subprocess_env

    code = _COMPILE.format(launches=S7_LAUNCHES)
    env = subprocess_env()  # no interpreter; tests/ on the path (decode_sm90)
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line.split() for line in done.stdout.splitlines()]
    assert len(lines) == len(S7_LAUNCHES), done.stdout
    for *_, copies, spills, shared in lines:
        assert int(copies) > 0 and int(spills) == 0, done.stdout
        assert int(shared) <= 227 * 1024, done.stdout
