"""A results fixture for report tests: two GPUs, two impls, an OOM, a mismatch, hostile text.

The numbers are arbitrary inputs; tests derive what they expect from them. Cases are
written as their JSON (as results.json holds them), so a test can edit one before it
becomes a `ResultsDoc` through `document`.
"""

from __future__ import annotations

import json

from fa_bench.results.record import SCHEMA, ResultsDoc

EVIL = "<script>alert(1)</script>"
GIB = 2**30


def make_case(
    impl: str,
    seqlen: int,
    status: str = "ok",
    *,
    median: float = 1.0,
    telemetry: dict | None = None,
    error: str | None = None,
) -> dict:
    flops = 4 * 2 * 16 * seqlen * seqlen * 128
    nbytes = 4 * 2 * 16 * seqlen * 128 * 2
    ok = status == "ok"
    return {
        "id": f"{impl}/fwd/bf16/b2-hq16-hkv16-sq{seqlen}-sk{seqlen}-d128/full",
        "impl": impl,
        "mode": "fwd",
        "dtype": "bf16",
        "batch": 2,
        "heads_q": 16,
        "heads_kv": 16,
        "seqlen_q": seqlen,
        "seqlen_k": seqlen,
        "head_dim": 128,
        "causal": False,
        "device": "cuda",
        "status": status,
        "error": error,
        "backend": None,
        "derived": None,
        "latency_ms": {
            "median": median,
            "mean": median,
            "min": median * 0.9,
            "max": median * 1.2,
            "p20": median * 0.95,
            "p80": median * 1.05,
            "stdev": median * 0.02,
            "noise": 0.005,
            "n": 3,
            "samples": [median] * 3,
        }
        if ok
        else None,
        "timing": None,
        "flops": flops,
        "bytes_model": nbytes,
        "tflops": flops / (median * 1e-3) / 1e12 if ok else None,
        "gbps_model": nbytes / (median * 1e-3) / 1e9 if ok else None,
        "peak_mem_bytes": seqlen * 1000 if ok else None,
        "accuracy": {"max_abs_err": 1e-3, "rel_l2_err": 1e-3, "passed": status != "mismatch"},
        "telemetry": telemetry,
    }


def document(run: dict, env: dict, cases: list[dict]) -> ResultsDoc:
    """A results document of JSON cases, read and checked as results.json is."""
    return ResultsDoc.from_json({"schema": SCHEMA, "run": run, "env": env, "cases": cases})


def clone(doc: ResultsDoc) -> ResultsDoc:
    """A deep copy to edit, through the document's JSON."""
    return ResultsDoc.from_json(json.loads(json.dumps(doc.to_json())))


def _env(gpu: str, host: str, memory_gib: int, **extra: object) -> dict:
    gpus = [
        {
            "index": 0,
            "name": gpu,
            "uuid": None,
            "memory_bytes": memory_gib * GIB,
            "sm_count": 132,
            "compute_capability": "9.0",
            "l2_bytes": 50 * 2**20,
        }
    ]
    return {
        "hostname": host,
        "torch": "2.11.0",
        "triton": "3.6.0",
        "cuda": "13.0",
        "cudnn": 91900,
        "driver": "580.159.04",
        "gpus": gpus,
        "gpu_name": gpu,
        **extra,
    }


def _run(run_id: str) -> dict:
    return {
        "id": run_id,
        "started": "2026-11-29T10:00:00+00:00",
        "argv": ["fa-bench", "run"],
        "device": "cuda",
        "fa_bench": "0.1.0",
        "suites": [{"name": EVIL, "description": "hostile " + EVIL}],
    }


def two_gpu_docs() -> list[ResultsDoc]:
    """H200: sdpa ok at 1k/4k/16k, triton ok at 1k and 16k, a mismatch at 4k, telemetry.
    A100: sdpa ok at 1k/4k/16k, triton ok at 1k/4k and out of memory at 16k, telemetry
    unavailable."""
    tel = {
        "available": True,
        "gbps_nvml": 2000.0,
        "dram_bw_util_pct": 40.0,
        "sm_clock_mhz_mean": 1980.0,
        "power_w_mean": 500.0,
        "energy_j_per_call": 0.01,
        "throttle_reasons": ["sw_power_cap"],
    }
    no_tel = {"available": False, "reason": "NVML not installed"}
    h200 = [
        make_case("sdpa", 1024, median=1.0, telemetry=tel),
        make_case("triton", 1024, median=0.5, telemetry=tel),
        make_case("sdpa", 4096, median=4.0, telemetry=tel),
        make_case("triton", 4096, "mismatch", error="max error too large " + EVIL),
        make_case("sdpa", 16384, median=16.0, telemetry=tel),
        make_case("triton", 16384, median=10.0, telemetry=tel),
    ]
    a100 = [
        make_case("sdpa", 1024, median=2.0, telemetry=no_tel),
        make_case("triton", 1024, median=1.6, telemetry=no_tel),
        make_case("sdpa", 4096, median=8.0, telemetry=no_tel),
        make_case("triton", 4096, median=4.0, telemetry=no_tel),
        make_case("sdpa", 16384, median=32.0, telemetry=no_tel),
        make_case("triton", 16384, "oom", error="CUDA out of memory. Tried to allocate 9 GiB"),
    ]
    # the worker's calibration: a device copy timed against NVML (fa_bench.telemetry.session)
    tel = {"calibration": {"available": True, "gbps_copy": 4239.0, "gbps_nvml": 4210.0}}
    return [
        document(_run("h"), _env("NVIDIA H200", "node-a", 141, telemetry=tel), h200),
        document(_run("a"), _env("NVIDIA A100", "node-b", 80), a100),
    ]
