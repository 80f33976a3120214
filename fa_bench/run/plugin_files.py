"""The plugin files a run imports, recorded so that `--resume` runs the same code.

A new run records each plugin's resolved file and its SHA-256 in plan.json
(`run["plugin_files"]`, copied to results.json). `run --resume` prints the files it will
import before importing any of them, and refuses one whose hash changed since the run
began unless `--plugin` names that file again on the resume command. A plan.json from an
older fa-bench has no hashes: its plugins are listed and imported as before.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from fa_bench import registry
from fa_bench.errors import UsageError

KEY = "plugin_files"


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


def record(plugins: Sequence[str]) -> list[dict]:
    """Each plugin with its resolved file and that file's SHA-256 (None: no file)."""
    out = []
    for plugin in plugins:
        path = registry.plugin_source(plugin)
        sha = registry.file_sha256(path) if path is not None else None
        out.append({"plugin": plugin, "path": str(path) if path else None, "sha256": sha})
    return out


def check_resume(
    run: dict, plugins: Sequence[str], named: Sequence[str], say: Callable[[str], None]
) -> None:
    """Before a resume imports `plugins` (its plan's): say which files it will import and
    refuse a changed one that `named` (the resume's --plugin) does not name again. A file
    named again is used as it is now; its record takes the new hash (the old one is kept
    under "previous_sha256")."""
    recorded = {r.get("plugin"): r for r in run.get(KEY) or [] if isinstance(r, dict)}
    named_files = {registry.plugin_source(p) for p in named} - {None}
    sources = {p: registry.plugin_source(p) for p in plugins}
    for p in named:
        if p not in plugins and registry.plugin_source(p) not in sources.values():
            listed = ", ".join(plugins) or "none"
            raise PluginResumeError(
                f"--plugin {p}: not a plugin of the run being resumed (its plugins: {listed}); "
                "--resume imports the run's own plugins, --plugin only confirms a changed one"
            )
    if not plugins:
        return
    say("plugins to import for this resume:")
    changed = []
    for plugin in plugins:
        path, rec = sources[plugin], recorded.get(plugin)
        shown = str(path or plugin)
        if path is None:
            say(f"  {shown} (module without a file, or missing)")
        elif rec is None or not rec.get("sha256"):
            say(f"  {shown} (no hash recorded: a run from an older fa-bench)")
        elif (now := registry.file_sha256(path)) == rec["sha256"]:
            say(f"  {shown} (unchanged since the run began)")
        elif path in named_files or plugin in named:
            say(f"  {shown} (changed since the run began; named by --plugin: using it as it is)")
            rec.setdefault("previous_sha256", []).append(rec["sha256"])
            rec["sha256"] = now
        else:
            say(f"  {shown} (changed since the run began: not imported)")
            changed.append((plugin, path, rec["sha256"], now))
    if changed:
        plugin, path, old, now = changed[0]
        more = f" (and {len(changed) - 1} more)" if len(changed) > 1 else ""
        raise PluginResumeError(
            f"plugin file {path} changed since the run began{more} (sha256 {old[:12]}... "
            f"then, {now[:12]}... now); restore it, or name it again to use it as it is: "
            f"--plugin {plugin}"
        )
