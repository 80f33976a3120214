"""What the adapters of other projects' kernels share (`fa4`, `flash-attn`, `xformers`).

Each peer is an optional package. Whether it can run here is answered without importing
it where possible (its distribution's metadata, the module's file on sys.path), because
`fa-bench list impls` and `fa-bench env` ask about every implementation and must never
fail or print a traceback: a missing package, a failing import or a GPU too old is a
reason in words, naming what installs it.

The peers take (batch, seqlen, heads, head_dim) tensors; ours are (batch, heads, seqlen,
head_dim). `bshd` is a transposed *view* (no copy, nothing in the timed span): these
kernels need only the last dimension contiguous and the other strides aligned, which a
transposed contiguous tensor satisfies, and they allocate their gradients `empty_like`
the input they got, so gradients come back in the runner's layout without a copy either.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.machinery
import importlib.metadata
import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch

from fa_bench.registry import Unsupported


@dataclass(frozen=True)
class Peer:
    """One optional package: how pip names it, what imports it, what installs it."""

    what: str  # a person's name for it, e.g. "FlashAttention-4"
    dist: str  # the pip distribution, e.g. "flash-attn-4"
    module: str  # the module holding the function we call, e.g. "flash_attn.cute"
    attr: str  # the function, e.g. "flash_attn_func"
    extra: str  # fa-bench's optional extra that installs it
    min_capability: tuple[int, int]  # the oldest GPU its kernels run on

    @property
    def install_hint(self) -> str:
        return f'pip install "fa-bench[{self.extra}]"'


def dist_version(dist: str) -> str | None:
    """The installed version of a pip distribution, or None."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def module_found(name: str) -> bool:
    """Whether `name` can be imported, found without running any of it or its parents.

    The flash-attn (FA2) and flash-attn-4 packages share the import name `flash_attn`
    (FA4 installs only `flash_attn/cute`), so each peer asks for its own submodule."""
    if name in sys.modules:
        return sys.modules[name] is not None
    search: list[str] | None = None
    parts = name.split(".")
    for i in range(len(parts)):
        spec = importlib.machinery.PathFinder.find_spec(".".join(parts[: i + 1]), search)
        if spec is None:
            return False
        search = list(spec.submodule_search_locations or [])
    return True


def gpu_reason(peer: Peer, device: torch.device | None = None) -> str | None:
    """Why this machine's GPU (or `device`) cannot run the peer's kernels, or None."""
    if not torch.cuda.is_available():
        needs = _cc(peer.min_capability)
        return f"no CUDA GPU (it needs compute capability >= {needs})"
    capability = tuple(torch.cuda.get_device_capability(device))
    if capability < peer.min_capability:
        return (
            f"{peer.what} needs compute capability >= {_cc(peer.min_capability)} "
            f"(this GPU is {_cc(capability)})"
        )
    return None


def _cc(capability: tuple[int, ...]) -> str:
    return ".".join(str(part) for part in capability)


def missing_reason(peer: Peer) -> str | None:
    """Why the package is not there: not installed (and what installs it), or None."""
    if dist_version(peer.dist) is None and not module_found(peer.module):
        return f"{peer.dist} is not installed ({peer.install_hint})"
    return None


def load(peer: Peer) -> Callable:
    """The peer's function, imported now; a failure is `Unsupported` with the reason."""
    reason = missing_reason(peer)
    if reason is not None:
        raise Unsupported(reason)
    try:
        # Anything the import prints goes to stderr: `list impls --json` and `env --json`
        # ask for availability, and their stdout is one JSON document.
        with contextlib.redirect_stdout(sys.stderr):
            module = importlib.import_module(peer.module)
        return getattr(module, peer.attr)
    except Exception as exc:  # anything an import can raise (ImportError, OSError, ...)
        raise Unsupported(f"{peer.module} is installed but {_failure(exc)}") from exc


def _failure(exc: BaseException) -> str:
    if isinstance(exc, AttributeError):
        return f"has no {exc.name!r}: {exc}" if getattr(exc, "name", None) else str(exc)
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"failed to import: {type(exc).__name__}: {first}"


def availability(peer: Peer) -> str | None:
    """Why the peer cannot run on this machine at all, or None: never raises.

    The cheap reasons (not installed, no or too old a GPU) come first and together; the
    import, which can take seconds, only where they all pass."""
    reasons = [r for r in (missing_reason(peer), gpu_reason(peer)) if r]
    if reasons:
        return "; ".join(reasons)
    try:
        load(peer)
    except Unsupported as exc:
        return str(exc)
    return None


def device_reason(peer: Peer, q: torch.Tensor) -> str | None:
    """Why the peer cannot run on the device `q` is on (a GPU too old), or None."""
    return gpu_reason(peer, q.device) if q.device.type == "cuda" else None


def bshd(t: torch.Tensor) -> torch.Tensor:
    """(batch, heads, seqlen, head_dim) as (batch, seqlen, heads, head_dim): a view."""
    return t.transpose(1, 2)


def warm_up(fn: Callable[..., torch.Tensor], q: torch.Tensor, k: torch.Tensor,
            v: torch.Tensor, backward: bool,
            refusals: tuple[type[BaseException], ...] = (AssertionError,)) -> None:  # fmt: skip
    """One call (and backward) now: JIT compilation happens here, outside the timed span,
    and a case the kernel refuses (FA4 checks its inputs with `assert`, xFormers raises
    NotImplementedError when none of its kernels takes the inputs: `refusals`) becomes
    `Unsupported` with the kernel's own words, not an error per case."""
    args = [t.detach().requires_grad_(backward) for t in (q, k, v)]
    try:
        out = fn(*args)
        if backward:
            out.backward(torch.ones_like(out))
    except refusals as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise Unsupported(f"the kernel refused this case: {first}") from exc
    if q.device.type == "cuda":
        torch.cuda.synchronize(q.device)
