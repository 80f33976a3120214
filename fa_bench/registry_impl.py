"""What the registry holds: an implementation (`Impl`), what its builder returns
(`Prepared`), and the errors of registering, importing, building and looking one up.

Split from `fa_bench.registry`, which re-exports every name here: adapters and plugins
import them from there (`from fa_bench.registry import register, Prepared, Unsupported`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

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
                f"{what}{describe(fn)}, not a function fn(q, k, v) -> o or a registry.Prepared"
            )
        return built if isinstance(built, Prepared) else Prepared(fn=built)


def _at(origin: str | None) -> str:
    return f" ({origin})" if origin else ""


def describe(value: object) -> str:
    """What a builder or an entry point gave instead of a function, for a message."""
    if value is None:
        return "None"
    shape = getattr(value, "shape", None)
    kind = type(value).__name__
    return f"a {kind} of shape {tuple(shape)}" if shape is not None else f"a {kind}"
