"""Sessions 5 and 6's decode GPU tools on the CPU: tools/gpu/decode_summary.py (issue 20's
targets met or missed from a results.json), the A/B tables of tools/gpu/decode_ab.py
(once decode_fused_ab.py and decode_s6_ab.py) and tools/gpu/decode_gpu.sh's arguments (once
decode_s5.sh and decode_s6.sh)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
sys.path.insert(0, str(ROOT / "tools" / "gpu"))

import decode_summary  # noqa: E402

from fa_bench.case import Case  # noqa: E402


def _rec(impl, batch, ctx, page, gbps, status="ok", nvml=1.0, error=None, spread=1.0):
    case = Case(impl=impl, mode="decode", dtype="bf16", batch=batch, heads_q=32, heads_kv=8,
                seqlen_q=1, seqlen_k=ctx, head_dim=128, causal=True, page_size=page,
                ctx_spread=spread)  # fmt: skip
    return {
        "id": case.id, **case.to_dict(), "status": status, "gbps_model": gbps, "error": error,
        "telemetry": {"bytes_ratio_measured_to_model": nvml}, "backend": f"{impl} launch",
    }  # fmt: skip


def _doc(cases):
    cal = {"available": True, "gbps_copy": 4000.0}
    return {"run": {}, "env": {"telemetry": {"calibration": cal}}, "cases": cases}


def test_the_summary_gives_each_target_its_verdict_and_numbers():
    doc = _doc([
        _rec("triton", 8, 8192, 0, 3800.0),  # 0.95: target 1 met here
        _rec("sdpa", 8, 8192, 0, 3700.0),
        _rec("triton", 8, 8192, 64, 3400.0, nvml=1.2),  # 0.85: missed; 8k: no NVML target
        _rec("sdpa", 8, 8192, 64, 3500.0),  # beats ours: an exception
        _rec("triton", 1, 32768, 0, 3000.0, nvml=1.15),  # 0.75: target 2 met; NVML off
        _rec("flex", 1, 32768, 0, None, status="unsupported", error="no kernel"),
        _rec("fa4", 1, 32768, 0, None, status="unsupported", error="not installed"),
        _rec("triton", 1, 131072, 16, 3900.0, nvml=0.99),
        _rec("triton", 8, 8192, 0, 3000.0, spread=0.25),  # 8k down to 2k: out of scope
    ])  # fmt: skip
    s = decode_summary.summarize(doc)
    t1, t2 = s["bandwidth"]["0.9"], s["bandwidth"]["0.7"]
    assert (t1["met"], t1["in_scope"]) == (1, 2)
    assert t1["cases"][0]["case"].endswith("sk8192-d128/page64")  # the worst first
    assert t1["cases"][0]["copy_fraction"] == pytest.approx(0.85)
    assert (t2["met"], t2["in_scope"]) == (2, 2)
    p = s["peers"]
    assert p["compared"] == 2 and len(p["exceptions"]) == 1
    assert p["exceptions"][0]["best_peer"] == "sdpa"
    assert p["exceptions"][0]["ratio"] == pytest.approx(3400 / 3500)
    n = s["nvml"]
    assert n["cases"] == 2 and [r["ratio"] for r in n["outside"]] == [1.15]
    assert s["impls"]["fa4"] == {"statuses": {"unsupported": 1},
                                 "reasons": {"unsupported: not installed": 1}}  # fmt: skip
    text = decode_summary.markdown(s)
    assert "copy bandwidth 4000 GB/s" in text
    assert ">= 0.9 x copy: MISSED (1 of 2 cases)" in text
    assert ">= 0.7 x copy: MET (2 of 2 cases)" in text
    assert "ours >= 1.0 x every peer: MISSED (1 of 2 cases)" in text
    assert (
        "| decode/bf16/b8-hq32-hkv8-sq1-sk8192-d128/page64 | 3400 | sdpa | 3500 | 0.971 |" in text
    )
    assert (
        "NVML bytes ÷ model within 10% (ours, context >= 32k): MISSED (2 cases, 0.99-1.15)" in text
    )
    assert "- fa4: unsupported 1" in text and "1 x unsupported: not installed" in text


def test_a_run_without_calibration_or_targets_says_not_measured():
    doc = {"run": {}, "env": {}, "cases": [_rec("triton", 1, 1024, 0, 900.0)]}
    text = decode_summary.markdown(decode_summary.summarize(doc))
    assert text.count("NOT MEASURED") == 4 and "copy bandwidth – GB/s" in text
    with_copy = decode_summary.summarize(doc, copy_override=1000.0)
    assert with_copy["copy_gbps"] == 1000.0


def test_the_ab_table_formats_each_variant():
    sys.modules.pop("decode_ab", None)
    import decode_ab

    rows = [
        {"batch": 1, "context": 32768, "page": 0, "variant": "ours fused",
         "backend": "triton-decode: x; heuristic: 32 splits, fused combine; planned launch",
         "zero_us": 50.0, "zero_gbps": 2680.0, "read_us": 41.0, "read_gbps": 3270.0,
         "read_copy": 0.78},
        {"batch": 8, "context": 8192, "page": 64, "variant": "ours fused x12",
         "backend": "b", "read_us": 70.0, "read_gbps": 3800.0, "read_copy": 0.9},
    ]  # fmt: skip
    lines = decode_ab._fused_markdown(rows, 4200.0)
    assert lines[0].startswith("copy bandwidth: 4200 GB/s")
    assert "| b1 32k contig | ours fused | 50.0 / 2680 | 41.0 / 3270 | 0.78 | " in lines[4]
    assert lines[5].startswith("| b8 8k page64 | ours fused x12 | – | 70.0 / 3800 | 0.90 |")


def test_the_gpu_script_parses_and_refuses_an_unknown_mode(tmp_path: Path):
    script = ROOT / "tools" / "gpu" / "decode_gpu.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    env = {"MODE": "x", "OUT": str(tmp_path), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 2
    assert "MODE must be fused-ab, launches-ab, suite or targets, got 'x'" in done.stderr


def test_the_launches_ab_table_formats_each_candidate():
    sys.modules.pop("decode_ab", None)
    import decode_ab

    rows = [
        {"batch": 8, "context": 8192, "page": 0, "variant": "sdpa", "us": 70.0,
         "gbps": 3800.0, "launch": "cudnn", "copy": 0.9},
        {"batch": 64, "context": 131072, "page": 64, "variant": "heuristic", "us": 9000.0,
         "gbps": 4100.0, "launch": "s1 bn32 w4 st5", "copy": 0.98, "max_diff": 0.0,
         "split_us": 8000.0, "measure_us": 9010.0},
    ]  # fmt: skip
    lines = decode_ab._launches_markdown(rows, 4200.0)
    assert lines[0] == "copy bandwidth: 4200 GB/s"
    assert lines[4] == "| b8 8k contig | sdpa | cudnn | 70.0 | – | 3800 | 0.900 | – |"
    assert lines[5] == (
        "| b64 128k page64 | heuristic | s1 bn32 w4 st5 | 9000.0 | 8000.0; timing.measure "
        "9010.0 | 4100 | 0.980 | 0.00e+00 |"
    )


def test_runs_merge_by_case_id_the_later_run_winning():
    first = _doc([_rec("triton", 1, 32768, 0, 3000.0), _rec("sdpa", 1, 32768, 0, 2600.0)])
    second = {"run": {}, "env": {}, "cases": [_rec("triton", 1, 32768, 0, 3200.0),
                                              _rec("triton", 8, 8192, 0, 3800.0)]}  # fmt: skip
    merged = decode_summary.merge([first, second])
    assert merged["env"] == first["env"] and len(merged["cases"]) == 3
    s = decode_summary.summarize(merged)
    assert s["copy_gbps"] == 4000.0
    assert s["bandwidth"]["0.7"]["cases"][0]["gbps"] == 3200.0
    assert s["peers"]["exceptions"] == [] and s["peers"]["compared"] == 1
