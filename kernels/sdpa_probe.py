"""What SDPA says about a case, shared by the dense, decode and variant SDPA builders.

SDPA tells whether a backend can take a case only by failing, with its reasons as
warnings; and which backend the default dispatch picked only through a private call.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable

import torch

from fa_bench.registry import Unsupported

_NO_KERNEL = ("No available kernel", "No viable backend")
_TRIGGERED = re.compile(r"\s*\(Triggered internally at [^)]*\)")


def _reasons(caught: list[warnings.WarningMessage]) -> list[str]:
    """SDPA's warnings minus the headers ("... not used because:") and source locations."""
    reasons = []
    for w in caught:
        text = _TRIGGERED.sub("", str(w.message)).strip()
        if text and not text.endswith("because:") and text not in reasons:
            reasons.append(text)
    return reasons


def no_kernel(err: RuntimeError, caught: list[warnings.WarningMessage]) -> Unsupported | None:
    """SDPA's "no kernel for these inputs" as Unsupported with its reasons; None for any
    other error (a real one, to be raised)."""
    if not any(text in str(err) for text in _NO_KERNEL):
        return None
    detail = "; ".join(_reasons(caught)) or str(err)
    return Unsupported(f"SDPA has no kernel for this case: {detail}")


def first_call(
    fn: Callable[..., object], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> None:
    """Run `fn` once, outside the timed span: a backend that cannot take the case raises
    Unsupported with SDPA's reasons; any other error is raised as it is. Grad mode stays
    as the caller set it, because some backend constraints apply only to inputs that
    require grad."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            fn(q, k, v)
        except RuntimeError as err:
            unsupported = no_kernel(err, caught)
            if unsupported is None:
                raise
            raise unsupported from err


def masked_backend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, gqa: bool
) -> str:
    """The backend SDPA's dispatch picks for an explicit `attn_mask` under the currently
    enabled flags; "unknown" where torch hides it."""
    try:
        choice = torch._fused_sdp_choice(q, k, v, mask, 0.0, False, scale=None, enable_gqa=gqa)
        return torch.nn.attention.SDPBackend(choice).name
    except (AttributeError, TypeError, ValueError, RuntimeError):
        return "unknown"
