"""CPU timing (issue 15, item 2): the CPU worker's thread count is fixed (1 by default,
--cpu-threads N), set before torch does any work, and recorded in results.json's env, so
medians do not land on OpenMP spin-waits; `sweep` runs CPU cases the same way."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import ClassVar

import pytest
import torch
from typer.testing import CliRunner

from fa_bench.cli import app
from fa_bench.run import runner
from fa_bench.run.runner import RunOptions, Worker
from fa_bench.run.timing import DEFAULT_CPU_THREADS, TimingConfig, worker_threads


def test_default_threads_one_on_cpu_torch_default_on_gpu() -> None:
    assert DEFAULT_CPU_THREADS == 1
    assert worker_threads("cpu", None) == 1
    assert worker_threads("cpu", 3) == 3
    assert worker_threads("cuda", None) is None  # a GPU run keeps torch's default
    assert worker_threads("cuda", 2) == 2


def test_cpu_threads_round_trip_and_old_plans() -> None:
    opts = RunOptions(device="cpu", cpu_threads=4)
    assert RunOptions.from_dict(json.loads(json.dumps(opts.to_dict()))).cpu_threads == 4
    old = RunOptions(device="cpu").to_dict()
    del old["cpu_threads"]  # a plan.json written before the flag: --resume still reads it
    assert RunOptions.from_dict(old).cpu_threads is None


class _FakePopen:
    """Records how the worker would be started; speaks no protocol."""

    started: ClassVar[dict] = {}

    def __init__(self, args: list[str], **kw: object) -> None:
        _FakePopen.started = {"args": args, **kw}
        self.stdin, self.stdout, self.pid = io.StringIO(), io.StringIO(), 0

    def poll(self) -> int:
        return 0


@pytest.mark.parametrize(
    ("device", "requested", "expected"), [("cpu", None, "1"), ("cpu", 3, "3"), ("cuda", None, None)]
)
def test_worker_starts_with_omp_threads(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    device: str,
    requested: int | None,
    expected: str | None,
) -> None:
    """OpenMP sizes its pool when it starts: OMP_NUM_THREADS is in the worker's
    environment from the start, not only torch.set_num_threads inside it."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    monkeypatch.setattr(runner.subprocess, "Popen", _FakePopen)
    gpu = 0 if device == "cuda" else None
    worker = Worker(RunOptions(device=device, gpu=gpu, cpu_threads=requested), tmp_path)
    env = _FakePopen.started["env"]
    assert env.get("OMP_NUM_THREADS") == expected
    assert env.get("MKL_NUM_THREADS") == expected
    args = json.loads(_FakePopen.started["args"][-1])
    assert args["options"]["cpu_threads"] == requested
    worker._log.close()


def test_cpu_threads_flag_bounds() -> None:
    result = CliRunner().invoke(app, ["run", "--device", "cpu", "--cpu-threads", "0"])
    assert result.exit_code == 2
    assert "--cpu-threads" in result.output
    assert "--cpu-threads" in CliRunner().invoke(app, ["run", "--help"]).output


def test_sweep_passes_cpu_threads_to_its_workers(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import fa_bench.sweep.execute as sweep_execute

    seen: dict = {}

    def capture(points: object, out: object, opts: RunOptions, **kw: object) -> None:
        seen["opts"] = opts
        raise SystemExit(99)  # the options are all this test needs: stop before timing

    monkeypatch.setattr(sweep_execute, "execute_points", capture)
    args = ["sweep", "--device", "cpu", "--mode", "fwd", "--seqlen", "128", "--block-m", "16",
            "--block-n", "16", "--warps", "1", "--stages", "1",
            "--out", str(tmp_path / "sw")]  # fmt: skip
    CliRunner().invoke(app, [*args, "--cpu-threads", "3"])
    assert seen["opts"].cpu_threads == 3
    assert worker_threads(seen["opts"].device, seen["opts"].cpu_threads) == 3
    CliRunner().invoke(app, [*args[:-1], str(tmp_path / "sw2")])
    assert worker_threads(seen["opts"].device, seen["opts"].cpu_threads) == DEFAULT_CPU_THREADS


def _direct_median_ms(threads: int) -> float:
    """The same case timed in this process, on `threads` threads: min of a few medians."""
    from fa_bench.case import Case
    from fa_bench.run.execute import ExecOptions, run_case

    case = Case(impl="naive", mode="fwd", dtype="fp32", batch=1, heads_q=2, heads_kv=2,
                seqlen_q=128, seqlen_k=128, head_dim=32, causal=False)  # fmt: skip
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        opts = ExecOptions(timing=TimingConfig(max_time_s=1.0, min_time_s=0.02))
        medians = []
        for _ in range(3):
            record = run_case(case, torch.device("cpu"), opts)
            assert record.median_ms is not None, record.error
            medians.append(record.median_ms)
        return min(medians)
    finally:
        torch.set_num_threads(before)


def _run_median_ms(out: Path) -> tuple[float, dict]:
    entry = "import sys; from fa_bench.entry import main; sys.exit(main())"
    cmd = [sys.executable, "-c", entry, "run", "-s", "smoke", "-i", "naive",
           "-m", "fwd", "--seqlen", "128", "--no-report", "--out", str(out)]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads((out / "results.json").read_text())
    full = [c for c in doc["cases"] if c["id"].endswith("b1-hq2-hkv2-sq128-sk128-d32/full")]
    assert full and full[0]["status"] == "ok", full
    return full[0]["latency_ms"]["median"], doc["env"]


@pytest.mark.slow
def test_cpu_run_median_near_a_direct_timing(tmp_path: Path) -> None:
    """With torch's default threads a 0.07 ms call's median landed on 8-68 ms (spin-waits
    under load); with the worker on one thread it is within 3× of a direct timing. The
    run is measured again (not the bound relaxed) when a neighbour's burst hit it."""
    for attempt in range(3):
        median, env = _run_median_ms(tmp_path / f"run{attempt}")
        direct = _direct_median_ms(env["cpu_threads"])
        if direct / 3 <= median <= 3 * direct:
            break
    assert direct / 3 <= median <= 3 * direct, (median, direct)
    assert env["cpu_threads"] == DEFAULT_CPU_THREADS
    assert env["omp_num_threads"] == str(DEFAULT_CPU_THREADS)
