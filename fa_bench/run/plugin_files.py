"""The plugin files a run imports, recorded so that `--resume` runs the same code.

A new run records each plugin's resolved file and its SHA-256 in plan.json
(`run["plugin_files"]`, copied to results.json). `run --resume` prints the files it will
import before importing any of them, and refuses one whose hash changed since the run
began unless `--plugin` names that file again on the resume command. A plan.json from an
older fa-bench has no hashes: its plugins are listed and imported as before.

Module plugins are found in the folder the run was started from (`RunOptions.plugin_dir`,
in plan.json too, so a resume started elsewhere finds them). The installed packages'
entry-point plugins are recorded as `run["plugin_packages"]` (name, distribution, version,
what they registered or why they failed), and a broken one is a warning, not an error.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path

from rich.console import Console
from rich.text import Text

from fa_bench import registry
from fa_bench.errors import UsageError
from fa_bench.results.files import PLAN

KEY = "plugin_files"
PACKAGES_KEY = "plugin_packages"


class PluginResumeError(UsageError, ValueError):
    """A resume that would import a changed plugin file, or a --plugin it cannot use."""


def absolute(plugins: Sequence[str]) -> tuple[str, ...]:
    """File plugins as absolute paths: the worker runs in the output folder, and a resume
    may start elsewhere; module names stay as given."""
    out = []
    for plugin in plugins:
        path = registry.plugin_source(plugin) if registry.is_file_plugin(plugin) else None
        out.append(str(path) if path is not None else plugin)
    return tuple(out)


def module_dir(plugins: Sequence[str]) -> str | None:
    """The folder module plugins are found in (the current one), or None without any."""
    return os.getcwd() if any(not registry.is_file_plugin(p) for p in plugins) else None


def packages() -> list[dict]:
    """The entry-point plugins `registry.load` found, for results.json's run section."""
    return [p.to_json() for p in registry.package_plugins()]


def warn_broken(console: Console) -> None:
    """One warning line per installed package plugin that could not be loaded: the run
    goes on without its implementations."""
    for p in registry.broken_packages():
        console.print(Text.assemble(("warning:", "yellow"), f" {p.error}; running without it"))


def record(plugins: Sequence[str], search: str | None = None) -> list[dict]:
    """Each plugin with its resolved file and that file's SHA-256 (None: no file)."""
    out = []
    for plugin in plugins:
        path = registry.plugin_source(plugin, search)
        sha = registry.file_sha256(path) if path is not None else None
        out.append({"plugin": plugin, "path": str(path) if path else None, "sha256": sha})
    return out


def check_resume(
    run: dict,
    plugins: Sequence[str],
    named: Sequence[str],
    say: Callable[[str], None],
    search: str | None = None,
) -> None:
    """Before a resume imports `plugins` (its plan's): say which files it will import and
    refuse a changed one that `named` (the resume's --plugin) does not name again. A file
    named again is used as it is now; its record takes the new hash (the old one is kept
    under "previous_sha256"). `search`: where the run found its module plugins."""
    sources = {p: registry.plugin_source(p, search) for p in plugins}
    for p in named:
        if p not in plugins and registry.plugin_source(p) not in sources.values():
            listed = ", ".join(plugins) or "none"
            raise PluginResumeError(
                f"--plugin {p}: not a plugin of the run being resumed (its plugins: {listed}); "
                "--resume imports the run's own plugins, --plugin only confirms a changed one"
            )
    if not plugins:
        return
    named_files = {registry.plugin_source(p) for p in named} - {None}
    say("plugins to import for this resume:")
    refused = []
    for plugin in plugins:
        path = sources[plugin]
        again = plugin in named or (path is not None and path in named_files)
        note, problem = _verdict(run, plugin, path, again, search)
        say(f"  {path or plugin} ({note})")
        if problem:
            refused.append(problem)
    if refused:
        more = f" (and {len(refused) - 1} more)" if len(refused) > 1 else ""
        raise PluginResumeError(refused[0] + more)


def _verdict(
    run: dict, plugin: str, path: Path | None, again: bool, search: str | None
) -> tuple[str, str | None]:
    """(what the list says of this plugin, why it is refused or None)."""
    records = run.get(KEY)
    rec = next((r for r in records or [] if isinstance(r, dict) and r.get("plugin") == plugin),
               None)  # fmt: skip
    if path is None:
        return "module without a file, or missing", None
    if records is None or (rec is not None and not rec.get("sha256")):
        return "no hash recorded: a run from an older fa-bench", None
    if rec is None:  # in the options but not recorded: plan.json was edited
        if again:
            records.append(record([plugin], search)[0])
            return "not recorded when the run began; named by --plugin: importing it", None
        return "not recorded when the run began: not imported", (
            f"plugin {plugin} is in {PLAN}'s options but not among the plugin files the run "
            f"recorded when it began; check the run folder, or name it to import it: "
            f"--plugin {plugin}"
        )
    now = registry.file_sha256(path)
    if now == rec["sha256"]:
        return "unchanged since the run began", None
    if again:
        rec.setdefault("previous_sha256", []).append(rec["sha256"])
        rec["sha256"] = now
        return "changed since the run began; named by --plugin: using it as it is", None
    return "changed since the run began: not imported", (
        f"plugin file {path} changed since the run began (sha256 {rec['sha256'][:12]}... "
        f"then, {now[:12]}... now); restore it, or name it again to use it as it is: "
        f"--plugin {plugin}"
    )
