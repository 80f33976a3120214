"""tools/gpu/decode_tune.py and its search space (tools/gpu/decode_space.py): the
candidate grids, split counts and compile keys, and (slow) the whole tool run on the CPU
interpreter at toy sizes with the GPU timing replaced by wall-clock timing, through
the report."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

pytest.importorskip("triton")
sys.path.insert(0, str(Path(__file__).parents[1] / "tools" / "gpu"))

import decode_space as sp
import decode_tune_report

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


def test_paged_grids_fit_their_pages():
    for page in (16, 64, 256):
        for c in sp.phase1(sp.Shape(8, 8192, page), 132):
            assert page % c.block_n == 0 or c.block_n % page == 0
    # the contiguous grid keeps every config; pages of 48 keep only blocks of 16
    assert len(sp.phase1(sp.Shape(1, 4096, 0), 132)) == len(sp.CONTIG_GRID)
    assert sp.phase1(sp.Shape(1, 4096, 48), 132) == []


def test_split_counts_fill_the_gpu_without_flooding_it():
    # batch 1 x 8 KV heads: half a wave (66 programs) needs 9 splits; 16 programs per
    # SM caps at 264; 512 blocks allow up to 256
    assert sp.split_counts(sp.Shape(1, 32768, 0), 64, 132) == [12, 16, 24, 33, 48, 66, 99, 128]
    # batch 64: 512 programs already, so at most 4 splits
    assert sp.split_counts(sp.Shape(64, 8192, 0), 64, 132) == [1, 2, 3, 4]
    # too few blocks for two per split: one split
    assert sp.split_counts(sp.Shape(1, 64, 0), 64, 132) == [1]


def test_phase2_interleaves_only_contiguous_split_launches():
    best = [sp.Cand(64, 4, 3, False, 5)]
    contig = sp.phase2(sp.Shape(64, 8192, 0), best, 132)
    assert [(c.splits, c.interleave) for c in contig] == [
        (1, False), (2, False), (2, True), (3, False), (3, True), (4, False), (4, True)
    ]  # fmt: skip
    paged = sp.phase2(sp.Shape(64, 8192, 64), best, 132)
    assert not any(c.interleave for c in paged) and len(paged) == 4


def test_compile_keys_separate_the_split_and_combine_kernels():
    shape = sp.Shape(8, 8192, 64)
    k5, c5 = sp.compile_keys(shape, sp.Cand(64, 4, 5, False, 5))
    k7, c7 = sp.compile_keys(shape, sp.Cand(64, 4, 5, False, 7))
    assert k5 == k7 and c5 == c7 == (8, False)  # 5 and 7 splits: one combine, padded to 8
    assert sp.compile_keys(shape, sp.Cand(64, 4, 5, False, 16))[1] == (16, True)
    k1, c1 = sp.compile_keys(shape, sp.Cand(64, 4, 5, False, 1))
    assert c1 == () and k1 != k5  # one split: no combine, the split kernel writes o


@pytest.mark.slow
@pytest.mark.skipif(not INTERPRETED, reason="the CPU smoke run needs the interpreter")
def test_the_tool_runs_end_to_end_on_cpu(monkeypatch, tmp_path):
    import decode_tune as dt

    def wall_ms(fn):
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3

    monkeypatch.setattr(dt, "_bench", wall_ms)
    monkeypatch.setattr(dt, "_graphed", lambda fn: fn)
    monkeypatch.setattr(dt, "copy_gbps", lambda: 1.0)
    monkeypatch.setattr(sp, "DEVICE", "cpu")
    monkeypatch.setattr(sp, "DTYPE", "float32")
    monkeypatch.setattr(sp, "HQ", 4)
    monkeypatch.setattr(sp, "HKV", 2)
    monkeypatch.setattr(sp, "D", 16)
    monkeypatch.setattr(sp, "CONTEXTS", ((1, 512), (4, 128)))
    monkeypatch.setattr(sp, "PAGES", (0, 16))
    monkeypatch.setattr(sp, "SQ4_PAGES", (0, 16))
    monkeypatch.setattr(sp, "CONTIG_GRID", ((32, 4, 2), (64, 4, 3)))
    monkeypatch.setattr(sp, "PAGED_GRID", ((16, 4, 5), (32, 4, 5)))
    args = argparse.Namespace(budget=1e9, workers=0, shapes=None, sms=4)
    result = dt.run(args)
    rows = result["rows"]
    shapes = {r["shape"] for r in rows}
    assert len(shapes) == 4 + 4  # 2 contexts x 2 caches at Sq 1; Sq 4 on both caches
    for label in shapes:
        kinds = {r["kind"] for r in rows if r["shape"] == label}
        assert kinds == {"heuristic", "heuristic-plain", "sdpa", "sdpa-plain", "cand"}, label
    assert all(r["ms"] and r["gbps"] > 0 for r in rows), [r for r in rows if not r["ms"]]
    assert {r["phase"] for r in rows if r["kind"] == "cand"} == {1, 2, 3}
    text = decode_tune_report.report(result)
    assert all(label in text for label in shapes)
    assert "| contig | 1 | 32 | 4 | 2 |" in text and "| paged | 4 |" in text


# ---------------------------------------------------------------------------------------
# tools/gpu/decode_check.toml and decode_check_report.py


def _rec(impl, batch, ctx, page, gbps, status="ok", nvml=1.0):
    case = f"b{batch}-hq32-hkv8-sq1-sk{ctx}-d128/" + (f"page{page}" if page else "contig")
    return {
        "id": f"{impl}/decode/bf16/{case}", "impl": impl, "batch": batch, "heads_kv": 8,
        "seqlen_k": ctx, "page_size": page, "status": status, "gbps_model": gbps,
        "telemetry": {"bytes_ratio_measured_to_model": nvml}, "backend": f"{impl} launch",
    }  # fmt: skip


def test_check_targets_follow_the_issue():
    from decode_check_report import target

    assert target(_rec("triton", 8, 8192, 0, 1)) == 0.9  # b x Hkv = 64, 8k
    assert target(_rec("triton", 8, 8192, 64, 1)) == 0.9
    assert target(_rec("triton", 8, 8192, 16, 1)) is None  # pages under 64: no target
    assert target(_rec("triton", 8, 4096, 0, 1)) is None
    assert target(_rec("triton", 1, 32768, 16, 1)) == 0.7  # batch 1, 32k-128k
    assert target(_rec("triton", 1, 8192, 0, 1)) is None


def test_check_report_names_every_miss():
    from decode_check_report import report

    doc = {
        "run": {"started": "t0"},
        "env": {"telemetry": {"calibration": {"available": True, "gbps_copy": 4000.0}}},
        "cases": [
            _rec("triton", 8, 8192, 0, 3800.0),  # 0.95 x copy, beats sdpa
            _rec("sdpa", 8, 8192, 0, 3700.0),
            _rec("triton", 1, 32768, 0, 2000.0),  # 0.5 x copy < 0.7, and < sdpa
            _rec("sdpa", 1, 32768, 0, 2400.0),
            _rec("flex", 1, 32768, 0, None, status="unsupported"),
        ],
    }
    text = report(doc)
    assert "copy bandwidth: 4000 GB/s" in text
    assert "| decode/bf16/b8-hq32-hkv8-sq1-sk8192-d128/contig | 3800 | 0.95 | – | 3700 |" in text
    assert "| unsupported | 2400 | 0.83 |" in text  # flex's status in its cell
    misses = text.split("## Targets missed")[1]
    assert "b1-hq32-hkv8-sq1-sk32768-d128/contig: 0.50 x copy, target 0.7" in misses
    assert "b1-hq32-hkv8-sq1-sk32768-d128/contig: 0.83 x the best peer" in misses
    assert "sk8192" not in misses


def test_check_suite_holds_the_cases_that_matter():
    from fa_bench.suite.expand import load_suite

    suite = load_suite(str(Path(__file__).parents[1] / "tools" / "gpu" / "decode_check.toml"))
    ids = [c.id for c in suite.cases]
    assert len(set(ids)) == 25
    for must in (
        "triton/decode/bf16/b1-hq32-hkv8-sq1-sk32768-d128/contig",
        "sdpa/decode/bf16/b8-hq32-hkv8-sq1-sk8192-d128/page64",
        "flex/decode/bf16/b64-hq32-hkv8-sq1-sk8192-d128/contig",
        "triton/decode/bf16/b8-hq32-hkv8-sq1-sk32768-d128/page256",
        "triton/decode/bf16/b1-hq32-hkv8-sq1-sk32768-d128/page16",
        "triton/decode/bf16/b8-hq32-hkv8-sq4-sk32768-d128/page64",
        "triton/decode/bf16/b64-hq32-hkv8-sq1-sk8192-d128/page64-spread0.25",
        "triton/decode/bf16/b8-hq64-hkv8-sq1-sk32768-d128/page64",
    ):
        assert must in ids, must
    # every shape has our kernel and SDPA
    shapes = {i.split("/", 1)[1] for i in ids}
    assert all(f"triton/{s}" in ids and f"sdpa/{s}" in ids for s in shapes)


# ---------------------------------------------------------------------------------------
# tools/gpu/decode_flush_ab.py


@pytest.mark.slow
@pytest.mark.skipif(not INTERPRETED, reason="the CPU smoke run needs the interpreter")
def test_flush_ab_runs_on_cpu(monkeypatch, capsys):
    import decode_flush_ab as ab

    from fa_bench.case import Case
    from fa_bench.run import execute

    class Event:
        def __init__(self, **_):
            self.t = 0.0

        def record(self):
            self.t = time.perf_counter()

        def elapsed_time(self, other):
            return (other.t - self.t) * 1e3

    real_empty, real_inputs = torch.empty, execute.make_inputs
    monkeypatch.setattr(ab, "SHAPES", ((1, 256, 0), (2, 128, 16)))
    monkeypatch.setattr(ab, "FLUSH_BYTES", 1 << 16)
    monkeypatch.setattr(ab, "CALLS", 2)
    monkeypatch.setattr(ab, "COMBINE_SHAPES", ((256, 0), (512, 64)))
    monkeypatch.setattr(ab, "DEVICE", "cpu")
    monkeypatch.setattr(ab, "DTYPE", torch.float32)
    monkeypatch.setattr(ab, "_case", lambda b, n, p: Case(
        impl="triton", mode="decode", dtype="fp32", batch=b, heads_q=4, heads_kv=2,
        seqlen_q=1, seqlen_k=n, head_dim=16, causal=True, page_size=p))  # fmt: skip
    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch, "empty", lambda *a, device=None, **k: real_empty(*a, **k))
    monkeypatch.setattr(execute, "make_inputs", lambda c, d: real_inputs(c, torch.device("cpu")))
    assert ab.main() == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("| shape | impl | zero flush GB/s | read flush GB/s |")
    rows = [line for line in lines[2:6]]
    assert [r.split(" | ")[1] for r in rows] == ["ours", "sdpa", "ours", "sdpa"]
    assert "triton-decode: paged (pages, 16, Hkv, D)" in rows[2]
    # the combine's share needs bound launches: the interpreter has none, and says so
    assert lines[7].startswith("| shape | splits | whole call µs |")
    assert lines[-1].startswith("| b1 0k | – | – | – | not bound (the interpreter launches")
