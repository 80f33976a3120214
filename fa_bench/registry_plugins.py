"""Plugins' code: the `fa_bench.impls` entry points' records (`PackagePlugin`), finding a
`--plugin` file or module without running it, executing one, and saying in one line why
importing one failed.

The registry's state (what a plugin registered, what is undone when it fails) stays in
`fa_bench.registry`, which calls these and re-exports the public names.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.machinery
import importlib.util
import os
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

from fa_bench.registry_impl import PluginError, RegistrationError

ENTRY_POINT_GROUP = "fa_bench.impls"


@dataclass(frozen=True)
class PackagePlugin:
    """An entry point of the `fa_bench.impls` group: what it registered, or why it failed."""

    name: str  # the entry point's name
    value: str  # "module" or "module:callable"
    dist: str | None  # the distribution that declares it
    version: str | None
    impls: tuple[str, ...] = ()
    error: str | None = None  # None: loaded

    @property
    def label(self) -> str:
        return f"{self.dist} {self.version}" if self.dist else f"entry point {self.name}"

    def to_json(self) -> dict:
        return {"name": self.name, "value": self.value, "dist": self.dist,
                "version": self.version, "impls": self.impls, "error": self.error}  # fmt: skip


def is_file_plugin(plugin: str) -> bool:
    """A plugin given as a .py file (else it is a module name)."""
    return plugin.endswith(".py") or os.sep in plugin


def plugin_source(plugin: str, search: str | None = None) -> Path | None:
    """The resolved file a plugin's code comes from, found without running any of it (a
    module's parent packages are searched, not imported); None when there is none. A
    module is searched on sys.path, then in `search` (default: the current folder)."""
    if is_file_plugin(plugin):
        path = Path(plugin)
        return path.resolve() if path.is_file() else None
    loaded = sys.modules.get(plugin)
    if loaded is not None:
        origin = getattr(loaded, "__file__", None)
    else:
        # `load` appends the caller's folder to sys.path for module plugins: so here.
        dirs: list[str] | None = [*sys.path, search or os.getcwd()]
        spec = None
        parts = plugin.split(".")
        for i in range(len(parts)):
            spec = importlib.machinery.PathFinder.find_spec(".".join(parts[: i + 1]), dirs)
            if spec is None:
                return None
            dirs = list(spec.submodule_search_locations or [])
        origin = spec.origin if spec is not None else None
    return Path(origin).resolve() if origin and os.path.isfile(origin) else None


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def exec_plugin(plugin: str) -> None:
    if not is_file_plugin(plugin):
        importlib.import_module(plugin)
        return
    path = Path(plugin)
    if not path.is_file():
        raise PluginError(f"--plugin {plugin}: no such file")
    # Named after the resolved path, so two plugin files with one name are both imported.
    resolved = str(path.resolve())
    name = f"fa_bench_plugin_{path.stem}_{hashlib.sha1(resolved.encode()).hexdigest()[:8]}"
    if name in sys.modules:
        return
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:  # a .py path always has a source loader
        raise PluginError(f"--plugin {plugin}: cannot load it as a module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise


def import_failure(exc: BaseException, plugin: str, searched: str | None = None) -> str:
    """What went wrong, in one line: the error's type and message and where it was.
    `searched`: where a --plugin module name was looked for (None: an entry point's)."""
    kind = type(exc).__name__
    if isinstance(exc, SyntaxError):
        return f"{exc.filename}:{exc.lineno}: {kind}: {exc.msg}"
    if isinstance(exc, RegistrationError):
        return str(exc)
    if isinstance(exc, ModuleNotFoundError) and exc.name and plugin.startswith(exc.name):
        if plugin == exc.name or plugin.startswith(exc.name + "."):
            if searched is None:
                return f"no module named {exc.name!r} (the package declares it, but lacks it)"
            return f"no module named {exc.name!r} (not a .py file either; searched {searched})"
    frames = [f"{f.filename}:{f.lineno}" for f in traceback.extract_tb(exc.__traceback__)]
    source = plugin_source(plugin)
    # The plugin's own line first (the reader's to fix), then where it was raised.
    own = [f for f in frames if source is not None and f.startswith(f"{source}:")]
    shown = [*own[-1:], *[f for f in frames[-1:] if f not in own[-1:]]]
    where = f" (at {', raised in '.join(shown)})" if shown else ""
    missing = (
        " (a module it needs is not installed)" if isinstance(exc, ModuleNotFoundError) else ""
    )
    return f"importing it failed: {kind}: {exc}{where}{missing}"
