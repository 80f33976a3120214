"""Plugin packages through the `fa_bench.impls` entry-point group (issue 17, item 4).

In-process: entry points stood in for (a module one, a callable one, broken ones) show the
rules: loaded after the built-ins, origins named, a broken one recorded with its name,
distribution and error and never raised. Slow: the documented example package and a
broken one installed into a fresh virtual environment, listed and run on the CPU."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import venv
from dataclasses import dataclass
from importlib import import_module
from pathlib import Path

import pytest
from conftest import FAST
from typer.testing import CliRunner

import fa_bench
import fa_bench.cli as cli
from fa_bench import registry

runner = CliRunner()
ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "docs" / "examples" / "fa-bench-plugin-example"
BROKEN = ROOT / "tests" / "plugins" / "fa-bench-broken-plugin"


@dataclass
class _Dist:
    name: str
    version: str


@dataclass
class _EntryPoint:
    """What importlib.metadata gives: a name, a value, its distribution and load()."""

    name: str
    value: str
    dist: _Dist

    def load(self) -> object:
        module, _, attr = self.value.partition(":")
        loaded = import_module(module)
        return getattr(loaded, attr) if attr else loaded


_REGISTERS = textwrap.dedent("""
    import torch
    from fa_bench.registry import register

    def build(case, q, k, v):
        return lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v)
""")


@pytest.fixture
def packages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Stand-in entry points over modules written to tmp_path; the registry restored."""
    monkeypatch.syspath_prepend(str(tmp_path))
    registry.load()  # the built-ins in the registry kept, before it is copied
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    monkeypatch.setattr(registry, "_PACKAGES", None)
    modules = {
        "ep_mod": _REGISTERS + "register('ep-module', description='by import')(build)\n",
        "ep_fn": _REGISTERS + "def setup():\n    register('ep-callable', description='x')(build)\n",
        "ep_raises": _REGISTERS + "register('ep-half', description='x')(build)\n"
        "raise RuntimeError('licence server unreachable')\n",
        "ep_missing": "import ep_dependency_nowhere\n",
        "ep_dup": _REGISTERS + "register('naive', description='taken')(build)\n",
        "ep_value": "answer = 42\n",
    }
    for name, text in modules.items():
        (tmp_path / f"{name}.py").write_text(text)
        monkeypatch.delitem(sys.modules, name, raising=False)
    eps = [
        _EntryPoint("good-module", "ep_mod", _Dist("pkg-good", "1.0")),
        _EntryPoint("good-callable", "ep_fn:setup", _Dist("pkg-fn", "2.1")),
        _EntryPoint("raises", "ep_raises", _Dist("pkg-raises", "0.3")),
        _EntryPoint("missing", "ep_missing", _Dist("pkg-missing", "0.4")),
        _EntryPoint("dup", "ep_dup", _Dist("pkg-dup", "0.5")),
        _EntryPoint("value", "ep_value:answer", _Dist("pkg-value", "0.6")),
    ]
    monkeypatch.setattr(registry, "_entry_points", lambda: eps)
    return eps


def test_entry_points_register_and_broken_ones_are_recorded(packages: list) -> None:
    impls = registry.load()
    assert impls["ep-module"].source == "pkg-good 1.0"
    assert impls["ep-callable"].source == "pkg-fn 2.1"
    assert impls["naive"].source == "built-in" and "ep-half" not in impls  # nothing half-done
    found = {p.name: p for p in registry.package_plugins()}
    assert found["good-module"].impls == ("ep-module",) and found["good-module"].error is None
    errors = {p.name: p.error for p in registry.broken_packages()}
    assert set(errors) == {"raises", "missing", "dup", "value"}
    assert "pkg-raises 0.3" in errors["raises"] and "licence server unreachable" in errors["raises"]
    assert "ep_raises.py:" in errors["raises"]  # the package's own line
    assert "ep_dependency_nowhere" in errors["missing"] and "not installed" in errors["missing"]
    assert "registered twice" in errors["dup"] and "'naive'" in errors["dup"]
    assert "not a module or a callable" in errors["value"]
    registry.load()  # once per process: not loaded (nor reported) again
    assert len(registry.package_plugins()) == len(packages)


def test_list_impls_and_env_show_origins_and_broken_packages(
    packages: list, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The JSON holds the table's rows whole (a table row wraps where a long description
    # from another test's plugin widens a column).
    listed = runner.invoke(cli.app, ["list", "impls", "--json"])
    assert listed.exit_code == 0, listed.output
    rows = {row["name"]: row for row in json.loads(listed.stdout)}
    assert "pkg-good 1.0" in rows["ep-module"]["origin"]
    assert "pkg-fn 2.1" in rows["ep-callable"]["origin"]
    assert not rows["raises"]["available"] and "pkg-raises 0.3" in rows["raises"]["origin"]
    assert "licence server unreachable" in rows["raises"]["reason"]
    env = runner.invoke(cli.app, ["env"])
    assert env.exit_code == 0, env.output
    # a cell's text may wrap inside the table (the longest implementation name sets the
    # first column's width): read it with the borders and line breaks collapsed
    text = re.sub(r"[│\s]+", " ", env.output)
    assert "package plugin 'missing' (pkg-missing 0.4, ep_missing)" in text


def test_a_run_records_its_package_plugins(packages: list, tmp_path: Path) -> None:
    import sys as _sys

    from rich.console import Console

    from fa_bench.commands.run import RunRequest, _plan_new

    out = tmp_path / "out"
    req = RunRequest(suites=("smoke",), impls=("ep-module",), device="cpu", out=out)
    plan, _ = _plan_new(req, Console(file=_sys.stderr))
    recorded = {p["name"]: p for p in plan.run["plugin_packages"]}
    assert recorded["good-module"]["dist"] == "pkg-good"
    assert recorded["good-module"]["version"] == "1.0"
    assert list(recorded["good-module"]["impls"]) == ["ep-module"]
    assert "licence server unreachable" in recorded["raises"]["error"]


# --- a fresh virtual environment -------------------------------------------------------


def _pip_install(python: Path, package: Path, cwd: Path) -> None:
    # Offline: no index, no build isolation (setuptools comes from the system site).
    done = subprocess.run(
        [str(python), "-m", "pip", "install", "--no-deps", "--no-build-isolation",
         "--no-index", "--disable-pip-version-check", "--quiet", str(package)],
        cwd=cwd, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


def _fa_bench(python: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "1000"}
    env.pop("PYTHONPATH", None)
    code = "import sys; from fa_bench.entry import main; sys.argv[0] = 'fa-bench'; main()"
    return subprocess.run([str(python), "-c", code, *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip


@pytest.mark.slow
def test_an_installed_package_is_listed_and_run_and_a_broken_one_reported(
    tmp_path: Path,
) -> None:
    home = tmp_path / "venv"
    venv.EnvBuilder(system_site_packages=True, with_pip=False).create(home)
    python = home / "bin" / "python"
    where = subprocess.run([str(python), "-c", "import fa_bench; print(fa_bench.__file__)"],
                           capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    assert Path(where) == Path(fa_bench.__file__)  # this checkout, seen from the venv
    # pip from the system site installs into the venv it runs under.
    for package in (EXAMPLE, BROKEN):  # copied: pip builds in the tree it is given
        _pip_install(python, shutil.copytree(package, tmp_path / package.name), tmp_path)

    listed = _fa_bench(python, tmp_path, "list", "impls")
    assert listed.returncode == 0, listed.stdout + listed.stderr
    rows = {line.split("│")[1].strip(): line for line in listed.stdout.splitlines()
            if line.count("│") > 2}  # fmt: skip
    assert "fa-bench-plugin-example 0.1.0" in rows["example-sdpa"]
    assert "fa-bench-broken-plugin 0.2.0" in rows["broken"] and "unavailable" in rows["broken"]
    assert "fa_bench_missing_dependency_ep" in rows["broken"]

    out = tmp_path / "out"
    args = ["run", "-s", "smoke", "-i", "example-sdpa", "-i", "naive", "--mode", "fwd"]
    done = _fa_bench(python, tmp_path, *args, "--device", "cpu", "--out", str(out),
                     "--no-report", *FAST)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    warning = done.stderr.replace("\n", " ")
    assert (
        "warning:" in warning and "package plugin 'broken' (fa-bench-broken-plugin 0.2.0" in warning
    )
    doc = json.loads((out / "results.json").read_text())
    status = {(c["impl"], c["seqlen_q"], c["causal"]): c["status"] for c in doc["cases"]}
    example = {k: v for k, v in status.items() if k[0] == "example-sdpa"}
    # smoke's ragged causal case (17 x 100) is one example-sdpa's check refuses.
    assert example and all(v == "ok" for k, v in example.items() if k[1] != 17), status
    assert status[("example-sdpa", 17, True)] == "unsupported"
    assert {v for k, v in status.items() if k[0] == "naive"} == {"ok"}
    packages = {p["name"]: p for p in doc["run"]["plugin_packages"]}
    assert packages["example"]["dist"] == "fa-bench-plugin-example"
    assert packages["example"]["version"] == "0.1.0"
    assert (
        packages["broken"]["error"]
        and "fa_bench_missing_dependency_ep" in packages["broken"]["error"]
    )
