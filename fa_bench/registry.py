"""The one registry of attention implementations.

An implementation is registered with `@register(...)` on a *builder*: a function that
receives the case and its input tensors `(case, q, k, v)`, does all one-time work
(compilation, block masks, backend selection) and returns the attention function
`fn(q, k, v) -> o` that the engine times (or a `Prepared` holding it). Tensors use the
SDPA layout (batch, heads, seqlen, head_dim); K and V carry `heads_kv` heads.
Builders raise `Unsupported` for cases they cannot run.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from fa_bench.case import Case, DType, Mode
from fa_bench.errors import UsageError

AttnFn = Callable[..., object]


class Unsupported(Exception):
    """The implementation cannot run this case; the message says why."""


class PluginError(UsageError, ValueError):
    """A plugin module that cannot be imported."""


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
    modes: frozenset[Mode] = frozenset(Mode)
    dtypes: frozenset[DType] = frozenset(DType)
    devices: frozenset[str] = frozenset({"cuda", "cpu"})
    # False where the backward cannot be replayed with retain_graph=True (compiled
    # FlexAttention donates its buffers): backward time is then fwd_bwd minus fwd.
    backward_reruns: bool = True
    check: Callable[[Case, object], str | None] | None = None
    availability: Callable[[], str | None] | None = field(default=None, compare=False)

    def unsupported_reason(self, case: Case, device: object) -> str | None:
        """Why this case cannot run here, or None. `device` is a torch.device."""
        kind = getattr(device, "type", str(device))
        if kind not in self.devices:
            return f"{self.name} runs on {'/'.join(sorted(self.devices))}, not {kind}"
        if case.mode not in self.modes:
            return f"{self.name} has no {case.mode.value} mode"
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
        return built if isinstance(built, Prepared) else Prepared(fn=built)


_REGISTRY: dict[str, Impl] = {}


def register(
    name: str,
    *,
    description: str,
    modes: Iterable[Mode] = tuple(Mode),
    dtypes: Iterable[DType] = tuple(DType),
    devices: Iterable[str] = ("cuda", "cpu"),
    backward_reruns: bool = True,
    check: Callable[[Case, object], str | None] | None = None,
    availability: Callable[[], str | None] | None = None,
) -> Callable:
    """Decorator that registers a builder under `name` and returns it unchanged."""

    def decorate(builder: Callable) -> Callable:
        if name in _REGISTRY:
            raise ValueError(f"implementation {name!r} is registered twice")
        _REGISTRY[name] = Impl(
            name=name,
            builder=builder,
            description=description,
            modes=frozenset(Mode(m) for m in modes),
            dtypes=frozenset(DType(d) for d in dtypes),
            devices=frozenset(devices),
            backward_reruns=backward_reruns,
            check=check,
            availability=availability,
        )
        return builder

    return decorate


# The adapters of the built-in implementations; importing one registers it. They live
# with the kernels (kernels/ installs as fa_bench.kernels), which do not import them.
BUILTIN = ("fa_bench.kernels.reference", "fa_bench.kernels.triton_impl")


def load(plugins: Iterable[str] = ()) -> dict[str, Impl]:
    """Import the built-in implementations and any plugins; return the registry.

    A plugin is a module name (`mypkg.attn`) or the path of a .py file; importing it
    registers its implementations with `@register`.
    """
    for module in BUILTIN:
        importlib.import_module(module)
    for plugin in plugins:
        _import_plugin(plugin)
    return dict(_REGISTRY)


def _import_plugin(plugin: str) -> None:
    path = Path(plugin)
    if plugin.endswith(".py") or os.sep in plugin:
        if not path.is_file():
            raise PluginError(f"--plugin {plugin}: no such file")
        name = f"fa_bench_plugin_{path.stem}"
        if name in sys.modules:
            return
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:  # a .py path always has a source loader
            raise PluginError(f"--plugin {plugin}: cannot load it as a module")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return
    try:
        importlib.import_module(plugin)
    except ModuleNotFoundError as exc:
        raise PluginError(f"--plugin {plugin}: cannot import it ({exc})") from None


def get(name: str) -> Impl:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownImpl(name, _REGISTRY) from None


def names() -> list[str]:
    return list(_REGISTRY)
