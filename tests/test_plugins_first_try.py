"""Plugins from where the user stands (issue 15, item 1): a .py file or a module name in
the current folder works in `list`, `env`, `run` and a `--resume` started elsewhere; a
plugin the worker cannot import stops the run at once with exit 2 and no case record.
The documented example file (docs/examples/my_attention.py) is the one run here."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import FAST, write_suite
from rich.console import Console
from typer.testing import CliRunner

import fa_bench.cli as cli
from fa_bench import registry
from fa_bench.case import Status
from fa_bench.commands.run import RunRequest, _plan_new
from fa_bench.results.files import PLAN, append_journal
from fa_bench.results.record import CaseRecord
from fa_bench.run.plan import save_plan

runner = CliRunner()
ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "docs" / "examples" / "my_attention.py"


def _module(folder: Path, name: str, impl: str) -> Path:
    path = folder / f"{name}.py"
    path.write_text(textwrap.dedent(f"""
        import torch
        from fa_bench.registry import register

        @register({impl!r}, description="SDPA from a module in the current folder")
        def build(case, q, k, v):
            return lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v)
    """))  # fmt: skip
    return path


@pytest.mark.parametrize("command", [["list", "impls"], ["env"]])
def test_a_module_in_the_current_folder_is_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: list[str]
) -> None:
    name = f"pft_mod_{command[0]}"
    _module(tmp_path, name, f"pft-{command[0]}")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the folder appended is undone after
    result = runner.invoke(cli.app, [*command, "--plugin", name])
    assert result.exit_code == 0, result.output
    assert f"pft-{command[0]}" in result.output
    # Appended, not prepended: nothing in the folder can shadow fa_bench or its packages.
    assert sys.path[-1] == str(tmp_path)


def test_list_impls_names_each_implementations_origin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _module(tmp_path, "pft_origin", "pft-origin")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("COLUMNS", "200")
    result = runner.invoke(cli.app, ["list", "impls", "--plugin", "pft_origin"])
    assert result.exit_code == 0, result.output
    rows = {line.split("│")[1].strip(): line for line in result.output.splitlines()
            if line.count("│") > 2}  # fmt: skip
    assert "--plugin pft_origin" in rows["pft-origin"] and "built-in" in rows["naive"]


def test_a_missing_module_says_where_it_was_looked_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    result = runner.invoke(cli.app, ["list", "impls", "--plugin", "pft_absent"])
    assert result.exit_code == 2
    text = result.output.replace("\n", "")
    assert "no module named 'pft_absent'" in text and f"searched sys.path and {tmp_path}" in text


def test_a_resume_started_elsewhere_finds_the_runs_module_plugin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run is planned in `home` with a module plugin; the resume starts in another
    folder, in a process that never imported it (sys.modules, sys.path and the registry
    as they were), and must find it where the run found it."""
    home, elsewhere = tmp_path / "home", tmp_path / "elsewhere"
    home.mkdir(), elsewhere.mkdir()
    _module(home, "pft_resumed", "pft-resumed")
    suite = write_suite(tmp_path / "suite.toml", ["pft-resumed"])
    monkeypatch.chdir(home)
    monkeypatch.setattr(sys, "path", list(sys.path))
    out = tmp_path / "out"
    req = RunRequest(suites=(str(suite),), plugins=("pft_resumed",), device="cpu", out=out)
    plan, _ = _plan_new(req, Console(file=sys.stderr))
    out.mkdir(exist_ok=True)
    save_plan(out, plan)
    for case in plan.cases:  # every case journaled: the resume starts no worker
        append_journal(out, CaseRecord.for_case(case, "cpu", Status.UNSUPPORTED, error="n/a"))
    assert json.loads((out / PLAN).read_text())["run"]["options"]["plugin_dir"] == str(home)
    # A fresh process, as far as the plugin goes.
    sys.path.remove(str(home))
    monkeypatch.delitem(sys.modules, "pft_resumed")
    monkeypatch.delitem(registry._REGISTRY, "pft-resumed")
    monkeypatch.chdir(elsewhere)
    result = runner.invoke(cli.app, ["run", "--resume", str(out), "--no-report"])
    assert result.exit_code == 0, result.output
    text = result.output.replace("\n", "")
    assert f"{home / 'pft_resumed.py'} (unchanged since the run began)" in text
    assert "pft-resumed" in registry.names()


# --- end to end: `fa-bench` in a subprocess, as a user runs it --------------------------


def _fa_bench(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run(
        [shutil.which("fa-bench") or "fa-bench", *args], cwd=cwd, env=env,
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def _user_folder(tmp_path: Path) -> Path:
    """The user's folder: the documented example file, and a broken `fa_bench` package
    that must not shadow the installed one (in the command or in its worker)."""
    cwd = tmp_path / "work"
    (cwd / "fa_bench").mkdir(parents=True)
    (cwd / "fa_bench" / "__init__.py").write_text("raise ImportError('shadowed fa_bench')\n")
    shutil.copy(EXAMPLE, cwd / "my_attention.py")
    return cwd


@pytest.mark.slow
@pytest.mark.parametrize("plugin", ["my_attention.py", "my_attention"])
def test_the_example_plugin_runs_by_relative_path_and_by_module_name(
    tmp_path: Path, plugin: str
) -> None:
    cwd, out = _user_folder(tmp_path), tmp_path / "runs" / "mine"
    args = ["run", "-s", "smoke", "-i", "mine", "--plugin", plugin, "--device", "cpu"]
    done = _fa_bench(cwd, *args, "--out", str(out), "--no-report", *FAST)
    assert done.returncode == 0, done.stdout + done.stderr
    cases = json.loads((out / "results.json").read_text())["cases"]
    assert len(cases) == 14 and {c["status"] for c in cases} == {"ok"}, cases
    assert {c["impl"] for c in cases} == {"mine"}


@pytest.mark.slow
def test_a_plugin_that_fails_only_in_the_worker_stops_the_run_at_once(tmp_path: Path) -> None:
    cwd = tmp_path / "work"
    cwd.mkdir()
    # Imports in `fa-bench` (which runs in cwd), raises in the worker (in the output folder).
    (cwd / "cwd_bound.py").write_text(textwrap.dedent(f"""
        import os
        import torch
        from fa_bench.registry import register

        if os.getcwd() != {str(cwd)!r}:
            raise PermissionError(f"licence file not found in {{os.getcwd()}}")

        @register("cwd-bound", description="SDPA")
        def build(case, q, k, v):
            return lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v)
    """))  # fmt: skip
    out = tmp_path / "out"
    args = ["run", "-s", "smoke", "-i", "cwd-bound", "--plugin", "cwd_bound.py", "--device", "cpu"]
    done = _fa_bench(cwd, *args, "--out", str(out), *FAST)
    assert done.returncode == 2, done.stdout + done.stderr
    err = done.stderr.replace("\n", "")
    assert "in the worker: --plugin" in err and "cwd_bound.py" in err
    assert "PermissionError: licence file not found" in err and "Traceback" not in err
    journal = out / "journal.jsonl"
    assert not journal.exists() or journal.read_text() == ""  # no case record at all
    assert not (out / "results.json").exists()
    assert (out / PLAN).exists()  # fixed, the run can be finished with --resume


def test_the_plugin_page_shows_the_example_files_as_they_are() -> None:
    """docs/plugins.md quotes the example file and package whole: no drift."""
    import tomllib

    page = (ROOT / "docs" / "plugins.md").read_text()
    python = page.split("```python\n", 1)[1].split("```", 1)[0]
    assert python == EXAMPLE.read_text()
    toml = page.split("```toml\n", 1)[1].split("```", 1)[0]
    package = ROOT / "docs" / "examples" / "fa-bench-plugin-example" / "pyproject.toml"
    assert tomllib.loads(toml) == tomllib.loads(package.read_text())
