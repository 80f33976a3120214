"""The one registry of attention implementations.

An implementation is registered with `@register(...)` on a *builder*: a function that
receives the case and its input tensors `(case, q, k, v)`, does all one-time work
(compilation, block masks, backend selection) and returns the attention function
`fn(q, k, v) -> o` that the engine times (or a `Prepared` holding it). Tensors use the
SDPA layout (batch, heads, seqlen, head_dim); K and V carry `heads_kv` heads.
Builders raise `Unsupported` for cases they cannot run.

Implementations come from the built-in adapters (`BUILTIN`), from installed packages that
declare an entry point in the `fa_bench.impls` group, and from `--plugin` files or modules
(docs/plugins.md).
"""

from __future__ import annotations

import importlib
import os
import sys
import types
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

from fa_bench.case import DEFAULT_DTYPES, PREFILL_MODES, Case, DType, Mode

# What an implementation is, and the plugins' code, live in their own modules; their names
# are re-exported here because adapters, plugins and tests import them from this module.
from fa_bench.registry_impl import (
    AttnFn,
    BuilderError,
    Impl,
    PluginError,
    Prepared,
    RegistrationError,
    UnknownImpl,
    Unsupported,
    describe,
)
from fa_bench.registry_plugins import (
    ENTRY_POINT_GROUP,
    PackagePlugin,
    exec_plugin,
    file_sha256,
    import_failure,
    is_file_plugin,
    plugin_source,
)

__all__ = [
    "BUILTIN",
    "ENTRY_POINT_GROUP",
    "AttnFn",
    "BuilderError",
    "Impl",
    "PackagePlugin",
    "PluginError",
    "Prepared",
    "RegistrationError",
    "UnknownImpl",
    "Unsupported",
    "broken_packages",
    "file_sha256",
    "get",
    "is_file_plugin",
    "load",
    "names",
    "package_plugins",
    "plugin_source",
    "register",
]

_REGISTRY: dict[str, Impl] = {}
_SOURCE: str | None = None  # while `load` imports something: the source its impls get


def register(
    name: str,
    *,
    description: str,
    modes: Iterable[Mode] = PREFILL_MODES,
    dtypes: Iterable[DType] = DEFAULT_DTYPES,
    devices: Iterable[str] = ("cuda", "cpu"),
    backward_reruns: bool = True,
    check: Callable[[Case, object], str | None] | None = None,
    availability: Callable[[], str | None] | None = None,
) -> Callable:
    """Decorator that registers a builder under `name` and returns it unchanged."""

    def decorate(builder: Callable) -> Callable:
        origin = _origin(builder)
        if name in _REGISTRY:
            raise RegistrationError(
                f"implementation {name!r} is registered twice: by {origin} and before "
                f"that by {_REGISTRY[name].origin or 'an unknown file'}"
            )
        _REGISTRY[name] = Impl(
            name=name,
            builder=builder,
            description=description,
            modes=_members(Mode, modes, "modes", name, origin),
            dtypes=_members(DType, dtypes, "dtypes", name, origin),
            devices=frozenset(devices),
            backward_reruns=backward_reruns,
            check=check,
            availability=availability,
            origin=origin,
            source=_SOURCE,
        )
        return builder

    return decorate


def _origin(builder: Callable) -> str:
    """The file (and line) that defines `builder`: where a message sends the reader."""
    code = getattr(builder, "__code__", None)
    if code is not None:
        return f"{code.co_filename}:{code.co_firstlineno}"
    module = sys.modules.get(getattr(builder, "__module__", "") or "")
    return str(getattr(module, "__file__", None) or getattr(builder, "__module__", "?"))


def _members(enum: type[Mode] | type[DType], values: Iterable, key: str, name: str,
             origin: str) -> frozenset:  # fmt: skip
    out = set()
    for v in values:
        try:
            out.add(enum(v))
        except ValueError:
            valid = ", ".join(m.value for m in enum)
            raise RegistrationError(
                f"implementation {name!r} ({origin}): {key}: {v!r} is not one of {valid}"
            ) from None
    return frozenset(out)


# The adapters of the built-in implementations; importing one registers it. They live
# with the kernels (kernels/ installs as fa_bench.kernels), which do not import them.
BUILTIN = (
    "fa_bench.kernels.reference",
    "fa_bench.kernels.triton_impl",
    # Other projects' kernels, when their (optional) packages are installed.
    "fa_bench.kernels.fa4_impl",
    "fa_bench.kernels.flash_attn_impl",
    "fa_bench.kernels.xformers_impl",
)

_PACKAGES: list[PackagePlugin] | None = None  # loaded once per process


def load(plugins: Iterable[str] = (), *, search: str | None = None) -> dict[str, Impl]:
    """Import the built-in implementations, the installed packages' entry points and any
    plugins; return the registry.

    A plugin is a module name (`mypkg.attn`) or the path of a .py file; importing it
    registers its implementations with `@register`. Module names are also looked up in
    `search` (default: the current folder), appended to sys.path so that nothing there
    can shadow fa_bench or an installed package. A broken entry point does not raise: it
    is in `package_plugins()` with its error; a broken plugin raises `PluginError`.
    """
    global _PACKAGES
    with _registering("built-in"):
        for module in BUILTIN:
            importlib.import_module(module)
    if _PACKAGES is None:
        _PACKAGES = [_load_entry_point(ep) for ep in _entry_points()]
    if any(not is_file_plugin(p) for p in plugins):
        folder = search or os.getcwd()
        if folder not in sys.path:
            sys.path.append(folder)
    for plugin in plugins:
        _import_plugin(plugin, search)
    return dict(_REGISTRY)


def package_plugins() -> list[PackagePlugin]:
    """The `fa_bench.impls` entry points `load` found (empty before the first `load`)."""
    return list(_PACKAGES or ())


def broken_packages() -> list[PackagePlugin]:
    return [p for p in package_plugins() if p.error is not None]


@contextmanager
def _registering(source: str) -> Iterator[None]:
    global _SOURCE
    outer, _SOURCE = _SOURCE, source
    try:
        yield
    finally:
        _SOURCE = outer


def _entry_points() -> list:
    from importlib.metadata import entry_points

    return sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda ep: (ep.name, ep.value))


def _load_entry_point(ep: object) -> PackagePlugin:
    """Import what an entry point names; a callable it names is called with no arguments.
    Whatever goes wrong is recorded, never raised: one broken package must not stop the
    others or the run."""
    dist = getattr(ep, "dist", None)
    name = getattr(ep, "name", "?")
    value = str(getattr(ep, "value", "?"))
    found = PackagePlugin(name=name, value=value, dist=getattr(dist, "name", None),
                          version=getattr(dist, "version", None))  # fmt: skip
    before = set(_REGISTRY)
    try:
        with _registering(found.label):
            target = ep.load()  # type: ignore[attr-defined]
            if not isinstance(target, types.ModuleType):
                if not callable(target):
                    raise RegistrationError(
                        f"it names {describe(target)}, not a module or a callable"
                    )
                target()
    except (Exception, SystemExit) as exc:
        for n in set(_REGISTRY) - before:  # nothing half-registered stays
            del _REGISTRY[n]
        why = import_failure(exc, value.partition(":")[0].strip())
        error = f"package plugin {name!r} ({found.label}, {value}): {why}"
        return PackagePlugin(**{**found.to_json(), "impls": (), "error": error})
    impls = tuple(n for n in _REGISTRY if n not in before)
    return PackagePlugin(**{**found.to_json(), "impls": impls})


def _import_plugin(plugin: str, search: str | None) -> None:
    before = set(_REGISTRY)
    try:
        with _registering(f"--plugin {plugin}"):
            exec_plugin(plugin)
    except (Exception, SystemExit) as exc:
        # A half-imported plugin leaves nothing registered, so a retry is not a duplicate.
        for name in set(_REGISTRY) - before:
            del _REGISTRY[name]
        if isinstance(exc, PluginError):
            raise
        where = f"sys.path and {search or os.getcwd()}"
        raise PluginError(f"--plugin {plugin}: {import_failure(exc, plugin, where)}") from None


def get(name: str) -> Impl:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownImpl(name, _REGISTRY) from None


def names() -> list[str]:
    return list(_REGISTRY)
