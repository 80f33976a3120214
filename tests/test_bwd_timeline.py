"""tools/gpu/bwd_timeline.py's reading of a profiler trace (issue 18, session 13): per
sample the L2 flush found by name, the GPU idle from its end to the backward's first
kernel and to its longest one, the gaps, and the host µs from the call to each launch;
kernels of the next sample never counted in this one. On a CPU, with a made-up trace."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools" / "gpu"))
bwd_timeline = pytest.importorskip("bwd_timeline")


def _ev(cat, name, ts, dur):
    return {"cat": cat, "name": name, "ts": ts, "dur": dur}


def _sample(i, t0):
    """One sample at t0: its ranges, a flush (a reduce kernel), then three kernels."""
    return [
        _ev("user_annotation", f"sample{i}", t0, 500),
        _ev("user_annotation", "call", t0 + 20, 400),
        _ev("kernel", "void at::native::reduce_kernel<amax>", t0 + 10, 100),  # ends t0 + 110
        _ev("cuda_runtime", "cudaLaunchKernel", t0 + 200, 5),
        _ev("kernel", "_bwd_preprocess_kernel", t0 + 300, 60),
        _ev("cuda_runtime", "cuLaunchKernelEx", t0 + 350, 5),
        _ev("kernel", "_bwd_ws", t0 + 400, 9000),
        _ev("kernel", "_bwd1_dq_postprocess_kernel", t0 + 9402, 50),
    ]


def test_a_trace_s_samples_are_read_apart():
    trace = {"traceEvents": _sample(0, 0) + _sample(1, 20_000)}
    rows = bwd_timeline._samples(trace, 2)
    assert len(rows) == 2
    for r in rows:
        assert r["idle_us"] == 190  # the flush ends at 110, the first kernel starts at 300
        assert r["to_main_us"] == 290  # the longest kernel starts at 400
        assert r["busy_us"] == 9110 and r["span_us"] == 9342
        assert r["gaps"] == [40, 2]
        assert r["launch_host_us"] == [180, 330]  # from the call's start at t0 + 20
        assert [k["name"] for k in r["kernels"]] == [
            "_bwd_preprocess_kernel", "_bwd_ws", "_bwd1_dq_postprocess_kernel"]  # fmt: skip


def test_a_sample_without_its_flush_is_skipped():
    events = [e for e in _sample(0, 0) if "reduce" not in e["name"]] + _sample(1, 20_000)
    rows = bwd_timeline._samples({"traceEvents": events}, 2)
    assert len(rows) == 1 and rows[0]["idle_us"] == 190
