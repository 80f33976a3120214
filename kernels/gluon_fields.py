"""One Gluon launch named by plain FlashConfig fields (issue 21, item 4).

The sweep, the tuning cache, sweep-plan.json and sweep.json carry configs as flat
FlashConfig fields, so a Gluon launch is named the same way, never by parsing a label:

    gluon_variant    "" (the heuristic's), "ws" or "pipelined"
    gluon_block_n    keys per step: 0 (the heuristic's) or 32, 64, 128, 256
    gluon_stages     K/V ring depth: 0 (the variant's rule: ws the deepest ring that
                     fits shared memory, pipelined 2) or 1..4
    gluon_warps      pipelined warps: 0 (8 up to head_dim 128, else 4) or 4, 8; "ws" has
                     4 per consumer warpgroup whatever this says
    gluon_pingpong   None (the heuristic's: on, off with 3 consumers) or a bool
    gluon_persistent None (off) or a bool; "ws" only
    gluon_consumers  0 (2) or 2, 3; 3 consumers run without ping-pong, 160 registers each
    gluon_q_buffers  0 (1) or 1, 2; 2 only for the persistent kernel

All unset (the FlashConfig default) means the heuristic, `flash_gluon.gluon_config(head_dim,
causal)`, exactly; `resolve` lays the set fields over it. `fields_of(g)` gives every field
of a GluonConfig, so a sweep point pins its launch entirely and `pinned(fields)` builds it
back without a head_dim (for its label). Values are checked here (`check`, called by
FlashConfig.__post_init__) and the combination by GluonConfig and the shared-memory rule
(`resolve`), each error naming the field or the config.

No torch, no triton: the report and the tuning cache import it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fa_bench.kernels.flash_gluon import GluonConfig

# Field -> its valid set values; 0 / "" / None is "the heuristic's" for each.
CHOICES: dict[str, tuple[Any, ...]] = {
    "gluon_variant": ("ws", "pipelined"),
    "gluon_block_n": (32, 64, 128, 256),
    "gluon_stages": (1, 2, 3, 4),
    "gluon_warps": (4, 8),
    "gluon_pingpong": (True, False),
    "gluon_persistent": (True, False),
    "gluon_consumers": (2, 3),
    "gluon_q_buffers": (1, 2),
}
GLUON_FIELDS = tuple(CHOICES)
UNSET: dict[str, Any] = {
    "gluon_variant": "",
    "gluon_block_n": 0,
    "gluon_stages": 0,
    "gluon_warps": 0,
    "gluon_pingpong": None,
    "gluon_persistent": None,
    "gluon_consumers": 0,
    "gluon_q_buffers": 0,
}
# Three "ws" consumers share the 64K registers four ways (candidate_configs' "ws-c3"):
# 160 each; two take the GluonConfig default.
_THREE_CONSUMER_REGS = 160


def check(values: Mapping[str, Any]) -> None:
    """ValueError naming the field, its value and the valid ones, for a bad value."""
    for name in GLUON_FIELDS:
        value = values[name]
        valid = CHOICES[name]
        is_bool_field = isinstance(valid[0], bool)
        if value == UNSET[name] and (value is None or type(value) is type(UNSET[name])):
            continue
        ok = (isinstance(value, bool) if is_bool_field else not isinstance(value, bool)) and (
            type(value) is type(valid[0]) and value in valid
        )
        if not ok:
            unset = repr(UNSET[name])
            raise ValueError(
                f"{name} must be {unset} (the heuristic's) or one of "
                f"{', '.join(repr(v) for v in valid)}, got {value!r}"
            )


def is_set(values: Mapping[str, Any]) -> bool:
    """Whether any Gluon field differs from "the heuristic's"."""
    # False != None: a bool field set to False counts as set
    return any(values.get(name, UNSET[name]) != UNSET[name] for name in GLUON_FIELDS)


def fields_of(g: GluonConfig) -> dict[str, Any]:
    """Every Gluon field of a GluonConfig: a launch pinned entirely (`resolve` and `pinned`
    give it back)."""
    return {
        "gluon_variant": g.variant,
        "gluon_block_n": g.block_n,
        "gluon_stages": g.stages,
        "gluon_warps": g.num_warps,
        "gluon_pingpong": g.pingpong,
        "gluon_persistent": g.persistent,
        "gluon_consumers": g.consumers,
        "gluon_q_buffers": g.q_buffers,
    }


def _overlay(base: GluonConfig, values: Mapping[str, Any], head_dim: int | None) -> GluonConfig:
    """`base` with the set fields laid over it; an unset ring depth follows the variant's
    rule (ws: the deepest that fits, which needs `head_dim`; pipelined: 2)."""
    from fa_bench.kernels import flash_gluon

    get = lambda name: values.get(name, UNSET[name])  # noqa: E731
    variant = get("gluon_variant") or base.variant
    consumers = get("gluon_consumers") or (base.consumers if variant == "ws" else 2)
    pingpong = get("gluon_pingpong")
    if pingpong is None:
        pingpong = base.pingpong if consumers == base.consumers else consumers == 2
    warps = get("gluon_warps") or (
        base.num_warps if variant == base.variant else _pipelined_warps(head_dim)
    )
    kw: dict[str, Any] = dict(
        variant=variant,
        block_n=get("gluon_block_n") or base.block_n,
        stages=get("gluon_stages") or 1,
        num_warps=4 if variant == "ws" else warps,
        block_m=64 if variant == "ws" else 16 * warps,
        pingpong=bool(pingpong),
        persistent=bool(get("gluon_persistent")),
        consumers=consumers,
        q_buffers=get("gluon_q_buffers") or 1,
        consumer_regs=_consumer_regs(consumers),
    )
    cfg = flash_gluon.GluonConfig(**kw)  # ValueError: the combination, named by GluonConfig
    if get("gluon_stages"):
        return cfg
    if variant == "pipelined":
        return dataclasses.replace(cfg, stages=2)
    if head_dim is None:
        raise ValueError("gluon_stages=0 (the deepest ring that fits) needs a head_dim")
    for stages in (4, 3, 2):  # as the heuristic: the deepest ring that fits
        deeper = dataclasses.replace(cfg, stages=stages)
        if deeper.smem_bytes(head_dim) <= flash_gluon.SMEM_BYTES:
            return deeper
    return cfg


def _consumer_regs(consumers: int) -> int:
    from fa_bench.kernels.flash_gluon import GluonConfig

    return _THREE_CONSUMER_REGS if consumers == 3 else GluonConfig.consumer_regs


def _pipelined_warps(head_dim: int | None) -> int:
    # candidate_configs' fallback: 8 warps x 128 rows up to head_dim 128, 4 x 64 above
    return 8 if head_dim is None or head_dim <= 128 else 4


def resolve(values: Mapping[str, Any], head_dim: int, causal: bool) -> GluonConfig:
    """The GluonConfig a FlashConfig's (or a field dict's) Gluon fields name at this
    head_dim: the heuristic's with the set fields laid over it. ValueError naming the
    config for a head_dim the kernel does not take, a combination GluonConfig refuses, or
    a launch whose Q tile and ring do not fit sm_90's shared memory."""
    from fa_bench.kernels import flash_gluon

    if head_dim not in flash_gluon.HEAD_DIMS:
        raise ValueError(f"head_dim={head_dim}: the Gluon kernel takes {flash_gluon.HEAD_DIMS}")
    base = flash_gluon.gluon_config(head_dim, causal)
    if not is_set(values):
        return base
    shown = {n: values[n] for n in GLUON_FIELDS if n in values and values[n] != UNSET[n]}
    try:
        cfg = _overlay(base, values, head_dim)
    except ValueError as exc:
        raise ValueError(f"Gluon fields {shown} at head_dim={head_dim}: {exc}") from None
    need = cfg.smem_bytes(head_dim)
    if need > flash_gluon.SMEM_BYTES:
        raise ValueError(
            f"Gluon fields {shown} at head_dim={head_dim} name {cfg.label()}, whose Q tile "
            f"and K/V ring need {need} bytes of shared memory, more than sm_90's "
            f"{flash_gluon.SMEM_BYTES}: fewer gluon_stages or a smaller gluon_block_n"
        )
    return cfg


def pinned(values: Mapping[str, Any]) -> GluonConfig:
    """The GluonConfig of fields that pin every launch parameter (a sweep point's,
    `fields_of`): no head_dim needed. ValueError if one is unset."""
    from fa_bench.kernels import flash_gluon

    unset = [n for n in GLUON_FIELDS if values.get(n, UNSET[n]) in (UNSET[n], None)]
    if unset:
        raise ValueError(f"a pinned Gluon launch sets every field; unset: {', '.join(unset)}")
    warps = values["gluon_warps"]
    consumers = values["gluon_consumers"]
    ws = values["gluon_variant"] == "ws"
    return flash_gluon.GluonConfig(
        variant=values["gluon_variant"],
        block_m=64 if ws else 16 * warps,
        block_n=values["gluon_block_n"],
        stages=values["gluon_stages"],
        num_warps=4 if ws else warps,
        pingpong=values["gluon_pingpong"],
        persistent=values["gluon_persistent"],
        consumers=consumers,
        q_buffers=values["gluon_q_buffers"],
        consumer_regs=_consumer_regs(consumers),
    )
