"""Issue 16, values, paths and size: non-finite outputs are `mismatch` with their accuracy
kept, the CPU allocator's failures are `oom`, odd flag values and unusable output
folders are refused up front (exit 2), and a suite past the size limit is refused
before it is built.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import FAST, HERE

from fa_bench import registry
from fa_bench.case import Case, Status
from fa_bench.results.record import CaseRecord
from fa_bench.run.execute import ExecOptions, run_case
from fa_bench.run.timing import TimingConfig
from fa_bench.run.worker import result_line

VALUES = str(HERE / "plugins" / "value_impls.py")
QUICK = ExecOptions(
    timing=TimingConfig(target_noise=0.2, min_samples=2, min_time_s=0, max_time_s=0.01,
                        warmup_ms=0),
)  # fmt: skip


@pytest.fixture(scope="module", autouse=True)
def _value_impls() -> None:
    registry.load([VALUES])


def _case(impl: str, mode: str = "fwd", **kw: object) -> Case:
    base: dict = dict(impl=impl, mode=mode, dtype="fp32", batch=1, heads_q=2, heads_kv=2,
                      seqlen_q=24, seqlen_k=24, head_dim=16, causal=False)  # fmt: skip
    return Case(**{**base, **kw})


# --- non-finite numbers are data ------------------------------------------------------


def _through_worker(record: CaseRecord) -> CaseRecord:
    """The record as the runner reads it back from the worker's protocol line."""
    msg = json.loads(result_line(record))  # strict JSON: no NaN/Infinity tokens
    return CaseRecord.from_json(msg["result"], "test")


def test_nan_output_is_a_mismatch_with_its_accuracy_kept() -> None:
    record = run_case(_case("value-nan-out", causal=True), torch.device("cpu"), QUICK)
    assert record.status is Status.MISMATCH
    back = _through_worker(record)
    assert back.status is Status.MISMATCH
    assert back.latency_ms is not None and back.latency_ms.median > 0  # timing kept
    o = back.accuracy["tensors"]["o"]
    assert o["nonfinite"] == 1 * 2 * 8 * 16  # rows 0, 3, ..., 21 of 24, every head
    assert o["max_abs_err"] is None and o["passed"] is False  # non-finite -> null
    assert back.accuracy["max_abs_err"] is None
    assert "o: 256 non-finite values" in back.error


def test_inf_grad_is_a_mismatch_naming_the_grad() -> None:
    record = run_case(_case("value-inf-grad", "fwd_bwd"), torch.device("cpu"), QUICK)
    back = _through_worker(record)
    assert back.status is Status.MISMATCH
    tensors = back.accuracy["tensors"]
    assert tensors["dq"]["nonfinite"] >= 1 and tensors["dq"]["rel_l2_err"] is None
    assert tensors["o"]["nonfinite"] == 0 and tensors["o"]["passed"] is True
    assert "dq:" in back.error and "non-finite" in back.error


@pytest.mark.slow
def test_run_records_non_finite_cases_in_valid_json(tmp_path: Path) -> None:
    out = tmp_path / "o"
    proc = subprocess.run(
        [sys.executable, "-m", "fa_bench.cli", "run", "--plugin", VALUES, "-i", "value-nan-out",
         "-i", "value-inf-grad", "-m", "fwd_bwd", "--dtype", "fp32", "--seqlen", "40",
         "--head-dim", "8", "--heads", "1", "--batch", "1", "--device", "cpu", "--no-report",
         "--out", str(out), *FAST],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr  # a mismatch fails the run, as before
    text = (out / "results.json").read_text()
    doc = json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in results.json"))
    statuses = {c["impl"]: c["status"] for c in doc["cases"]}
    assert statuses == {"value-nan-out": "mismatch", "value-inf-grad": "mismatch"}
    for line in (out / "journal.jsonl").read_text().splitlines():
        json.loads(line, parse_constant=lambda c: pytest.fail(f"{c} in the journal"))


# --- oom on the CPU too ----------------------------------------------------------------


@pytest.mark.parametrize("impl", ["value-cpu-alloc", "value-memoryerror"])
def test_cpu_allocator_failure_is_oom(impl: str) -> None:
    record = run_case(_case(impl), torch.device("cpu"), QUICK)
    assert record.status is Status.OOM, record.error
    assert record.traceback is None
