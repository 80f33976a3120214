"""`pip install .` and `pip install -e .` in fresh virtual environments: everything lives
under the one import name fa_bench, and the fa-bench console script works."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SUBPACKAGES = ["fa_bench.kernels", "fa_bench.suites", "fa_bench.reports", "fa_bench.cli"]


def _copy_source(dest: Path) -> Path:
    """A clean copy of the tracked tree (the install must not depend on stray files)."""
    files = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    for rel in files:
        src = ROOT / rel
        if src.is_symlink() or src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel, follow_symlinks=False)
    return dest


def _dependency_paths() -> list[str]:
    """Where this interpreter finds torch, typer, ...: its site-packages and the folders their
    .pth files add; not the standard library (a venv has its own) nor this checkout."""
    stdlib = [Path(sysconfig.get_path(k)).resolve() for k in ("stdlib", "platstdlib")]
    paths: list[str] = []
    for entry in sys.path:
        path = Path(entry or ".").resolve()
        in_stdlib = any(path == s or s in path.parents for s in stdlib)
        in_site = {"site-packages", "dist-packages"} & set(path.parts)
        # the checkout's own folders, but not a virtual environment kept inside it (.venv)
        if not path.is_dir() or path == ROOT or (ROOT in path.parents and not in_site):
            continue
        if (not in_stdlib or in_site) and str(path) not in paths:
            paths.append(str(path))
    return paths


def _venv(path: Path) -> Path:
    # pip installs only fa-bench itself; the dependencies come from the environment running
    # the tests. That may be a virtual environment, whose packages `--system-site-packages`
    # would not reach (it means the base interpreter's), so a .pth names them. Plain paths:
    # their own .pth files (an installed fa-bench's editable finder among them) stay unread.
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
    site = next((path / "lib").glob("python*/site-packages"))
    (site / "_test_env_dependencies.pth").write_text("\n".join(_dependency_paths()) + "\n")
    return path / "bin" / "python"


PROBE = """
import importlib.util, json, fa_bench
from fa_bench.suite.expand import builtin_suites
print(json.dumps({
    "pkg": fa_bench.__file__,
    "subs": {m: importlib.util.find_spec(m).origin for m in SUBPACKAGES},
    "suites": sorted(builtin_suites()),
}))
""".replace("SUBPACKAGES", repr(SUBPACKAGES))


@pytest.mark.slow
@pytest.mark.parametrize("editable", [False, True], ids=["wheel", "editable"])
def test_install_modes(tmp_path: Path, editable: bool) -> None:
    import json

    src = _copy_source(tmp_path / "src")
    py = _venv(tmp_path / "venv")
    target = ["-e", str(src)] if editable else [str(src)]
    subprocess.run(
        [str(py), "-m", "pip", "install", "-q", "--no-deps", *target],
        check=True,
        cwd=tmp_path,
    )
    run_dir = tmp_path / "elsewhere"
    run_dir.mkdir()
    probe = subprocess.run([str(py), "-c", PROBE], capture_output=True, text=True, cwd=run_dir)
    assert probe.returncode == 0, probe.stderr
    found = json.loads(probe.stdout)
    home = src if editable else tmp_path / "venv"
    for origin in [found["pkg"], *found["subs"].values()]:
        assert Path(origin).resolve().is_relative_to(home.resolve()), origin
    assert "smoke" in found["suites"] and "standard" in found["suites"]

    site = next((tmp_path / "venv" / "lib").glob("python*/site-packages"))
    if editable:
        finder = next(site.glob("__editable___fa_bench_*_finder.py")).read_text()
        mapping = ast.literal_eval(re.search(r"MAPPING[^=]*=\s*(\{.*?\})", finder, re.S)[1])
        assert {name.split(".")[0] for name in mapping} == {"fa_bench"}, mapping
        assert Path(mapping["fa_bench.kernels"]) == src / "kernels"
    else:
        top = {p.name for p in site.iterdir() if not p.name.endswith((".dist-info", ".pth"))}
        top -= {"__pycache__", "_distutils_hack", "pip", "setuptools", "pkg_resources"}
        assert top == {"fa_bench"}, top

    script = tmp_path / "venv" / "bin" / "fa-bench"
    for args in (["--help"], ["list", "suites"]):
        out = subprocess.run([str(script), *args], capture_output=True, text=True, cwd=run_dir)
        assert out.returncode == 0, out.stderr
    assert "smoke" in out.stdout
