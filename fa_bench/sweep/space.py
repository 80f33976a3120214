"""The block-size sweep's config space: expansion, the validity (pruning) rule, rules of thumb.

A sweep point is a case plus the FlashConfig fields its mode decides:
- mode `fwd`: block_m (query rows per program), block_n (keys per step), num_warps,
  num_stages of the forward kernel;
- mode `bwd`: bwd_block_m (rows streamed per step), bwd_block_n (rows each program
  holds: keys in the one-pass kernel and in dK/dV, queries in the deterministic dQ
  kernel), bwd_num_warps, bwd_num_stages. The sweep times `triton` with the two-kernel
  backward (dK/dV, then dQ: a swept config always takes it, kernels/triton_impl.py; the
  default's Gluon backward on sm_90 has launches of its own); `triton-deterministic` and
  `triton-onepass` read the same fields (and tuning cache).
The other fields stay at the heuristic's values. The heuristic's own config is always in
the space (marked `is_default`) so the sweep measures how much the best beats it, and so
is each rule of thumb's square tile (`rules_of_thumb`, marked in `rules`) with the
heuristic's warps and stages when the product lacks it, so every rule gets a rank.

Validity rule (`prune_reason`), applied before anything is compiled; a pruned config is
a recorded row with its reason, never silently dropped:
1. FlashConfig's own checks (powers of two in [16, 256], warps in 1..16, stages 1..8).
2. Shared memory: the pipelined tiles must fit the device's per-block limit (read from
   the device: `shared_memory_per_block_optin`, 227 KB on the H200). The estimate counts
   only the buffers that grow with num_stages: forward `stages × (K + V tile)` =
   stages · 2 · block_n · D_pad · itemsize; backward `stages × 2 streamed tiles` =
   stages · 2 · bwd_block_m · D_pad · itemsize (Q and dO: the same streamed pair in the
   one-pass kernel and in the deterministic ones). It is a lower bound (the held K/V,
   the accumulators and layout conversions come on top; the one-pass kernel's TMA
   reduce-add, `use_tma`, not a swept field, stages its bwd_block_m × D_pad fp32 dQ
   share too), so a pruned config cannot fit; one that passes and still exceeds the
   limit fails at compile time and is recorded as `error`. Compiled for sm_90 by triton
   3.6.0 on a CPU (2026-11-30), the one-pass kernel at bf16, head_dim 128, 128 held keys,
   64 streamed rows, 8 warps, 3 stages asked 97 KB (the estimate: 96 KB).
   Checked against the H200: 128×128 tiles at head_dim 128 with 4 stages need 256 KB by
   this estimate (Triton reported 296 KB: OutOfResources), 3 stages 192 KB (ran).
   Without a device (CPU interpreter) there is no limit to check and the rule is skipped.
3. Tiles larger than the sequence: a block bigger than the sequence rounded up to a
   power of two (at least 16) covers the same single tile with only more masked rows, so
   it is redundant.
Our kernel pads head_dim to a power of two and masks, so there is no "block_n <= head_dim"
requirement; nothing is pruned for it.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, ClassVar

from fa_bench.case import Case, Mode
from fa_bench.sweep.vocab import (
    MODE_FIELDS,
    SWEEP_MODES,
    fields_mode,
    label,
    mode_fields,
    short_fields,
)

if TYPE_CHECKING:
    from fa_bench.kernels.flash_config import FlashConfig

H200_SMEM_BYTES = 232448  # 227 KB: shared_memory_per_block_optin on the H200
# The rules of thumb by name, in the order the report and docs list them (`rules_of_thumb`).
RULES = ("sqrt(M/3d)", "256@d64,192@d128", "by seqlen")


@dataclass(frozen=True)
class SweepSpace:
    """The product swept for every case (the same axis lists for fwd and bwd)."""

    block_m: tuple[int, ...] = (32, 64, 128, 256)
    block_n: tuple[int, ...] = (32, 64, 128, 256)
    warps: tuple[int, ...] = (4, 8)
    stages: tuple[int, ...] = (2, 3, 4, 5)

    # The axes in product order; each is also a `fa-bench sweep` flag (--block-m, ...).
    AXES: ClassVar[tuple[str, ...]] = ("block_m", "block_n", "warps", "stages")

    def __post_init__(self) -> None:
        for name in self.AXES:
            values = getattr(self, name)
            if not values:
                raise ValueError(f"--{name.replace('_', '-')} needs at least one value")
            bad = [v for v in values if isinstance(v, bool) or not isinstance(v, int) or v < 1]
            if bad:
                raise ValueError(f"--{name.replace('_', '-')}: positive integers only, got {bad}")

    @property
    def size(self) -> int:
        return math.prod(len(getattr(self, axis)) for axis in self.AXES)

    def to_dict(self) -> dict[str, list[int]]:
        return {axis: list(getattr(self, axis)) for axis in self.AXES}

    def axis_text(self, axis: str) -> str:
        """An axis as its flag takes it, e.g. "32,64,128,256" for block_m."""
        return ",".join(str(v) for v in getattr(self, axis))


def _heuristic_config(case: Case, capability: tuple[int, int] | None) -> FlashConfig:
    """The default heuristic's FlashConfig for a case on a GPU of `capability` (None: the
    CPU interpreter), as the `triton` adapter picks it minus the tuning cache; planning
    takes the capability, not a device, so a sweep is planned without one."""
    from fa_bench.kernels.flash_config import default_config, pad_pow2

    return default_config(pad_pow2(case.head_dim), case.dtype.torch(), case.causal, capability,
                          case.max_seqlen)  # fmt: skip


def expand(space: SweepSpace, mode: str) -> list[dict]:
    """Every config of the product, as FlashConfig field dicts for `mode`."""
    if mode not in SWEEP_MODES:
        raise ValueError(f"sweep mode must be one of {', '.join(SWEEP_MODES)}, got {mode!r}")
    names = MODE_FIELDS[mode]
    product = itertools.product(*(getattr(space, axis) for axis in space.AXES))
    return [dict(zip(names, values, strict=True)) for values in product]


def smem_estimate_bytes(case: Case, fields: dict) -> int:
    """Lower bound of the shared memory the pipelined tiles need (see the module doc)."""
    from fa_bench.kernels.flash_config import pad_pow2

    pad = pad_pow2(case.head_dim)
    s = short_fields(fields)
    rows = s["block_n"] if fields_mode(fields) == "fwd" else s["block_m"]
    return s["num_stages"] * 2 * rows * pad * case.dtype.itemsize


def prune_reason(case: Case, fields: dict, smem_limit_bytes: int | None) -> str | None:
    """Why a config is not worth compiling for this case, or None (see the module doc)."""
    from fa_bench.kernels.flash_config import FlashConfig, pad_pow2

    try:
        FlashConfig(**fields)
    except (TypeError, ValueError) as exc:
        return f"invalid config: {exc}"
    if smem_limit_bytes is not None:
        need = smem_estimate_bytes(case, fields)
        if need > smem_limit_bytes:
            return (
                f"shared memory: pipelined tiles need >= {need // 1024} KB, "
                f"the device allows {smem_limit_bytes // 1024} KB per block"
            )
    s = short_fields(fields)
    seq_q, seq_k = pad_pow2(case.seqlen_q), pad_pow2(case.seqlen_k)
    # fwd: block_m tiles queries, block_n keys; bwd: the held tile is swept over both.
    limits = (
        {"block_m": seq_q, "block_n": seq_k}
        if fields_mode(fields) == "fwd"
        else {"block_m": min(seq_q, seq_k), "block_n": max(seq_q, seq_k)}
    )
    for key, limit in limits.items():
        if s[key] > limit:
            return f"redundant: {key} {s[key]} exceeds the padded sequence length {limit}"
    return None


@dataclass(frozen=True)
class Point:
    """One sweep point: the case, the config fields, and why it is skipped (if it is)."""

    case: Case
    fields: dict
    is_default: bool
    pruned: str | None = None
    rules: tuple[str, ...] = ()  # the rules of thumb whose tile this point measures

    @property
    def label(self) -> str:
        return label(self.fields)

    @property
    def id(self) -> str:
        """The case id and the config's label: "<case id>#bm64-bn64-w4-s3"."""
        return f"{self.case.id}#{self.label}"


def sweep_points(
    cases: Sequence[Case],
    space: SweepSpace,
    *,
    capability: tuple[int, int] | None,
    smem_limit_bytes: int | None,
    with_rules: bool = True,
) -> list[Point]:
    """Every (case, config) of the sweep, the heuristic's config first for each case, then
    the product, then (`with_rules`) the rules of thumb's tiles the product lacks."""
    points: list[Point] = []
    for case in cases:
        mode = case.mode.value
        default = mode_fields(_heuristic_config(case, capability), mode)
        configs = [default] + [f for f in expand(space, mode) if f != default]
        names = MODE_FIELDS[mode]
        rules = _rule_tiles(case, default, smem_limit_bytes) if with_rules else {}
        have = {tuple(f[n] for n in names) for f in configs}
        configs += [dict(zip(names, k, strict=True)) for k in rules if k not in have]
        for fields in configs:
            is_default = fields == default
            # The heuristic's config is what `run` uses today: always measured, the baseline.
            pruned = None if is_default else prune_reason(case, fields, smem_limit_bytes)
            tile_rules = rules.get(tuple(fields[n] for n in names), ())
            points.append(Point(case, fields, is_default, pruned, tile_rules))
    return points


def _rule_tiles(
    case: Case, default: dict, smem_limit_bytes: int | None
) -> dict[tuple[int, ...], tuple[str, ...]]:
    """Each rule's square tile with the heuristic's warps and stages (the rules say nothing
    about those), as field values in `MODE_FIELDS` order, mapped to the rules that pick it."""
    names = MODE_FIELDS[case.mode.value]
    warps, stages = default[names[2]], default[names[3]]
    picks = case_rules(case, smem_limit_bytes)
    out: dict[tuple[int, ...], tuple[str, ...]] = {}
    for rule, block in picks.items():
        if block is not None:
            key = (block, block, warps, stages)
            out[key] = (*out.get(key, ()), rule)
    return out


def sweep_case(case: Case) -> Case:
    """Cases of `fa-bench sweep` run our kernel; fwd_bwd is not a sweep mode."""
    if case.mode is Mode.FWD_BWD:
        raise ValueError("sweep modes are fwd and bwd (fwd_bwd mixes two kernels' configs)")
    return replace(case, impl="triton")


def case_rules(case: Case, smem_bytes: int | None) -> dict[str, int | None]:
    """`rules_of_thumb` for a case: its head_dim, longest sequence and element size."""
    return rules_of_thumb(case.head_dim, case.max_seqlen, smem_bytes, case.dtype.itemsize)


def rules_of_thumb(
    head_dim: int, seqlen: int, smem_bytes: int | None, itemsize: int
) -> dict[str, int | None]:
    """The square tile (BLOCK_M = BLOCK_N) each rule of thumb picks; None where it says
    nothing. Non-powers of two round down to one (our kernel's tiles are powers of two).

    - "sqrt(M/3d)": B = floor(sqrt(M / (3 d))), M the on-chip memory in elements
      (shared memory bytes / itemsize);
    - "256@d64,192@d128": 256 for d <= 64, 192 (-> 128) for d <= 128;
    - "by seqlen": 256 up to 1k tokens, 128 up to 4k, 64 beyond.
    """

    def pow2_floor(x: float) -> int:
        return max(16, min(256, 1 << math.floor(math.log2(max(x, 1)))))

    sqrt_rule = None
    if smem_bytes:
        sqrt_rule = pow2_floor(math.floor(math.sqrt(smem_bytes / itemsize / (3 * head_dim))))
    by_dim = 256 if head_dim <= 64 else (pow2_floor(192) if head_dim <= 128 else None)
    by_seq = 256 if seqlen <= 1024 else (128 if seqlen <= 4096 else 64)
    return dict(zip(RULES, (sqrt_rule, by_dim, by_seq), strict=True))
