"""Which forward kernel a `flash_attention` call runs: the Gluon kernel for sm_90
(kernels/flash_gluon.py, issue 21) or the `tl` kernel (kernels/flash_kernels.py).

`FlashConfig.forward` decides: "auto" (the default) takes the Gluon kernel where it can
run the inputs (`gluon_reason`) and measured faster than the `tl` kernel on the H200
(`gluon_preferred`); "gluon" forces it (a ValueError says why it cannot run); "tl" forces
the `tl` kernel. Issue 19's variants (windows, ALiBi, softcap, packed batches) take
the Gluon "ws" kernel by the same rule (on the longest sequence's key length;
kernels/flash_gluon_varhost.py), the `tl` kernel elsewhere.

The choice is a pure function of the inputs' shapes, dtypes, strides and device and of
the config, so the benchmark adapter names the kernel that will run before timing it
(`forward_label`); the config's `gluon_*` fields name the Gluon launch (the heuristic's
where unset: kernels/gluon_fields.py), and the backward (the same for both: it reads o
and lse2) is untouched.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from fa_bench.kernels import gluon_fields
from fa_bench.kernels.flash_config import FlashConfig

if TYPE_CHECKING:
    from fa_bench.kernels.flash_gluon import GluonConfig
    from fa_bench.kernels.flash_validate import Variant


def gluon_choice(q: Any, k: Any, v: Any, causal: bool, cfg: FlashConfig,
                 variant: Variant | None = None) -> GluonConfig | None:  # fmt: skip
    """The Gluon config this forward runs with, or None for the `tl` kernel."""
    if cfg.forward == "tl":
        return None
    from fa_bench.kernels import flash_gluon

    if variant is not None:  # issue 19's variants: the "ws" kernel (flash_gluon_varhost)
        from fa_bench.kernels import flash_gluon_varhost as vh

        reason = flash_gluon.gluon_reason(q, k, v, causal) or vh.variant_reason(variant)
        if cfg.forward == "gluon":
            if reason:
                raise ValueError(f"FlashConfig(forward='gluon') cannot run this call: {reason}")
        elif reason or not vh.variant_preferred(k, q.shape[-1], variant):
            return None
        pinned = gluon_fields.is_set(cfg.__dict__)  # a set gluon_* field: that launch
        return vh.variant_config(_resolved(cfg, q.shape[-1], causal), q.shape[-1], variant,
                                 q.dtype, causal, pinned)  # fmt: skip
    if cfg.forward == "gluon":
        reason = flash_gluon.gluon_reason(q, k, v, causal)
        if reason:
            raise ValueError(f"FlashConfig(forward='gluon') cannot run this call: {reason}")
    elif not flash_gluon.gluon_preferred(q, k, v, causal):
        return None
    return _resolved(cfg, q.shape[-1], causal)


@functools.lru_cache(maxsize=256)
def _resolved(cfg: FlashConfig, head_dim: int, causal: bool) -> GluonConfig:
    """The heuristic's launch with the config's gluon_* fields laid over it (ValueError
    naming a forced launch that does not fit shared memory or this head_dim, not cached).
    Cached: it runs inside every timed forward call, and building it costs ~10 µs of
    host time (a short forward is ~50 µs on the GPU); FlashConfig is frozen, so hashable."""
    return gluon_fields.resolve(cfg.__dict__, head_dim, causal)


def forward_label(gluon: GluonConfig | None, tl_label: str) -> str:
    """How a backend string names the forward that ran: "gluon-" and the Gluon config's
    label, or the `tl` kernel's tile label."""
    return tl_label if gluon is None else f"gluon-{gluon.label()}"
