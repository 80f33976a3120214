"""Plugins (issue 16, items 10 and 12): import failures are exit 2 naming the plugin and its
error; registration messages name the file; a builder's bad return value is an error
naming the implementation; `--resume` lists its plugin files and refuses a changed one."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from conftest import FAST, write_suite
from rich.console import Console
from typer.testing import CliRunner

import fa_bench.cli as cli
from fa_bench import registry
from fa_bench.case import Case, DType, Mode, Status
from fa_bench.commands.run import RunRequest, _plan_new, _resume
from fa_bench.results.files import PLAN, append_journal
from fa_bench.results.record import CaseRecord
from fa_bench.run.distributed import detect
from fa_bench.run.execute import ExecOptions, run_case
from fa_bench.run.plan import save_plan
from fa_bench.run.plugin_files import KEY, PluginResumeError, check_resume
from fa_bench.run.timing import TimingConfig

runner = CliRunner()
BAD_BUILDERS = str(Path(__file__).parent / "plugins" / "harden_bad_builders.py")

# (file text, what the message must hold besides the plugin's path)
BROKEN = {
    "indent": ("def f():\nreturn 1\n", ["IndentationError", ":2:"]),
    "unclosed": ("x = [1,\n  2,\n", ["SyntaxError", ":1:"]),
    "zerodiv": ("import math\nratio = 1 / 0\n", ["ZeroDivisionError", "division by zero", ":2"]),
    "name": ("from os import no_such_name_in_os\n", ["ImportError", "no_such_name_in_os"]),
    "dep": ("import fa_bench_missing_dependency_q\n", ["ModuleNotFoundError", "not installed"]),
    "exit": ("import sys\nsys.exit(3)\n", ["SystemExit", "3"]),
}


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / f"{name}.py"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize("command", [["list", "impls"], ["env"]])
@pytest.mark.parametrize("kind", sorted(BROKEN))
def test_a_broken_plugin_file_exits_2_naming_it(tmp_path: Path, command: list, kind: str) -> None:
    text, expected = BROKEN[kind]
    path = _write(tmp_path, f"broken_{kind}", text)
    result = runner.invoke(cli.app, [*command, "--plugin", str(path)])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and "internal error" not in result.output
    assert f"--plugin {path}" in result.output
    for part in expected:
        assert part in result.output
    if command == ["env"]:  # nothing of the machine is shown before the error
        assert "environment" not in result.output


def test_run_refuses_a_broken_plugin_before_any_case(tmp_path: Path) -> None:
    path = _write(tmp_path, "broken_run", "raise LookupError('no table for gfx1100')\n")
    out = tmp_path / "out"
    result = runner.invoke(
        cli.app, ["run", "--device", "cpu", "--plugin", str(path), "--out", str(out)]
    )
    assert result.exit_code == 2, result.output
    assert "LookupError: no table for gfx1100" in result.output and str(path) in result.output
    assert not out.exists()  # no plan, no worker, no case


def test_module_plugins_missing_or_failing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "hp_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "bad.py").write_text("import json\njson.loads('{')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    result = runner.invoke(cli.app, ["list", "impls", "--plugin", "hp_pkg.bad"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "--plugin hp_pkg.bad" in result.output and "JSONDecodeError" in result.output
    assert "bad.py:2" in result.output
    result = runner.invoke(cli.app, ["list", "impls", "--plugin", "hp_pkg.absent"])
    assert result.exit_code == 2 and "no module named 'hp_pkg.absent'" in result.output


def test_a_failed_import_registers_nothing(tmp_path: Path) -> None:
    text = textwrap.dedent("""
        from fa_bench.registry import register

        @register("hp-half", description="registered before the failure")
        def half(case, q, k, v):
            return None

        raise RuntimeError("late failure")
    """)
    path = _write(tmp_path, "half", text)
    with pytest.raises(registry.PluginError, match="late failure"):
        registry.load([str(path)])
    assert "hp-half" not in registry.names()
    path.write_text(text.replace('raise RuntimeError("late failure")', ""))
    registry.load([str(path)])  # fixed: imported again, no duplicate
    assert "hp-half" in registry.names()


def test_plugin_files_with_one_name_are_both_imported(tmp_path: Path) -> None:
    for folder, impl in (("a", "hp-twin-a"), ("b", "hp-twin-b")):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "impls.py").write_text(
            f"from fa_bench.registry import register\n"
            f"register({impl!r}, description='x')(lambda case, q, k, v: None)\n"
        )
    registry.load([str(tmp_path / "a" / "impls.py"), str(tmp_path / "b" / "impls.py")])
    assert {"hp-twin-a", "hp-twin-b"} <= set(registry.names())


def test_duplicate_and_bad_mode_messages_name_the_files(tmp_path: Path) -> None:
    head = "from fa_bench.registry import register\ndef REG(case, q, k, v):\n    return None\n"
    first = _write(tmp_path, "first_reg", head + "register('hp-dup', description='x')(REG)\n")
    second = _write(tmp_path, "second_reg", head + "\nregister('hp-dup', description='y')(REG)\n")
    registry.load([str(first)])
    result = runner.invoke(cli.app, ["list", "impls", "--plugin", str(second)])
    assert result.exit_code == 2, result.output
    assert f"by {second}:2 and before that by {first}:2" in result.output
    assert "registered twice" in result.output
    bad = _write(tmp_path, "bad_dtype", head + "register('hp-int4', description='x', "
                 "dtypes=['int4'])(REG)\n")  # fmt: skip
    result = runner.invoke(cli.app, ["list", "impls", "--plugin", str(bad)])
    assert result.exit_code == 2
    assert f"({bad}:2)" in result.output and "'int4' is not one of" in result.output
    assert "dtypes" in result.output and "fp16" in result.output


def _case(impl: str) -> Case:
    return Case(impl=impl, mode=Mode.FWD, dtype=DType.FP32, batch=1, heads_q=2, heads_kv=2,
                seqlen_q=16, seqlen_k=16, head_dim=16, causal=False)  # fmt: skip


@pytest.mark.parametrize(
    ("impl", "shown"),
    [("hb-returns-str", "a str"), ("hb-returns-int", "a int"),
     ("hb-returns-tensor", "a Tensor of shape (1, 2, 16, 16)"),
     ("hb-prepared-none", "a Prepared whose fn is None")],
)  # fmt: skip
def test_a_builders_bad_value_is_an_error_naming_the_impl(impl: str, shown: str) -> None:
    registry.load([BAD_BUILDERS])
    case = _case(impl)
    q = k = v = torch.zeros(1, 2, 16, 16)
    with pytest.raises(registry.BuilderError) as info:
        registry.get(impl).prepare(case, q, k, v)
    message = str(info.value)
    assert repr(impl) in message and shown in message and "harden_bad_builders.py" in message
    timing = TimingConfig(max_time_s=0.05, min_samples=3)
    record = run_case(case, torch.device("cpu"), ExecOptions(timing=timing))
    assert record.status is Status.ERROR
    assert record.error is not None and "BuilderError" in record.error and impl in record.error
    assert "max()" not in record.error
    good = run_case(_case("hb-good"), torch.device("cpu"), ExecOptions(timing=timing))
    assert good.status is Status.OK


# --- --resume and plugin files ---------------------------------------------------------


def _plugin(folder: Path, impl: str) -> Path:
    return _write(folder, f"resume_{impl.replace('-', '_')}", textwrap.dedent(f"""
        import torch
        from fa_bench.registry import register

        @register({impl!r}, description="SDPA")
        def build(case, q, k, v):
            return lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v)
    """))  # fmt: skip


def _finished_run(tmp_path: Path, plugin: str, impl: str) -> Path:
    """A run folder whose cases are all journaled: a resume runs no worker."""
    suite = write_suite(tmp_path / "suite.toml", [impl])
    out = tmp_path / "out"
    req = RunRequest(suites=(str(suite),), plugins=(plugin,), device="cpu", out=out)
    plan, _ = _plan_new(req, Console(file=sys.stderr))
    out.mkdir(exist_ok=True)  # _plan_new may have made it (checking --out)
    save_plan(out, plan)
    for case in plan.cases:
        append_journal(out, CaseRecord.for_case(case, "cpu", Status.UNSUPPORTED, error="n/a"))
    return out


def test_a_new_run_records_its_plugin_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    plugin = _plugin(tmp_path, "hp-rec")
    out = _finished_run(tmp_path, plugin.name, "hp-rec")  # relative, as typed
    run = json.loads((out / PLAN).read_text())["run"]
    (rec,) = run[KEY]
    assert rec["path"] == str(plugin.resolve())
    assert rec["sha256"] == registry.file_sha256(plugin)
    assert run["options"]["plugins"] == [str(plugin.resolve())]  # absolute: found from anywhere


def test_resume_refuses_a_changed_plugin_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plugin = _plugin(tmp_path, "hp-changed")
    out = _finished_run(tmp_path, str(plugin), "hp-changed")
    plugin.write_text(plugin.read_text() + "print('added after the run began')\n")
    imported: list = []
    monkeypatch.setattr(registry, "load", lambda plugins=(): imported.append(plugins) or {})
    result = runner.invoke(cli.app, ["run", "--resume", str(out), "--no-report"])
    assert result.exit_code == 2, result.output
    assert f"plugin file {plugin} changed since the run began" in result.output
    assert f"--plugin {plugin}" in result.output
    assert imported == []  # refused before importing anything
    assert not (out / "results.json").exists()


def test_resume_uses_a_changed_file_named_again(tmp_path: Path) -> None:
    plugin = _plugin(tmp_path, "hp-again")
    out = _finished_run(tmp_path, str(plugin), "hp-again")
    plugin.write_text(plugin.read_text() + "# reformatted\n")
    result = runner.invoke(
        cli.app, ["run", "--resume", str(out), "--plugin", str(plugin), "--no-report"]
    )
    assert result.exit_code == 0, result.output
    assert "named by --plugin: using it" in result.output.replace("\n", " ")
    (rec,) = json.loads((out / PLAN).read_text())["run"][KEY]
    assert rec["sha256"] == registry.file_sha256(plugin) and len(rec["previous_sha256"]) == 1


def test_resume_of_an_old_plan_lists_its_plugins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    plugin = _plugin(tmp_path, "hp-old")
    out = _finished_run(tmp_path, str(plugin), "hp-old")
    doc = json.loads((out / PLAN).read_text())
    del doc["run"][KEY]  # as fa-bench wrote it before plugin files were recorded,
    doc["run"]["options"]["plugins"] = [plugin.name]  # relative, as it was given
    (out / PLAN).write_text(json.dumps(doc))
    _, _, parts, _ = _resume(RunRequest(resume=out), detect(), out, Console(file=sys.stderr))
    assert parts[0].plan.options.plugins == (str(plugin),)  # the worker runs in `out`
    result = runner.invoke(cli.app, ["run", "--resume", str(out), "--no-report"])
    assert result.exit_code == 0, result.output
    assert "plugins to import" in result.output and "no hash recorded" in result.output
    assert plugin.name in result.output.replace("\n", "")


def test_resume_lists_unchanged_files_and_refuses_a_foreign_plugin(tmp_path: Path) -> None:
    lines: list[str] = []
    a = _plugin(tmp_path, "hp-listed")
    run = {KEY: [{"plugin": str(a), "path": str(a), "sha256": registry.file_sha256(a)}]}
    check_resume(run, [str(a)], [], lines.append)
    assert lines == ["plugins to import for this resume:", f"  {a} (unchanged since the run began)"]
    other = _write(tmp_path, "other_plugin", "")
    with pytest.raises(PluginResumeError, match="not a plugin of the run being resumed"):
        check_resume(run, [str(a)], [str(other)], lines.append)


# --- the worker's own import ------------------------------------------------------------


@pytest.mark.slow
def test_a_worker_that_cannot_import_a_plugin_stops_the_run(tmp_path: Path) -> None:
    from fa_bench.run.runner import WorkerPluginError, execute

    text = textwrap.dedent("""
        from pathlib import Path
        import torch
        from fa_bench.registry import register

        if Path("refuse-in-worker").exists():  # the worker runs in the output folder
            raise PermissionError("licence server unreachable")

        @register("hp-worker", description="SDPA")
        def build(case, q, k, v):
            return lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v)
    """)
    plugin = _write(tmp_path, "worker_refuses", text)
    suite = write_suite(tmp_path / "s.toml", ["hp-worker"], seqlens=[16, 32, 48])
    out = tmp_path / "out"
    plan, _ = _plan_new(RunRequest(suites=(str(suite),), plugins=(str(plugin),), device="cpu",
                                   out=out), Console(file=sys.stderr))  # fmt: skip
    out.mkdir(exist_ok=True)  # _plan_new may have made it (checking --out)
    (out / "refuse-in-worker").touch()
    # Issue 15 item 1: no longer two failed starts and an error record per case, but a
    # stop at once (exit 2 in `run`) with no record.
    with pytest.raises(WorkerPluginError) as info:
        execute(plan.cases, out, plan.options)
    message = str(info.value)
    assert f"--plugin {plugin}" in message and "PermissionError" in message
    assert "Traceback" not in message
    journal = out / "journal.jsonl"
    assert not journal.exists() or not journal.read_text()


@pytest.mark.slow
def test_a_relative_plugin_file_reaches_the_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    _plugin(tmp_path, "hp-relative")
    suite = write_suite(tmp_path / "s.toml", ["hp-relative"], seqlens=[16])
    args = ["-s", str(suite), "--device", "cpu", "--plugin", "resume_hp_relative.py"]
    result = runner.invoke(cli.app, ["run", *args, "--out", "o", "--no-report", *FAST])
    assert result.exit_code == 0, result.output
    (record,) = json.loads((tmp_path / "o" / "results.json").read_text())["cases"]
    assert record["status"] == "ok"


def test_resume_refuses_a_plugin_added_to_plan_json(tmp_path: Path) -> None:
    plugin = _plugin(tmp_path, "hp-kept")
    out = _finished_run(tmp_path, str(plugin), "hp-kept")
    marker = tmp_path / "planted-ran"
    planted = _write(tmp_path, "planted", f"open({str(marker)!r}, 'w').close()\n")
    doc = json.loads((out / PLAN).read_text())
    doc["run"]["options"]["plugins"].append(str(planted))  # not recorded at the start
    (out / PLAN).write_text(json.dumps(doc))
    result = runner.invoke(cli.app, ["run", "--resume", str(out), "--no-report"])
    assert result.exit_code == 2, result.output
    text = result.output.replace("\n", " ")
    assert f"{plugin} (unchanged since the run began)" in text
    assert f"plugin {planted} is in plan.json's options but not among" in text
    assert not marker.exists()  # never imported, in this process or a worker
    lines: list[str] = []
    check_resume(doc["run"], doc["run"]["options"]["plugins"], [str(planted)], lines.append)
    assert "named by --plugin: importing it" in lines[-1]
    assert doc["run"][KEY][-1]["sha256"] == registry.file_sha256(planted)
