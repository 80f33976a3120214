"""The CLI's vocabulary: exit codes of user mistakes and of bugs, --debug, the parsed argv,
the shared run/sweep options, and --resume of a plan.json the previous version wrote."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import FAST
from typer.testing import CliRunner

import fa_bench.cli as cli
from fa_bench.results.files import JOURNAL, PLAN
from fa_bench.run.plan import PlanError

runner = CliRunner()


def _boom(*args: object, **kwargs: object) -> int:
    raise KeyError("a bug, not the user's mistake")


def test_an_internal_error_exits_1_with_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli, "run_command", _boom)
    result = runner.invoke(cli.app, ["run", "--device", "cpu"])
    assert result.exit_code == 1, result.output
    assert "internal error" in result.output and "KeyError" in result.output
    assert "--debug" in result.output
    assert "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_debug_shows_the_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli, "run_command", _boom)
    result = runner.invoke(cli.app, ["--debug", "run", "--device", "cpu"])
    assert result.exit_code == 1
    assert "Traceback" in result.output and "_boom" in result.output


def test_a_domain_error_escaping_a_command_exits_2(monkeypatch: pytest.MonkeyPatch) -> None:
    def plan_error(*args: object, **kwargs: object) -> int:
        raise PlanError("--out x: already holds a run")

    monkeypatch.setattr(cli, "run_command", plan_error)
    result = runner.invoke(cli.app, ["run"])
    assert result.exit_code == 2
    assert result.output.strip() == "error: --out x: already holds a run"


def test_plugin_error_in_list_exits_2() -> None:
    result = runner.invoke(cli.app, ["list", "impls", "--plugin", "no_such_plugin_module"])
    assert result.exit_code == 2
    assert "error:" in result.output and "internal error" not in result.output


@pytest.mark.parametrize("args", [["--mode", "sideways"], ["--device", "tpu"], ["--dtype", "fp8"]])
def test_sweep_rejects_bad_choices_like_run(args: list[str]) -> None:
    result = runner.invoke(cli.app, ["sweep", *args])
    assert result.exit_code == 2
    assert args[0] in result.output


def test_run_and_sweep_share_one_timeout_option() -> None:
    from fa_bench.commands.run import RunRequest
    from fa_bench.commands.sweep import SweepRequest

    assert RunRequest().case_timeout_s == 600.0
    assert SweepRequest().case_timeout_s == 300.0
    assert RunRequest(timeout_s=7).case_timeout_s == SweepRequest(timeout_s=7).case_timeout_s
    import typer

    group = typer.main.get_command(cli.app)
    for command in ("run", "sweep"):
        (timeout,) = [p for p in group.commands[command].params if "--timeout" in p.opts]
        assert timeout.default is None and "600 for run; 300 for sweep" in timeout.help


@pytest.mark.slow
@pytest.mark.slow
def test_argv_is_what_was_parsed_and_old_plans_resume(tmp_path: Path, tiny_suite) -> None:
    path = tiny_suite(["naive"], seqlens=[8, 16])
    out = tmp_path / "run"
    args = ["run", "-s", str(path), "--device", "cpu", "--out", str(out), "--no-report", *FAST]
    result = runner.invoke(cli.app, args)
    assert result.exit_code == 0, result.output
    doc = json.loads((out / "results.json").read_text())
    assert doc["run"]["argv"] == ["fa-bench", *args]
    # plan.json holds the options once: run.options (as results.json has them) + the GPU.
    plan = json.loads((out / PLAN).read_text())
    assert "options" not in plan and plan["run"]["options"] == doc["run"]["options"]
    # The previous version's plan.json (both copies, schema /1), one case left to run.
    plan["schema"] = "fa-bench-plan/1"
    plan["options"] = {**plan["run"]["options"], "gpu": plan.pop("gpu")}
    (out / PLAN).write_text(json.dumps(plan, indent=1))
    lines = (out / JOURNAL).read_text().splitlines(keepends=True)
    (out / JOURNAL).write_text(lines[0])
    result = runner.invoke(cli.app, ["run", "--resume", str(out), "--no-report"])
    assert result.exit_code == 0, result.output
    assert "1 already done" in result.output
    again = json.loads((out / "results.json").read_text())
    assert [c["status"] for c in again["cases"]] == ["ok", "ok"]
    assert again["run"]["options"] == doc["run"]["options"]
    assert json.loads((out / PLAN).read_text())["schema"] == "fa-bench-plan/2"
