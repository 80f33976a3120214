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
