"""The forward sweep of the Gluon kernel (`fa-bench sweep --kernel gluon`, issue 21).

A point is a case plus one Gluon launch, pinned entirely by the FlashConfig's `gluon_*`
fields (kernels/gluon_fields.py): the timing worker runs it with forward="gluon", so a
launch that cannot run is an `error` row, never a silent `tl` run. The space per case:

- the heuristic's launch, `flash_gluon.gluon_config(head_dim, causal)`, always measured
  (`is_default`): the baseline of the gain;
- `flash_gluon.candidate_configs(head_dim)` by role ("ws", "ws-nopp", "ws-persist",
  "ws-persist-q2", "ws-shallow", "ws-c3" at head_dim 64, "pipelined"), or the roles
  `--gluon-role` names; each at the `--gluon-block-n` and `--gluon-stages` values when
  given (else its own). A role a head_dim lacks (ws-c3 above 64) is left out there.

Pruning, before anything is compiled (a pruned point is a row with its reason):
1. a combination GluonConfig refuses (three consumers with ping-pong, ...);
2. shared memory: the Q tile(s) and the K/V ring, `GluonConfig.smem_bytes(head_dim,
   itemsize)`, must fit sm_90's 227 KB less the kernels' 1 KB of mbarriers
   (`flash_gluon.SMEM_BYTES`), or the device's limit if lower;
3. a key step longer than the sequence (padded to a power of two) is redundant.

Where the Gluon kernel cannot run at all (no sm_90 GPU, the interpreter, another triton,
fp32 or fp8, a head_dim it does not take, a backward sweep) the sweep is refused with
exit 2 and the reason (`device_reason`, `case_reason`): a sweep of nothing but errors
would look finished.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from fa_bench.case import Case, Mode
from fa_bench.sweep.space import Point

ROLES = ("ws", "ws-nopp", "ws-persist", "ws-persist-q2", "ws-shallow", "ws-c3", "pipelined")
_BLOCK_N = (32, 64, 128, 256)
_STAGES = (1, 2, 3, 4)


@dataclass(frozen=True)
class GluonSpace:
    """The Gluon sweep's axes: candidate roles, and key steps and ring depths laid over
    each candidate (empty: the candidate's own)."""

    roles: tuple[str, ...] = ROLES
    block_n: tuple[int, ...] = ()
    stages: tuple[int, ...] = ()

    # Each axis is a flag; sweep.json's `space` names it beside kernel = "gluon".
    FLAGS: ClassVar[dict[str, str]] = {
        "roles": "--gluon-role", "block_n": "--gluon-block-n", "stages": "--gluon-stages",
    }  # fmt: skip

    def __post_init__(self) -> None:
        if not self.roles:
            raise ValueError("--gluon-role needs at least one value")
        bad_roles = [r for r in self.roles if r not in ROLES]
        if bad_roles:
            raise ValueError(f"--gluon-role {bad_roles[0]}: valid roles are {', '.join(ROLES)}")
        for name, valid in (("block_n", _BLOCK_N), ("stages", _STAGES)):
            bad = [v for v in getattr(self, name) if isinstance(v, bool) or v not in valid]
            if bad:
                raise ValueError(
                    f"{self.FLAGS[name]} {bad[0]}: valid values are "
                    f"{', '.join(str(v) for v in valid)}"
                )

    @property
    def size(self) -> int:
        """Launches per case at most (before roles a head_dim lacks and duplicates)."""
        return len(self.roles) * max(1, len(self.block_n)) * max(1, len(self.stages))

    def to_dict(self) -> dict[str, Any]:
        return {"kernel": "gluon", "roles": list(self.roles), "block_n": list(self.block_n),
                "stages": list(self.stages)}  # fmt: skip

    @classmethod
    def from_dict(cls, d: dict) -> GluonSpace:
        """A sweep-plan.json `space` written by `to_dict` (ValueError/TypeError if bad)."""
        if d.get("kernel") != "gluon":
            raise ValueError(f"not a Gluon sweep's space: {d!r}")
        return cls(tuple(d["roles"]), tuple(d["block_n"]), tuple(d["stages"]))


def device_reason(device: str, gpu: int | None) -> str | None:
    """Why the Gluon forward cannot run on this sweep's device, or None."""
    if device != "cuda":
        return (
            "no sm_90 GPU: the Gluon forward runs only on an sm_90 GPU (Hopper); on a CPU "
            "our kernels run in Triton's interpreter, which cannot run Gluon"
        )
    if os.environ.get("TRITON_INTERPRET") == "1":
        return "TRITON_INTERPRET=1: Gluon kernels do not run in the Triton interpreter"
    import torch

    from fa_bench.kernels import flash_gluon

    # The kernel's own check on a tiny input: capability, triton version, Gluon API.
    t = torch.zeros((1, 1, 16, 64), dtype=torch.bfloat16, device=torch.device("cuda", gpu or 0))
    return flash_gluon.gluon_reason(t, t, t, False)


def case_reason(case: Case) -> str | None:
    """Why the Gluon forward cannot run this case (whatever the device), or None."""
    from fa_bench.kernels import flash_gluon

    if case.mode is not Mode.FWD:
        return f"mode {case.mode.value}: the Gluon kernel is a forward; sweep it with --mode fwd"
    if case.dtype.value not in ("fp16", "bf16"):
        return f"dtype {case.dtype.value}: the Gluon forward takes fp16 and bf16"
    if case.head_dim not in flash_gluon.HEAD_DIMS:
        return f"head_dim {case.head_dim}: the Gluon kernel takes {flash_gluon.HEAD_DIMS}"
    return None


def prune_reason(case: Case, fields: dict, smem_limit_bytes: int | None) -> str | None:
    """Why a pinned Gluon launch is not worth compiling for this case, or None."""
    from fa_bench.kernels import flash_gluon
    from fa_bench.kernels.flash_config import FlashConfig, pad_pow2
    from fa_bench.kernels.gluon_fields import pinned

    try:
        FlashConfig(**fields)
        g = pinned(fields)
    except (TypeError, ValueError) as exc:
        return f"invalid config: {exc}"
    limit = flash_gluon.SMEM_BYTES
    if smem_limit_bytes is not None:  # the kernels keep 1 KB of it for their mbarriers
        limit = min(limit, smem_limit_bytes - 1024)
    need = g.smem_bytes(case.head_dim, case.dtype.itemsize)
    if need > limit:
        return (
            f"shared memory: the Q tile and a {g.stages}-stage K/V ring need {need // 1024} KB, "
            f"the Gluon kernel has {limit // 1024} KB per block"
        )
    seq_k = pad_pow2(case.seqlen_k)
    if g.block_n > seq_k:
        return f"redundant: block_n {g.block_n} exceeds the padded key length {seq_k}"
    return None


def _launches(case: Case, space: GluonSpace) -> list[dict]:
    """The candidates' pinned fields for this case, in role order, each at the space's
    key steps and ring depths, without duplicates."""
    from fa_bench.kernels import flash_gluon
    from fa_bench.kernels.gluon_fields import fields_of

    candidates = flash_gluon.candidate_configs(case.head_dim)
    out: list[dict] = []
    for role in space.roles:
        if role not in candidates:
            continue
        g = candidates[role]
        for block_n in space.block_n or (g.block_n,):
            for stages in space.stages or (g.stages,):
                # GluonSpace's checks keep both within GluonConfig's own
                fields = fields_of(dataclasses.replace(g, block_n=block_n, stages=stages))
                if fields not in out:
                    out.append(fields)
    return out


def gluon_points(
    cases: Sequence[Case], space: GluonSpace, *, smem_limit_bytes: int | None
) -> list[Point]:
    """Every (case, Gluon launch) of the sweep, the heuristic's launch first per case."""
    from fa_bench.kernels import flash_gluon
    from fa_bench.kernels.gluon_fields import fields_of

    points: list[Point] = []
    for case in cases:
        default = fields_of(flash_gluon.gluon_config(case.head_dim, case.causal))
        points.append(Point(case, default, True))
        for fields in _launches(case, space):
            if fields != default:
                pruned = prune_reason(case, fields, smem_limit_bytes)
                points.append(Point(case, fields, False, pruned))
    return points


def check_not_all_pruned(points: Sequence[Point], space: GluonSpace, given: set[str]) -> None:
    """Refuse (ValueError naming the flags) a space pruned for every case: only the
    heuristic's launch would be measured and the sweep would look finished."""
    others = [p for p in points if not p.is_default]
    if others and any(not p.pruned for p in others):
        return
    if not others:
        why = "no candidate of the requested roles differs from the heuristic's launch"
    else:
        reasons = sorted({p.pruned or "" for p in others})
        why = "every launch is pruned: " + "; ".join(reasons[:3])
    named = [f for f in GluonSpace.FLAGS.values() if f in given] or ["--gluon-role"]
    shown = " ".join(f"{f} {','.join(str(v) for v in getattr(space, _axis(f)))}" for f in named)
    raise ValueError(
        f"{shown}: {why}, so only the heuristic's launch would be measured. Roles: "
        f"{', '.join(ROLES)}; --gluon-block-n 32,64,128,256; --gluon-stages 1..4 "
        "(docs/sweep.md)"
    )


def _axis(flag: str) -> str:
    return {v: k for k, v in GluonSpace.FLAGS.items()}[flag]
