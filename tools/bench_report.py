"""Developer benchmark: how long `fa-bench report` takes for N synthetic cases.

Not a test and not installed. It writes two results.json files (one per GPU, as two runs
merged into one page would be) holding N cases in all, realistic in shape: several
implementations, the three modes, two dtypes, causal and full masks, a grid of sequence
lengths, head dims, batches and head counts, a few out-of-memory, unsupported and
mismatching cases, 30 latency samples each. Then it times the report's Python path
(`fa_bench.commands.report.report_command`, what `fa-bench report A B -o page.html`
runs: read, check, merge, figures, tables, summary, page) for each N.

    python tools/bench_report.py                 # N = 1000, 10000, 100000
    python tools/bench_report.py -n 5000 -n 20000 --profile

`--profile` prints the 25 most expensive functions of each run (cProfile, by own time).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import itertools
import json
import pstats
import tempfile
import time
from pathlib import Path

from rich.console import Console

from fa_bench.commands.report import report_command
from fa_bench.results.record import SCHEMA

IMPLS = ("sdpa", "sdpa-flash", "sdpa-cudnn", "triton", "flex", "naive")
MODES = ("fwd", "bwd", "fwd_bwd")
DTYPES = ("bf16", "fp16")
SEQLENS = (512, 1024, 2048, 4096, 8192, 16384, 32768)
HEAD_DIMS = (64, 128, 256)
BATCHES = (1, 2, 4, 8, 16, 32, 64)
HEADS = ((16, 16), (32, 8), (32, 32), (64, 8), (8, 8), (48, 48), (40, 40), (24, 24))
GPUS = ("NVIDIA H200", "NVIDIA H100 80GB HBM3")


def _shapes():
    """Every (mode, dtype, causal, seqlen, head_dim, batch, heads); the sequence lengths
    vary fastest, as a suite's grid does."""
    return itertools.product(BATCHES, HEADS, HEAD_DIMS, MODES, DTYPES, (True, False), SEQLENS)


def _case(impl: str, shape: tuple, gpu: str, i: int) -> dict:
    batch, (hq, hkv), d, mode, dtype, causal, n = shape
    factor = {"fwd": 1.0, "bwd": 2.5, "fwd_bwd": 3.5}[mode] * (0.5 if causal else 1.0)
    flops = 4.0 * batch * hq * n * n * d * factor
    nbytes = 2.0 * batch * n * d * (2 * hq + 2 * hkv)
    speed = {"naive": 0.2, "flex": 0.8, "triton": 1.1}.get(impl, 1.0)
    speed *= 0.7 if "H100" in gpu else 1.0
    median = flops / (400e12 * speed) * 1e3 + 0.01
    status = "ok"
    if impl == "naive" and n >= 16384:
        status = "oom"
    elif impl == "sdpa-cudnn" and d == 256:
        status = "unsupported"
    elif i % 997 == 0:
        status = "mismatch"
    ok = status == "ok"
    samples = [median * (1 + 0.01 * ((i * 7 + j) % 5 - 2)) for j in range(30)]
    mask = "causal" if causal else "full"
    return {
        "id": f"{impl}/{mode}/{dtype}/b{batch}-hq{hq}-hkv{hkv}-sq{n}-sk{n}-d{d}/{mask}",
        "impl": impl, "mode": mode, "dtype": dtype, "batch": batch, "heads_q": hq,
        "heads_kv": hkv, "seqlen_q": n, "seqlen_k": n, "head_dim": d, "causal": causal,
        "device": "cuda", "status": status,
        "error": None if ok else f"{status}: synthetic case {i}",
        "backend": None, "derived": None,
        "latency_ms": {
            "median": median, "mean": median, "min": min(samples), "max": max(samples),
            "p20": median * 0.99, "p80": median * 1.01, "stdev": median * 0.01,
            "noise": 0.002, "n": len(samples), "samples": samples,
        } if ok else None,
        "timing": None, "flops": flops, "bytes_model": nbytes,
        "tflops": flops / (median * 1e-3) / 1e12 if ok else None,
        "gbps_model": nbytes / (median * 1e-3) / 1e9 if ok else None,
        "peak_mem_bytes": int(nbytes * 3) if ok else None,
        "accuracy": {"max_abs_err": 1e-3, "rel_l2_err": 1e-3, "passed": status != "mismatch"},
        "telemetry": {"available": False, "reason": "synthetic"},
    }  # fmt: skip


def documents(n_cases: int) -> list[dict]:
    """Two results documents (one per GPU) holding `n_cases` cases in all."""
    per_gpu = [n_cases // 2 + n_cases % 2, n_cases // 2]
    docs = []
    for gpu, count in zip(GPUS, per_gpu, strict=True):
        cases: list[dict] = []
        for i, (shape, impl) in enumerate(itertools.product(_shapes(), IMPLS)):
            if len(cases) == count:
                break
            cases.append(_case(impl, shape, gpu, i))
        if len(cases) < count:
            raise SystemExit(f"the synthetic grid holds only {len(cases)} cases per GPU")
        env = {"hostname": "bench", "gpu_name": gpu, "torch": "2.13.0", "gpus": [{"name": gpu}]}
        suites = [{"name": "synthetic", "description": "tools/bench_report.py"}]
        run = {"id": gpu, "device": "cuda", "argv": ["fa-bench", "run"], "suites": suites}
        docs.append({"schema": SCHEMA, "run": run, "env": env, "cases": cases})
    return docs


def time_report(n_cases: int, folder: Path, profile: bool, quiet: bool = False) -> float:
    """Seconds `fa-bench report` takes on two files of `n_cases` cases in all."""
    paths = []
    for i, doc in enumerate(documents(n_cases)):
        path = folder / f"gpu{i}-{n_cases}.json"
        path.write_text(json.dumps(doc), encoding="utf-8")
        paths.append(path)
    out = folder / f"report-{n_cases}.html"
    sink = Console(file=io.StringIO())  # report's own lines, kept for an error
    prof = cProfile.Profile() if profile else None
    start, cpu = time.perf_counter(), time.process_time()
    if prof is not None:
        prof.enable()
    code = report_command(inputs=list(paths), out=out, baseline=None, title=None,
                          plotlyjs="cdn", console=sink, err_console=sink)  # fmt: skip
    if prof is not None:
        prof.disable()
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    if code != 0:
        raise SystemExit(f"report exited {code}: {sink.file.getvalue()}")  # type: ignore[attr-defined]
    if prof is not None:
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)
    size = out.stat().st_size / 2**20
    if quiet:
        return seconds
    # CPU time too: on a shared machine the wall time says as much about the neighbours.
    print(f"{n_cases:>7} cases: {seconds:6.1f} s wall, {cpu:6.1f} s CPU  (page {size:.0f} MiB)",
          flush=True)  # fmt: skip
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, action="append", help="case counts (repeatable)")
    parser.add_argument("--profile", action="store_true", help="print a cProfile summary")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fa-bench-report-bench-") as tmp:
        # Untimed: the first report imports torch, plotly and jinja, a few seconds.
        time_report(100, Path(tmp), profile=False, quiet=True)
        for n in args.n or [1000, 10_000, 100_000]:
            time_report(n, Path(tmp), args.profile)


if __name__ == "__main__":
    main()
