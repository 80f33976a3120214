"""Issue 16, values, paths and size: non-finite outputs are `mismatch` with their accuracy
kept, the CPU allocator's failures are `oom`, odd flag values and unusable output
folders are refused up front (exit 2), and a suite past the size limit is refused
before it is built.
"""

from __future__ import annotations

import errno
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import FAST, HERE
from typer.testing import CliRunner

from fa_bench import cli, registry
from fa_bench.case import Case, Status
from fa_bench.commands.flags import MeasureFlags
from fa_bench.errors import UsageError
from fa_bench.results.record import CaseRecord
from fa_bench.run import limits
from fa_bench.run.execute import ExecOptions, run_case
from fa_bench.run.limits import DEFAULT_MAX_CASES, estimate_s, human_duration, tensor_bytes
from fa_bench.run.timing import TimingConfig
from fa_bench.run.worker import result_line
from fa_bench.suite.expand import TooManyCases, builtin_suites, load_suites

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
         "--head-dim", "8", "--heads", "1", "--batch", "1", "--device", "cpu",
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
    assert "value-nan-out" in (out / "report.html").read_text()  # the report reads the nulls


# --- oom on the CPU too ----------------------------------------------------------------


@pytest.mark.parametrize("impl", ["value-cpu-alloc", "value-memoryerror"])
def test_cpu_allocator_failure_is_oom(impl: str) -> None:
    record = run_case(_case(impl), torch.device("cpu"), QUICK)
    assert record.status is Status.OOM, record.error
    assert record.traceback is None


# --- odd values refused up front -------------------------------------------------------

runner = CliRunner()


def _invoke(*args: str) -> tuple[int, str]:
    result = runner.invoke(cli.app, list(args))
    return result.exit_code, " ".join(result.output.split())  # unwrapped


@pytest.mark.parametrize(
    ("command", "flag", "value"),
    [
        ("run", "--warmup", "Infinity"),
        ("run", "--timeout", "1e309"),  # parses as inf
        ("run", "--max-time", "NaN"),
        ("run", "--merge-timeout", "inf"),
        ("run", "--target-noise", "nan"),
        ("run", "--warmup", "1e15"),  # finite, but 30,000 years
        ("sweep", "--budget-minutes", "inf"),
        ("sweep", "--min-gain", "nan"),
        ("sweep", "--warmup", "-inf"),
        ("sweep", "--compile-jobs", "1000000"),  # a process each
    ],
)
def test_non_finite_and_absurd_flag_values_exit_2_naming_the_flag(
    tmp_path: Path, command: str, flag: str, value: str
) -> None:
    out = tmp_path / "o"
    code, text = _invoke(command, "--device", "cpu", "--out", str(out), flag, value)
    assert code == 2, text
    assert flag in text
    assert not (out / "plan.json").exists()


def test_warmup_and_max_time_past_the_timeout_exit_2(tmp_path: Path) -> None:
    code, text = _invoke("run", "--device", "cpu", "-i", "naive", "--out", str(tmp_path / "o"),
                         "--warmup", "8000", "--max-time", "2.5", "--timeout", "10")  # fmt: skip
    assert code == 2, text
    assert "--timeout 10 s" in text and "every case would time out" in text
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("field", ["warmup_ms", "max_time_s", "timeout_s", "target_noise"])
def test_flags_refuse_non_finite_values_in_process(field: str) -> None:
    flags = MeasureFlags(**{field: -math.inf if field == "warmup_ms" else math.nan})
    with pytest.raises(UsageError, match=r"--[a-z-]+: .* is not a finite number"):
        flags.timing(on_cpu=True, gpu_max_time_s=3.0)


# --- sizes no device could hold -------------------------------------------------------


def test_tensor_bytes_counts_inputs_outputs_and_grads() -> None:
    fwd = _case("naive", dtype="bf16", batch=3, heads_q=4, heads_kv=2, seqlen_q=10, seqlen_k=6,
                head_dim=8)  # fmt: skip
    q, kv = 3 * 4 * 10 * 8, 3 * 2 * 6 * 8
    assert tensor_bytes(fwd) == (2 * q + 2 * kv) * 2
    bwd = Case(**{**fwd.to_dict(), "mode": "bwd"})
    assert tensor_bytes(bwd) == 2 * tensor_bytes(fwd)


@pytest.mark.parametrize(
    ("axis", "value", "in_id"),
    [("--seqlen", str(10**16), "sq10000000000000000"), ("--batch", str(2**62 + 3), "b4611")],
)
def test_a_case_larger_than_any_memory_exits_2_naming_it(
    tmp_path: Path, axis: str, value: str, in_id: str
) -> None:
    out = tmp_path / "o"
    code, text = _invoke("run", "--device", "cpu", "-i", "sdpa", "-m", "fwd_bwd",
                         "--head-dim", "16", axis, value, "--out", str(out))  # fmt: skip
    assert code == 2, text
    assert in_id in text and "host RAM" in text
    assert not out.exists()


def test_a_case_over_the_device_memory_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from fa_bench.run import limits

    monkeypatch.setattr(limits, "device_memory_bytes", lambda device, gpu: (3 << 20, "GPU 5"))
    small = _case("naive", seqlen_q=1024, seqlen_k=1024, head_dim=64, heads_q=2, heads_kv=2)
    big = Case(**{**small.to_dict(), "seqlen_q": 4096, "seqlen_k": 4096})
    limits.check_case_sizes([small], "cuda", 5)  # 2 MiB: fits
    with pytest.raises(limits.LimitError, match=r"sq4096-sk4096.*8 MiB.*3 MiB of GPU 5"):
        limits.check_case_sizes([small, big], "cuda", 5)


# --- unusable output folders ----------------------------------------------------------


@pytest.mark.parametrize("command", ["run", "sweep"])
def test_out_at_an_existing_file_exits_2(tmp_path: Path, command: str) -> None:
    target = tmp_path / "results.bin"
    target.write_bytes(b"\x00data")
    code, text = _invoke(command, "--device", "cpu", "--seqlen", "32", "--head-dim", "16",
                         "--out", str(target))  # fmt: skip
    assert code == 2, text
    assert "--out" in text and "is a file" in text
    assert target.read_bytes() == b"\x00data"


def test_out_under_a_file_exits_2_naming_the_file(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("x")
    code, text = _invoke("run", "--device", "cpu", "-i", "naive",
                         "--out", str(tmp_path / "notes.txt" / "a" / "b"))  # fmt: skip
    assert code == 2, text
    assert "notes.txt is a file" in text


def test_default_out_being_a_file_exits_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "fa-bench-out").write_text("")
    code, text = _invoke("run", "--device", "cpu", "-i", "naive", "--seqlen", "48")
    assert code == 2, text
    assert "--out fa-bench-out/" in text and "fa-bench-out is a file" in text


def test_out_under_proc_exits_2() -> None:
    code, text = _invoke("run", "--device", "cpu", "-i", "naive", "--out", "/proc/fa-bench-v/x")
    assert code == 2, text
    assert "--out /proc/fa-bench-v/x: cannot write there" in text


def test_unwritable_out_exits_2_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A read-only mount as this test sees it (root ignores chmod): the probe file fails.
    def read_only(*args: object, **kwargs: object) -> tuple[int, str]:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(limits.tempfile, "mkstemp", read_only)
    code, text = _invoke("sweep", "--device", "cpu", "--seqlen", "32", "--head-dim", "16",
                         "--out", str(tmp_path / "ro"))  # fmt: skip
    assert code == 2, text
    assert "cannot write there (Read-only file system)" in text


# --- the size guard ---------------------------------------------------------------------


def _big_suite(path: Path, seqlens: int, groups: int = 1) -> Path:
    """impls 2 x dtypes 2 x head_dims 5 x heads 5 x batch 10 x causal 2 x seqlens, per group."""
    lines = ['name = "huge"', 'description = "too many"', 'impls = ["naive", "sdpa-math"]',
             'modes = ["fwd"]', 'dtypes = ["fp32", "fp16"]', "head_dims = [8, 16, 24, 40, 72]",
             "heads_q = [1, 3, 5, 7, 9]", f"batch = {list(range(1, 11))}",
             "causal = [true, false]"]  # fmt: skip
    seqs = list(range(7, 7 + seqlens))
    if groups == 1:
        lines.append(f"seqlens = {seqs}")
    for _ in range(groups if groups > 1 else 0):
        lines += ["[[group]]", f"seqlens = {seqs}"]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_million_case_suite_is_refused_fast(tmp_path: Path) -> None:
    suite = _big_suite(tmp_path / "huge.toml", seqlens=500)  # 2,000 x 500 = 10^6
    start = time.perf_counter()
    with pytest.raises(TooManyCases, match=r"1,000,000 cases, more than the limit of 10,000"):
        load_suites([suite], max_cases=DEFAULT_MAX_CASES)
    assert time.perf_counter() - start < 1.0


def test_the_cli_refuses_past_max_cases_and_the_flag_raises_it(tmp_path: Path) -> None:
    suite = _big_suite(tmp_path / "s.toml", seqlens=3)  # 6,000 cases
    code, text = _invoke("run", "--device", "cpu", "-s", str(suite), "--max-cases", "5999",
                         "--out", str(tmp_path / "o"))  # fmt: skip
    assert code == 2, text
    assert "6,000 cases, more than the limit of 5,999" in text and "--max-cases" in text
    assert not (tmp_path / "o").exists()
    assert len(load_suites([suite], max_cases=6000)[0].cases) == 6000


def test_duplicates_across_groups_count_once(tmp_path: Path) -> None:
    suite = _big_suite(tmp_path / "twice.toml", seqlens=2, groups=3)  # 3 x 4,000, 4,000 distinct
    assert len(load_suites([suite], max_cases=4000)[0].cases) == 4000
    with pytest.raises(TooManyCases, match="12,000 cases"):
        load_suites([suite], max_cases=3999)


def test_the_limit_covers_several_suites_together(tmp_path: Path) -> None:
    one = _big_suite(tmp_path / "one.toml", seqlens=1)  # 2,000
    two = _big_suite(tmp_path / "two.toml", seqlens=2)  # 4,000, 2,000 of them new
    assert sum(len(s.cases) for s in load_suites([one, two], max_cases=4000)) == 4000
    with pytest.raises(TooManyCases, match=r"two\.toml"):
        load_suites([one, two], max_cases=3999)


@pytest.mark.parametrize("name", sorted(builtin_suites()))
def test_the_count_matches_the_expansion_of_every_builtin_suite(name: str) -> None:
    suite = load_suites([name])[0]
    assert len(load_suites([name], max_cases=len(suite.cases))[0].cases) == len(suite.cases)


def test_sweep_points_past_the_limit_exit_2(tmp_path: Path) -> None:
    code, text = _invoke("sweep", "--device", "cpu", "--seqlen", "64", "--head-dim", "32",
                         "--max-cases", "7", "--out", str(tmp_path / "o"))  # fmt: skip
    assert code == 2, text
    assert "cases × configs make" in text and "points, more than the limit of 7" in text


def test_the_estimate_adds_warmup_max_time_and_overheads() -> None:
    timing = TimingConfig(max_time_s=2.0, warmup_ms=250.0)
    assert estimate_s(0, timing, telemetry=True) == 0
    assert estimate_s(40, timing, telemetry=False) == pytest.approx(5 + 40 * 2.75)
    assert estimate_s(40, timing, telemetry=True) == pytest.approx(5 + 40 * 3.75)
    assert human_duration(5 + 40 * 3.75) == "3 min" and human_duration(1e6) == "11.6 days"


_REAL_OOM = """
import resource, sys, torch
from fa_bench import registry
from fa_bench.case import Case
from fa_bench.run.execute import ExecOptions, run_case
from fa_bench.run.timing import TimingConfig
registry.load()
vm = [int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmSize")][0]
resource.setrlimit(resource.RLIMIT_AS, (vm + (1 << 30), vm + (1 << 30)))
case = Case(impl="naive", mode="fwd", dtype="fp32", batch=1, heads_q=3, heads_kv=3,
            seqlen_q=24000, seqlen_k=24000, head_dim=8, causal=False)  # scores: 6.9 GB
timing = TimingConfig(target_noise=0.2, min_samples=2, min_time_s=0, max_time_s=0.01,
                      warmup_ms=0)
record = run_case(case, torch.device("cpu"), ExecOptions(timing=timing))
print(record.status.value, record.error)
"""


@pytest.mark.slow
def test_a_real_cpu_allocation_failure_is_oom() -> None:
    """The CPU allocator's own message, under an address-space limit (ulimit -v)."""
    proc = subprocess.run([sys.executable, "-c", _REAL_OOM], capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("oom "), proc.stdout
    assert "can't allocate memory" in proc.stdout


def test_min_samples_past_a_million_and_an_empty_gpus_exit_2(tmp_path: Path) -> None:
    runner = CliRunner()
    r = runner.invoke(cli.app, ["run", "--min-samples", "1000001", "--out", str(tmp_path / "a")])
    assert r.exit_code == 2 and "--min-samples" in r.output, r.output
    r = runner.invoke(
        cli.app, ["run", "--device", "cpu", "--gpus", "", "--out", str(tmp_path / "b")]
    )
    assert r.exit_code == 2 and "--gpus" in r.output, r.output
    assert not (tmp_path / "b" / "journal.jsonl").exists()
