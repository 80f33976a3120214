"""The project's import graph: no cycles, and a kernel library that stands alone.

The graph is read from the source, not from an import: every `import` and `from ... import`
of every module installed under fa_bench (the root folders that pyproject's package-dir maps
into it included), at any depth (a function's lazy import is an edge too, as is one under
`if TYPE_CHECKING:`: a cycle hidden from the interpreter is still a cycle in the design).
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 reads pyproject with the tomli backport
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "fa_bench"


def _package_dirs() -> dict[str, Path]:
    """Package name -> its source folder, as pyproject's package-dir maps them."""
    setup = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    return {name: ROOT / folder for name, folder in setup["package-dir"].items()}


def project_modules() -> dict[str, Path]:
    """Every module of the installed package: dotted name -> source file."""
    dirs = _package_dirs()
    # A mapped folder is its own package: skip it when walking its parent's folder.
    mapped = {folder.resolve() for folder in dirs.values()}
    modules: dict[str, Path] = {}
    for pkg, folder in dirs.items():
        for path in sorted(folder.rglob("*.py")):
            rel = path.relative_to(folder)
            if any((folder / part).resolve() in mapped for part in rel.parents[:-1]):
                continue
            if any(part.startswith(".") or part == "__pycache__" for part in rel.parts):
                continue
            parts = [pkg, *rel.with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def _from_source(node: ast.ImportFrom, package: str) -> str:
    """The absolute module a `from ... import` reads from (relative levels resolved)."""
    if not node.level:
        return node.module or ""
    base = package.split(".")
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _edges(tree: ast.AST, module: str, is_package: bool, modules: set[str]) -> set[str]:
    """The project modules that `module` imports, at any depth of its code."""
    package = module if is_package else module.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            source = _from_source(node, package)
            for alias in node.names:
                # `from pkg import submodule` is an edge to the submodule, not to pkg.
                sub = f"{source}.{alias.name}"
                targets.add(sub if sub in modules else source)
    return targets & modules


def import_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports."""
    modules = project_modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        graph[name] = _edges(tree, name, path.name == "__init__.py", set(modules))
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module, and self-imports (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph.get(v, ()):
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def test_the_graph_covers_the_mapped_folders() -> None:
    graph = import_graph()
    for name in ("fa_bench.cli", "fa_bench.kernels", "fa_bench.reports", "fa_bench.suites"):
        assert name in graph, name
    assert any(m.startswith("fa_bench.kernels.") for m in graph)
    assert any(m.startswith("fa_bench.reports.") for m in graph)
    assert "fa_bench.case" in graph["fa_bench.registry"]


def test_edges_resolve_relative_lazy_and_submodule_imports() -> None:
    source = (
        "from . import b\n"
        "from .c import thing\n"
        "from .. import top\n"
        "def f():\n"
        "    import p.q.d\n"
        "    from p import q\n"
    )
    modules = {"p", "p.top", "p.q", "p.q.a", "p.q.b", "p.q.c", "p.q.d"}
    edges = _edges(ast.parse(source), "p.q.a", False, modules)
    assert edges == {"p.q.b", "p.q.c", "p.top", "p.q.d", "p.q"}
    assert _edges(ast.parse("from . import a"), "p.q", True, modules) == {"p.q.a"}


def test_cycles_finds_components_and_self_imports() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"d"}, "e": {"a"}}
    assert cycles(graph) == [["a", "b", "c"], ["d"]]


def test_no_import_cycles() -> None:
    found = cycles(import_graph())
    assert not found, "import cycles:\n" + "\n".join("  " + " <-> ".join(c) for c in found)


def test_the_kernel_library_stands_alone() -> None:
    # At runtime, in a fresh interpreter: what `import fa_bench.kernels` and the first use
    # of `flash_attention` (a lazy attribute) really load, with and without the interpreter.
    probe = (
        "import sys, fa_bench.kernels\n"
        "fa_bench.kernels.flash_attention\n"
        "print('\\n'.join(m for m in sys.modules if m.split('.')[:2] in "
        "(['fa_bench', 'run'], ['fa_bench', 'sweep'])))"
    )
    procs = []
    for interpret in ("1", None):  # the two interpreters side by side: each imports torch
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        if interpret:
            env["TRITON_INTERPRET"] = interpret
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", probe],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
                cwd=ROOT.parent,
            )
        )
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 0, stderr
        assert stdout.split() == [], f"fa_bench.kernels imports {stdout.split()}"
