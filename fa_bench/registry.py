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

import hashlib
import importlib
import importlib.machinery
import importlib.util
import os
import sys
import traceback
import types
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from fa_bench.case import DEFAULT_DTYPES, PREFILL_MODES, Case, DType, Mode
from fa_bench.errors import UsageError

AttnFn = Callable[..., object]


class Unsupported(Exception):
    """The implementation cannot run this case; the message says why."""


class PluginError(UsageError, ValueError):
    """A plugin module that cannot be imported."""


class RegistrationError(ValueError):
    """A `register(...)` call that cannot be accepted; the message names its file."""


class BuilderError(TypeError):
    """A builder returned something other than `fn(q, k, v)` or a `Prepared`."""


class UnknownImpl(UsageError, ValueError):
    def __init__(self, name: str, valid: Iterable[str]) -> None:
        self.name = name
        super().__init__(f"unknown implementation {name!r}; valid: {', '.join(sorted(valid))}")


@dataclass
class Prepared:
    """What a builder returns: the function to time plus what actually runs underneath."""

    fn: AttnFn
    backend: str | None = None  # e.g. the SDPA backend the default dispatch picked


@dataclass(frozen=True)
class Impl:
    name: str
    builder: Callable[..., Prepared | AttnFn]
    description: str
    modes: frozenset[Mode] = frozenset(PREFILL_MODES)  # decode is opt-in: it needs a cache
    dtypes: frozenset[DType] = frozenset(DEFAULT_DTYPES)  # fp8 is opt-in: scaled inputs
    devices: frozenset[str] = frozenset({"cuda", "cpu"})
    # False where the backward cannot be replayed with retain_graph=True (compiled
    # FlexAttention donates its buffers): backward time is then fwd_bwd minus fwd.
    backward_reruns: bool = True
    check: Callable[[Case, object], str | None] | None = None
    availability: Callable[[], str | None] | None = field(default=None, compare=False)
    origin: str | None = field(default=None, compare=False)  # the file that registered it
    # Where it comes from, for `list impls`: "built-in", "--plugin X", or the package
    # ("name version") whose entry point registered it; None outside `load`.
    source: str | None = field(default=None, compare=False)

    def unsupported_reason(self, case: Case, device: object) -> str | None:
        """Why this case cannot run here, or None. `device` is a torch.device."""
        kind = getattr(device, "type", str(device))
        if kind not in self.devices:
            return f"{self.name} runs on {'/'.join(sorted(self.devices))}, not {kind}"
        if case.mode not in self.modes:
            return f"{self.name} has no {case.mode.value} mode"
        if case.dtype is DType.FP8_E4M3 and case.dtype not in self.dtypes:
            return f"no fp8_e4m3 forward in {self.name}"
        if case.dtype not in self.dtypes:
            valid = ", ".join(d.value for d in DType if d in self.dtypes)
            return f"{self.name} does not support {case.dtype.value} (supports {valid})"
        return self.check(case, device) if self.check else None

    def unavailable_reason(self) -> str | None:
        """Why the implementation cannot run on this machine at all, or None."""
        return self.availability() if self.availability else None

    def prepare(
        self, case: Case, q: object, k: object, v: object, options: dict | None = None
    ) -> Prepared:
        """`options` (e.g. a kernel config from `fa-bench sweep`) reaches builders that
        take an `options` keyword; without it every builder is called as before."""
        extra = {} if options is None else {"options": options}
        built = self.builder(case, q, k, v, **extra)
        fn = built.fn if isinstance(built, Prepared) else built
        # Checked here, not at the first call, where None or a tensor fails far from the
        # builder (in the accuracy check or timing) with a message that names neither.
        if not callable(fn):
            what = "a Prepared whose fn is " if isinstance(built, Prepared) else ""
            raise BuilderError(
                f"implementation {self.name!r}: its builder{_at(self.origin)} returned "
                f"{what}{_describe(fn)}, not a function fn(q, k, v) -> o or a registry.Prepared"
            )
        return built if isinstance(built, Prepared) else Prepared(fn=built)


def _at(origin: str | None) -> str:
    return f" ({origin})" if origin else ""


def _describe(value: object) -> str:
    if value is None:
        return "None"
    shape = getattr(value, "shape", None)
    kind = type(value).__name__
    return f"a {kind} of shape {tuple(shape)}" if shape is not None else f"a {kind}"


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
                        f"it names {_describe(target)}, not a module or a callable"
                    )
                target()
    except (Exception, SystemExit) as exc:
        for n in set(_REGISTRY) - before:  # nothing half-registered stays
            del _REGISTRY[n]
        why = _import_failure(exc, value.partition(":")[0].strip())
        error = f"package plugin {name!r} ({found.label}, {value}): {why}"
        return PackagePlugin(**{**found.to_json(), "impls": (), "error": error})
    impls = tuple(n for n in _REGISTRY if n not in before)
    return PackagePlugin(**{**found.to_json(), "impls": impls})


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


def _import_plugin(plugin: str, search: str | None) -> None:
    before = set(_REGISTRY)
    try:
        with _registering(f"--plugin {plugin}"):
            _exec_plugin(plugin)
    except (Exception, SystemExit) as exc:
        # A half-imported plugin leaves nothing registered, so a retry is not a duplicate.
        for name in set(_REGISTRY) - before:
            del _REGISTRY[name]
        if isinstance(exc, PluginError):
            raise
        where = f"sys.path and {search or os.getcwd()}"
        raise PluginError(f"--plugin {plugin}: {_import_failure(exc, plugin, where)}") from None


def _exec_plugin(plugin: str) -> None:
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


def _import_failure(exc: BaseException, plugin: str, searched: str | None = None) -> str:
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


def get(name: str) -> Impl:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownImpl(name, _REGISTRY) from None


def names() -> list[str]:
    return list(_REGISTRY)
