"""The runner survives crashing, hanging, OOM-raising and wrong implementations, journals
every case as it finishes, and resumes an interrupted run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas
import pytest
from conftest import FAST, FAULTY

from fa_bench.case import Case, Status
from fa_bench.results.files import append_journal, load_results, read_journal
from fa_bench.results.record import CaseRecord


def fa_bench(*args: str, cwd: Path, **kw: object) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", "from fa_bench.cli import main; main()", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        **kw,
    )


def statuses(out: Path) -> dict[str, str]:
    return {c.impl: c.status.value for c in load_results(out).cases}


@pytest.mark.slow
def test_failures_are_results_and_the_run_goes_on(tmp_path: Path, tiny_suite) -> None:
    impls = [
        "sdpa-math",
        "test-crash",
        "sdpa",
        "test-hang",
        "test-oom",
        "test-raise",
        "test-wrong",
        "naive",
    ]
    suite = tiny_suite(impls, seqlens=[16])
    out = tmp_path / "out"
    proc = fa_bench(
        "run",
        "-s",
        str(suite),
        "--device",
        "cpu",
        "--plugin",
        FAULTY,
        "--timeout",
        "20",
        "--out",
        str(out),
        *FAST,
        cwd=tmp_path,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    got = statuses(out)
    assert got == {
        "sdpa-math": "ok",
        "test-crash": "error",
        "sdpa": "ok",
        "test-hang": "timeout",
        "test-oom": "oom",
        "test-raise": "error",
        "test-wrong": "mismatch",
        "naive": "ok",
    }
    cases = {c.impl: c.to_json() for c in load_results(out).cases}
    assert "exited with status 17" in cases["test-crash"]["error"]
    assert "timed out" in cases["test-hang"]["error"]
    assert "out of memory" in cases["test-oom"]["error"]
    assert "deliberate failure" in cases["test-raise"]["error"]
    assert cases["test-wrong"]["latency_ms"]["n"] >= 2  # wrong, but still timed
    assert cases["naive"]["latency_ms"]["n"] >= 2
    frame = pandas.read_csv(out / "results.csv")
    assert list(frame["impl"]) == impls
    assert list(frame["status"]) == [got[i] for i in impls]


@pytest.mark.slow
def test_only_ok_oom_unsupported_exit_zero(tmp_path: Path, tiny_suite) -> None:
    suite = tiny_suite(["sdpa-math", "test-oom", "sdpa-flash"], seqlens=[16])
    out = tmp_path / "out"
    proc = fa_bench(
        "run",
        "-s",
        str(suite),
        "--device",
        "cpu",
        "--plugin",
        FAULTY,
        "--out",
        str(out),
        *FAST,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = statuses(out)
    assert got == {"sdpa-math": "ok", "test-oom": "oom", "sdpa-flash": "unsupported"}


@pytest.mark.slow
def test_interrupt_keeps_results_and_resume_finishes(tmp_path: Path, tiny_suite) -> None:
    suite = tiny_suite(
        ["naive", "sdpa-math"], seqlens=[16, 24, 32, 40, 48, 56, 64, 72], causal=[False, True]
    )
    out = tmp_path / "out"
    args = [
        "run",
        "-s",
        str(suite),
        "--device",
        "cpu",
        "--out",
        str(out),
        "--max-time",
        "0.3",
        "--min-samples",
        "3",
        "--target-noise",
        "0.0001",
    ]
    proc = subprocess.Popen(
        [sys.executable, "-c", "from fa_bench.cli import main; main()", *args],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 120
    while len(read_journal(out)) < 3 and time.time() < deadline:
        time.sleep(0.1)
    os.kill(proc.pid, signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stdout + stderr
    assert "--resume" in stderr
    partial = load_results(out)
    assert partial.run["interrupted"] is True
    # the worker's env survives the interrupt (it once came back as {"gpu_name": None})
    assert partial.env.get("torch") and partial.env.get("python")
    kept = {c.id for c in partial.cases}
    assert 3 <= len(kept) < 32

    done = fa_bench("run", "--resume", str(out), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    final = load_results(out)
    ids = [c.id for c in final.cases]
    assert len(ids) == len(set(ids)) == 32
    assert kept <= set(ids)
    assert final.run["interrupted"] is False
    assert len(final.run["resumed"]) == 1
    # what was measured before the interruption is kept as it was, not re-run
    before = {c.id: c.to_json()["latency_ms"]["samples"] for c in partial.cases}
    after = {c.id: c.to_json()["latency_ms"]["samples"] for c in final.cases}
    assert all(after[i] == before[i] for i in kept)


def test_journal_ignores_a_torn_last_line(tmp_path: Path) -> None:
    case = Case("naive", "fwd", "fp32", 1, 1, 1, 8, 8, 16, False)
    append_journal(tmp_path, CaseRecord.failed(case, Status.ERROR, "x", "cpu"))
    record = json.loads((tmp_path / "journal.jsonl").read_text())
    with open(tmp_path / "journal.jsonl", "a") as f:
        f.write(json.dumps({**record, "id": "b"})[:40])
    assert [r.id for r in read_journal(tmp_path)] == [case.id]
