"""The command line through Typer's CliRunner: exit codes, messages, outputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import FAST
from typer.testing import CliRunner

from fa_bench.cli import app
from fa_bench.results.files import load_results

runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(app, list(args))


def test_help_lists_commands() -> None:
    result = invoke("--help")
    assert result.exit_code == 0
    for command in ("run", "list", "env"):
        assert command in result.output
    assert "--target-noise" in invoke("run", "-h").output


def test_list_suites_and_impls() -> None:
    suites = invoke("list", "suites")
    assert suites.exit_code == 0
    for name in ("smoke", "standard", "long-context", "head-dims", "gqa"):
        assert name in suites.output
    impls = invoke("list", "impls")
    assert impls.exit_code == 0
    for name in ("naive", "sdpa-flash", "sdpa-cudnn", "sdpa-math", "flex"):
        assert name in impls.output


def test_list_unknown_target_exits_2() -> None:
    result = invoke("list", "gpus")
    assert result.exit_code == 2
    assert "'suites', 'impls'" in result.output  # click's choice check, in our error line


def test_env_reports_cpu_machine() -> None:
    result = invoke("env")
    assert result.exit_code == 0
    assert "torch" in result.output
    assert "No CUDA GPU visible" in result.output
    assert "sdpa-cudnn" in result.output


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--impl", "nope"], "--impl: 'nope' is not one of"),
        (["--impl", "nope"], "sdpa-math"),  # the valid choices are listed
        (["--suite", "no-such-suite"], "smoke"),
        (["--device", "cuda"], "no CUDA device"),
        (["--gpu", "1"], "--gpu"),
        (["--resume", "/nonexistent/run"], "plan.json"),
        (["--seqlen", "0"], "--seqlen"),
    ],
)
def test_bad_input_exits_2_with_message(args: list[str], needle: str) -> None:
    result = invoke("run", *args)
    assert result.exit_code == 2, result.output
    assert needle in result.output


@pytest.mark.parametrize("args", [["--dtype", "fp8"], ["--mode", "sideways"], ["--device", "tpu"]])
def test_bad_choice_exits_2_naming_choices(args: list[str]) -> None:
    result = invoke("run", *args)
    assert result.exit_code == 2
    assert args[0] in result.output


def test_bad_suite_file_exits_2_naming_file_and_key(tmp_path: Path, tiny_suite) -> None:
    path = tiny_suite(["naive"], dtypes=["fp8"])
    result = invoke("run", "--suite", str(path))
    assert result.exit_code == 2
    assert "tiny.toml" in result.output and "dtypes" in result.output and "bf16" in result.output


@pytest.mark.slow
def test_run_writes_results_and_csv(tmp_path: Path, tiny_suite) -> None:
    path = tiny_suite(["naive", "sdpa-math"], modes=["fwd", "bwd"], causal=[False, True])
    out = tmp_path / "run"
    result = invoke("run", "-s", str(path), "--device", "cpu", "--out", str(out), *FAST)
    assert result.exit_code == 0, result.output
    assert "CPU run" in result.output
    doc = load_results(out)
    assert len(doc.cases) == 16
    assert {c.status for c in doc.cases} == {"ok"}
    assert doc.run["argv"][:2] == ["fa-bench", "run"] or doc.run["argv"][0] == "fa-bench"
    assert (out / "results.csv").exists()
    # No --warmup: the CPU default, not the GPU's 500 ms settling time.
    assert {(c.timing or {})["warmup_ms"] for c in doc.cases} == {20.0}
    # overriding axes from the command line narrows the suite
    out2 = tmp_path / "run2"
    result = invoke(
        "run",
        "-s",
        str(path),
        "--device",
        "cpu",
        "--out",
        str(out2),
        "--impl",
        "naive",
        "--mode",
        "fwd",
        "--no-causal",
        "--seqlen",
        "8",
        "--warmup",
        "0",
        *FAST,
    )
    assert result.exit_code == 0, result.output
    cases = [c.to_json() for c in load_results(out2).cases]
    assert cases[0]["timing"]["warmup_ms"] == 0.0
    assert [(c["impl"], c["mode"], c["causal"], c["seqlen_q"]) for c in cases] == [
        ("naive", "fwd", False, 8)
    ]


@pytest.mark.slow
def test_out_folder_with_a_run_is_not_overwritten(tmp_path: Path, tiny_suite) -> None:
    path = tiny_suite(["naive"], seqlens=[8])
    out = tmp_path / "run"
    assert (
        invoke("run", "-s", str(path), "--device", "cpu", "--out", str(out), *FAST).exit_code == 0
    )
    again = invoke("run", "-s", str(path), "--device", "cpu", "--out", str(out), *FAST)
    assert again.exit_code == 2
    assert "--resume" in again.output


@pytest.mark.slow
def test_resume_of_a_complete_run_changes_nothing(tmp_path: Path, tiny_suite) -> None:
    path = tiny_suite(["naive"], seqlens=[8])
    out = tmp_path / "run"
    assert (
        invoke("run", "-s", str(path), "--device", "cpu", "--out", str(out), *FAST).exit_code == 0
    )
    before = json.loads((out / "results.json").read_text())["cases"]
    result = invoke("run", "--resume", str(out))
    assert result.exit_code == 0, result.output
    assert "1 already done" in result.output
    assert [c.to_json() for c in load_results(out).cases] == before
    assert invoke("run", "--resume", str(out), "--impl", "naive").exit_code == 2


def test_cases_run_shape_by_shape_with_impls_back_to_back() -> None:
    from fa_bench.case import Case
    from fa_bench.commands.run import interleave_impls

    def c(impl: str, n: int) -> Case:
        return Case(impl, "fwd", "fp16", 1, 2, 2, n, n, 16, False)

    suite_order = [c("a", 1), c("a", 2), c("b", 1), c("b", 2), c("a", 1)]
    assert [(x.impl, x.seqlen_q) for x in interleave_impls(suite_order)] == [
        ("a", 1),
        ("b", 1),
        ("a", 2),
        ("b", 2),
    ]
