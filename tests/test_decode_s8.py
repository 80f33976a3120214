"""Issue 20, session 8 (the combine off the critical path), on the CPU: the tile merge
(kernels/decode_merge.py) in the fused combine's last program and in the tile combine
kernel, through the interpreter (fp32) against the float64 reference of
tests/test_decode_kernel.py: ragged lengths including 1 (or Sq) and a page boundary,
shuffled pages, Sq 1/4/16, GQA 1/4/8, two row blocks, more splits than blocks, splits
over several merge chunks; against the row-by-row combine within fp32 rounding; the
counters back at 0 after a fused launch and repeated planned runs; DecodeConfig.merge_tile
and $FA_BENCH_DECODE_COMBINE checked and resolved; the merge chunk rule; the pick and
A/B tools; and (slow) the launches compiled for sm_90.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

pytest.importorskip("triton")

from test_decode_kernel import FP32_TOL, make_inputs, reference

from fa_bench.kernels import decode_attention
from fa_bench.kernels.decode_attention import _launch_calls, plan_launch
from fa_bench.kernels.decode_config import (
    COMBINE_ENV,
    DecodeConfig,
    check_config,
    merge_chunk,
    resolve,
)
from fa_bench.kernels.decode_plan import plan_decode

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
cpu_only = pytest.mark.skipif(not INTERPRETED, reason="needs TRITON_INTERPRET=1 (CPU runs)")
TOOLS = Path(__file__).resolve().parent.parent / "tools" / "gpu"

FUSED_TILE = DecodeConfig(fused_combine=True, merge_tile=True)
TILE = DecodeConfig(fused_combine=False, merge_tile=True)
ROWS = DecodeConfig(fused_combine=False, merge_tile=False)


def _run(lengths, sq, hq, hkv, page_size, splits, config, d=16, seed=0):
    q, k, v, seqlens, table = make_inputs(lengths, sq, hq, hkv, d, page_size=page_size,
                                          seed=seed)  # fmt: skip
    got = decode_attention(q, k, v, cache_seqlens=seqlens, block_table=table,
                           num_splits=splits, config=config, return_lse=True)  # fmt: skip
    return got, reference(q, k, v, seqlens, table)


def _assert_ref(got, want) -> None:
    torch.testing.assert_close(got[0].double(), want[0], **FP32_TOL)
    torch.testing.assert_close(got[1].double(), want[1], **FP32_TOL)


# ---------------------------------------------------------------------------------------
# The option, the environment override, the chunk


def test_merge_tile_is_checked_and_resolved(monkeypatch) -> None:
    monkeypatch.delenv(COMBINE_ENV, raising=False)
    with pytest.raises(ValueError, match=r"config.merge_tile must be a bool or None, got 'y'"):
        check_config(DecodeConfig(merge_tile="y"), None)  # type: ignore[arg-type]
    kw = dict(programs=64, capacity=8192, page_size=None, sms=132)
    assert resolve(DecodeConfig(merge_tile=True), None, **kw).merge_tile is True
    assert resolve(DecodeConfig(merge_tile=False), None, **kw).merge_tile is False


@pytest.mark.parametrize(
    ("name", "fused", "tile"),
    [("rows", False, False), ("tile", False, True), ("fused-tile", True, True),
     ("fused-rows", True, False)],
)  # fmt: skip
def test_the_environment_sets_the_combine_a_config_still_wins(monkeypatch, name, fused, tile):
    monkeypatch.setenv(COMBINE_ENV, name)
    kw = dict(programs=64, capacity=8192, page_size=64, sms=132)
    launch = resolve(None, None, **kw)
    assert (launch.fused_combine, launch.merge_tile) == (fused, tile)
    fixed = resolve(DecodeConfig(fused_combine=not fused, merge_tile=not tile), None, **kw)
    assert (fixed.fused_combine, fixed.merge_tile) == (not fused, not tile)


def test_fused_tile_few_fuses_where_one_chunk_holds_the_splits(monkeypatch) -> None:
    monkeypatch.setenv(COMBINE_ENV, "fused-tile-few")
    # batch 8 x 8k, 8 KV heads (64 programs): 4 splits of 16 rows (session 11's deeper
    # pipeline; 8 before it), one chunk
    b8 = resolve(None, None, programs=64, capacity=8192, page_size=None, sms=132)
    assert b8.num_splits == 4 and (b8.fused_combine, b8.merge_tile) == (True, True)
    # batch 1 x 32k (8 programs): more splits than a chunk: the combine kernel by rows
    b1 = resolve(None, None, programs=8, capacity=32768, page_size=None, sms=132)
    assert b1.num_splits > 8 and (b1.fused_combine, b1.merge_tile) == (False, False)
    # 32 rows a program (GQA 8 x Sq 4): chunks of 4, so 8 splits take rows
    wide = resolve(None, 8, programs=64, capacity=8192, page_size=None, sms=132, block_rows=32)
    assert (wide.fused_combine, wide.merge_tile) == (False, False)


def test_a_bad_environment_combine_is_refused_naming_it(monkeypatch) -> None:
    monkeypatch.setenv(COMBINE_ENV, "fused")
    with pytest.raises(ValueError, match=r"FA_BENCH_DECODE_COMBINE is 'fused'; valid: rows, "):
        resolve(None, None, programs=8, capacity=4096, page_size=None, sms=132)


def test_the_merge_chunk_keeps_128_rows_in_flight() -> None:
    assert merge_chunk(8, 16) == 8  # batch 8 x 8k: every split's partials at once
    assert merge_chunk(3, 16) == 4  # padded to a power of two (the tail masked)
    assert merge_chunk(64, 16) == 8  # many splits: chunks of 8
    assert merge_chunk(8, 64) == 2 and merge_chunk(2, 128) == 1


def test_the_launches_each_combine_makes(monkeypatch) -> None:
    monkeypatch.delenv(COMBINE_ENV, raising=False)
    q, k, v, seqlens, _ = make_inputs([40, 9], 4, 8, 2, 16)
    kernels = {}
    for name, config in (("fused", FUSED_TILE), ("tile", TILE), ("rows", ROWS)):
        launch = plan_launch(q, k, None, 3, config)
        _, _, calls = _launch_calls(q, k, v, seqlens, None, 0.25, launch)
        kernels[name] = [(fn.__name__, grid, kw.get("MERGE_TILE"), kw.get("CHUNK"))
                         for fn, grid, _, kw in calls]  # fmt: skip
    # grid axis 0: B * Hkv * row blocks = 2 * 2 * 1 (rows 4 tokens x group 4 = 16)
    assert kernels["fused"] == [("_decode_split_kernel", (4, 3), True, 4)]
    assert kernels["tile"] == [
        ("_decode_split_kernel", (4, 3), False, 1),
        ("_decode_combine_tile_kernel", (4,), None, 4),
    ]
    assert kernels["rows"][1][:2] == ("_decode_combine_kernel", (2 * 4 * 8,))


# ---------------------------------------------------------------------------------------
# The interpreter against float64


SLOW = pytest.mark.slow
MATRIX = [
    # (fused, lengths, Sq, Hq, Hkv, page, splits): ragged with 1 / Sq, a page boundary
    (True, [1, 32, 53, 70], 1, 8, 2, 16, 3),  # GQA 4, shuffled pages
    (False, [4, 48, 33, 16], 4, 8, 1, 16, 5),  # Sq 4, GQA 8, pages not dividing lengths
    (True, [150, 17], 1, 4, 1, 16, 9),  # 9 splits: chunks of 8 then one (a 2nd chunk)
    pytest.param(False, [1, 32, 53, 70], 1, 8, 2, 16, 3, marks=SLOW),
    pytest.param(True, [4, 48, 33, 16], 4, 8, 1, 16, 5, marks=SLOW),
    # GQA 1, more splits than blocks (empty splits)
    pytest.param(True, [40, 4, 33], 4, 4, 4, 0, 12, marks=SLOW),
    pytest.param(False, [40, 4, 33], 4, 4, 4, 0, 12, marks=SLOW),
    # Sq 16 x GQA 8: two row blocks of 64 rows (chunks of 2 splits)
    pytest.param(True, [70, 16], 16, 8, 1, 32, 3, marks=SLOW),
    pytest.param(False, [70, 16], 16, 8, 1, 32, 3, marks=SLOW),
    pytest.param(False, [150, 17], 1, 4, 1, 16, 9, marks=SLOW),
]


@cpu_only
@pytest.mark.parametrize(("fused", "lengths", "sq", "hq", "hkv", "page", "splits"), MATRIX)
def test_tile_merges_match_float64(fused, lengths, sq, hq, hkv, page, splits) -> None:
    cfg = DecodeConfig(block_n=16, fused_combine=fused, merge_tile=True)
    got, want = _run(lengths, sq, hq, hkv, page, splits, cfg)
    _assert_ref(got, want)


@cpu_only
@pytest.mark.slow
@pytest.mark.parametrize("page", [0, 16, 64])
@pytest.mark.parametrize("sq", [1, 4])
@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("splits", [2, 7, None])
def test_fused_tile_grid_matches_float64(page, sq, group, splits) -> None:
    got, want = _run([sq, 16, 64, 100, 131], sq, 2 * group, 2, page, splits, FUSED_TILE,
                     d=64, seed=sq)  # fmt: skip
    _assert_ref(got, want)


@cpu_only
def test_tile_and_row_merges_agree_to_fp32_rounding() -> None:
    # the same partials merged online (tile) and max-first (rows): one rounding apart
    kw = dict(lengths=[70, 4, 33], sq=4, hq=8, hkv=2, page_size=32, splits=3)
    (o_r, l_r), _ = _run(**kw, config=ROWS)
    for config in (TILE, FUSED_TILE):
        (o_t, l_t), _ = _run(**kw, config=config)
        torch.testing.assert_close(o_t, o_r, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(l_t, l_r, rtol=1e-6, atol=1e-6)


@cpu_only
def test_fused_tile_counters_reset_and_planned_runs_repeat() -> None:
    q, k, v, seqlens, table = make_inputs([53, 4, 32], 4, 8, 2, 16, page_size=16)
    plan = plan_decode(q, k, v, cache_seqlens=seqlens, block_table=table, num_splits=3,
                       config=FUSED_TILE)  # fmt: skip
    counters = plan._calls[0][2][9]
    assert counters.numel() == 3 * 2 and not counters.any()
    first = plan.run().clone()
    assert not counters.any()  # the merging programs put them back to 0
    assert torch.equal(plan.run(), first) and not counters.any()
    # new contents in the same storage: the next run follows them
    k.mul_(-1.0)
    again = plan.run()
    torch.testing.assert_close(again.double(), reference(q, k, v, seqlens, table)[0], **FP32_TOL)
    assert not counters.any()


# ---------------------------------------------------------------------------------------
# Tools


def _pick(tmp_path, rows) -> tuple[str, str]:
    """decode_s8_pick's choice and reasons, in this process (its main reads the file)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("decode_s8_pick", TOOLS / "decode_s8_pick.py")
    assert spec and spec.loader
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    name, why = tool.pick(rows)
    return name, "\n".join(why)


# decode_s7_ab's shape names; the fused-tile launch's split count decides
# fused-tile-few (8 splits of 16 rows: one merge chunk; 32 splits: four)
B8 = "b8 hq32 sq4 8k page64"
B1 = "b1 hq32 sq1 32k contig"
SPLITS = {B8: 8, B1: 32}


def _rows(per_shape: dict[str, dict[str, float]], bad: str = "") -> list[dict]:
    out = []
    for shape, per in per_shape.items():
        for variant, us in per.items():
            launch = f"s{SPLITS[shape]} bn64 w4 st2" + (" fused tile" if "fused" in variant else "")
            diff = 0.5 if variant == bad else 1e-3
            out.append({"shape": shape, "variant": variant, "us": us, "launch": launch,
                        "max_diff": diff})  # fmt: skip
    return out


def test_the_pick_takes_the_fastest_merge_that_loses_nowhere(tmp_path) -> None:
    rows = _rows({B8: {"rows": 75.0, "tile": 73.0, "fused-tile": 70.0},
                  B1: {"rows": 70.0, "tile": 69.5, "fused-tile": 69.0}})  # fmt: skip
    assert _pick(tmp_path, rows)[0] == "fused-tile"
    # fused-tile 3% slower at batch 1's 32 splits: fused-tile-few takes rows there
    rows = _rows({B8: {"rows": 75.0, "tile": 73.0, "fused-tile": 66.0},
                  B1: {"rows": 70.0, "tile": 69.5, "fused-tile": 72.2}})  # fmt: skip
    name, why = _pick(tmp_path, rows)
    assert name == "fused-tile-few", why
    assert "fused-tile-few: geometric mean 1.0660 x rows over 2 shapes, worst 1.0000" in why
    # ... unless tile beats it: the larger geometric mean among those that lose nowhere
    rows = _rows({B8: {"rows": 75.0, "tile": 66.0, "fused-tile": 67.0},
                  B1: {"rows": 70.0, "tile": 69.5, "fused-tile": 72.2}})  # fmt: skip
    assert _pick(tmp_path, rows)[0] == "tile"
    # within noise of rows: rows stays
    rows = _rows({B8: {"rows": 75.0, "tile": 74.9, "fused-tile": 75.2}})
    assert _pick(tmp_path, rows)[0] == "rows"


def test_the_pick_refuses_a_wrong_output(tmp_path) -> None:
    rows = _rows({B8: {"rows": 75.0, "tile": 73.0, "fused-tile": 60.0}}, bad="fused-tile")
    assert _pick(tmp_path, rows)[0] == "tile"


@pytest.mark.slow
def test_the_pick_tool_reads_its_file_and_survives_no_ab(tmp_path) -> None:
    path = tmp_path / "ab.json"
    rows = _rows({B8: {"rows": 75.0, "tile": 73.0, "fused-tile": 70.0}})
    path.write_text(json.dumps({"copy_gbps": 4200.0, "rows": rows}))
    done = subprocess.run([sys.executable, str(TOOLS / "decode_s8_pick.py"), str(path)],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0 and done.stdout.strip() == "fused-tile-few", done.stderr
    assert "picked fused-tile-few" in done.stderr
    done = subprocess.run([sys.executable, str(TOOLS / "decode_s8_pick.py"),
                           str(tmp_path / "missing.json")],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0 and done.stdout.strip() == "rows", done.stderr


@cpu_only
@pytest.mark.slow
def test_the_ab_tool_runs_end_to_end_in_the_interpreter(tmp_path) -> None:
    out = tmp_path / "ab.json"
    env = {**os.environ, "TRITON_INTERPRET": "1", "DEADLINE_S": "600"}
    done = subprocess.run(
        [sys.executable, str(TOOLS / "decode_s8_ab.py"), "--smoke", "--json", str(out)],
        capture_output=True, text=True, timeout=600, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    got = {(r["shape"], r["variant"]): r for r in rows}
    assert got[("b2 hq16 sq4 0k page16", "fused-tile")]["launch"].endswith(
        "s3 bn32 w4 st5 one-loop fused tile"  # one loop: session 11's default at Sq > 1
    )
    assert got[("b2 hq16 sq4 0k page16", "tile")]["launch"].endswith("tile")
    assert all(r["max_diff"] < 1e-5 for r in rows if "max_diff" in r), rows
    assert "| b1 hq16 sq1 0k contig | fused-tile |" in done.stdout


@pytest.mark.slow
def test_the_merges_compile_for_sm90_without_costing_programs_per_sm() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, str(TOOLS / "decode_s8_compile.py")], env=env,
                          capture_output=True, text=True, timeout=900)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    version, *lines = done.stdout.splitlines()
    got = {line.split()[0]: [int(x) for x in line.split()[1:]] for line in lines}
    for name, (_, spills, _, copies, atomics) in got.items():
        assert spills == 0, (name, got)
        assert (atomics > 0) == ("fused" in name), (name, got)
        if name.startswith(("contig", "page")):
            assert copies > 0, (name, got)  # the K/V loads still pipelined
    for cache in ("contig_sq4", "page64_sq4"):
        base, fused = got[f"{cache}_two-kernel"], got[f"{cache}_fused-tile"]
        assert fused[2] == base[2], (cache, got)  # the same shared memory
        # batch 8 x 8k's 512 programs need 4 per SM at 4 warps: at most 128 registers
        # (ptxas' allocation under the H200's triton 3.6.0: 110 and 96; triton 3.9's
        # ptxas takes more, so the bound is only held for the version the GPU runs)
        if version == "triton 3.6.0":
            assert fused[0] <= 128, (cache, got)


@cpu_only
@pytest.mark.slow
def test_the_adapter_takes_the_tile_merge_as_an_option_and_names_it(monkeypatch) -> None:
    from fa_bench import registry
    from fa_bench.case import Case
    from fa_bench.run.accuracy import check_accuracy
    from fa_bench.run.execute import make_inputs as case_inputs

    monkeypatch.delenv(COMBINE_ENV, raising=False)
    registry.load()
    case = Case(impl="triton", mode="decode", dtype="fp32", batch=2, heads_q=4, heads_kv=2,
                seqlen_q=4, seqlen_k=300, head_dim=16, causal=True, page_size=16)  # fmt: skip
    q, k, v, _ = case_inputs(case, torch.device("cpu"))
    impl = registry.get("triton")
    for options, label in (
        ({"fused_combine": True, "merge_tile": True}, "fused combine (tile); JIT launch"),
        ({"fused_combine": False, "merge_tile": True}, "combine kernel (tile); JIT launch"),
    ):
        prepared = impl.prepare(case, q, k, v, {"num_splits": 3, **options})
        assert label in prepared.backend, prepared.backend
        assert check_accuracy(case, q, k, v, prepared.fn(q, k, v))["passed"]
    # the environment's pick reaches a run's adapter
    monkeypatch.setenv(COMBINE_ENV, "fused-tile")
    assert "fused combine (tile)" in impl.prepare(case, q, k, v, {"num_splits": 3}).backend
