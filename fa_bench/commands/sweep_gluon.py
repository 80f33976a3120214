"""`fa-bench sweep --kernel gluon`: the flag checks and the plan of a Gluon forward sweep
(fa_bench/sweep/gluon_space.py has the space; docs/sweep.md, "The Gluon forward").

Kept apart from commands/sweep.py, which calls in here with its `SweepRequest` (typed Any
here: importing that module back would be an import cycle).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fa_bench.case import Case
from fa_bench.errors import UsageError
from fa_bench.sweep.gluon_space import (
    ROLES,
    GluonSpace,
    case_reason,
    device_reason,
    gluon_points,
)
from fa_bench.sweep.space import Point
from fa_bench.sweep.vocab import KERNELS

_TL_FLAGS = {"block_m": "--block-m", "block_n": "--block-n", "warps": "--warps",
             "stages": "--stages"}  # fmt: skip
_GLUON_FLAGS = {"gluon_roles": "--gluon-role", "gluon_block_n": "--gluon-block-n",
                "gluon_stages": "--gluon-stages"}  # fmt: skip


class GluonSweepError(UsageError, ValueError):
    """Bad --kernel and Gluon axis flags, or a Gluon sweep that cannot run: exit 2."""


def check_flags(req: Any) -> tuple[str, ...]:
    """The modes a sweep of `req` (a SweepRequest) runs: a Gluon sweep's are fwd unless
    --mode says otherwise, then refused; GluonSweepError (exit 2) for an unknown --kernel,
    or axis flags of the other kernel."""
    if req.kernel not in KERNELS:
        raise GluonSweepError(f"--kernel {req.kernel}: valid kernels are {', '.join(KERNELS)}")
    if req.kernel == "tl":
        given = [flag for name, flag in _GLUON_FLAGS.items() if getattr(req, name)]
        if given:
            raise GluonSweepError(
                f"{given[0]}: an axis of the Gluon forward's sweep; give --kernel gluon with "
                "it (--kernel tl, the default, sweeps the `tl` kernel's --block-m, "
                "--block-n, --warps, --stages)"
            )
        return tuple(req.modes)
    given = [flag for name, flag in _TL_FLAGS.items() if getattr(req, name)]
    if given:
        raise GluonSweepError(
            f"{given[0]}: an axis of the `tl` kernel's sweep; with --kernel gluon the axes "
            "are --gluon-role, --gluon-block-n and --gluon-stages"
        )
    modes = tuple(req.modes) if "--mode" in req.given else ("fwd",)
    backward = [m for m in modes if m != "fwd"]
    if backward:
        raise GluonSweepError(
            f"--mode {backward[0]}: --kernel gluon sweeps the Gluon forward; give --mode fwd "
            "(the backward is the `tl` kernels' whatever the forward)"
        )
    requested_space(req)  # its checks name the flag
    return modes


def requested_space(req: Any) -> GluonSpace:
    """The Gluon space a SweepRequest's flags ask for; GluonSweepError naming the flag of
    a bad value."""
    try:
        return GluonSpace(
            roles=req.gluon_roles or ROLES,
            block_n=req.gluon_block_n or (),
            stages=req.gluon_stages or (),
        )
    except ValueError as exc:  # GluonSpace's checks name the flag
        raise GluonSweepError(str(exc)) from None


def check_gluon_device(req: Any, device: str) -> None:
    """Refuse (exit 2, naming why) a Gluon sweep where the Gluon forward cannot run."""
    reason = device_reason(device, req.gpu)
    if reason:
        raise GluonSweepError(f"--kernel gluon: {reason}")


def plan_gluon(req: Any, cases: Sequence[Case], smem: int | None) -> tuple[list[Point], GluonSpace]:
    """A Gluon sweep's points: every case must be one the Gluon forward takes (else exit
    2 naming it), and some launch besides the heuristic's must be left to measure."""
    from fa_bench.run.limits import check_case_count
    from fa_bench.sweep.gluon_space import check_not_all_pruned

    for case in cases:
        reason = case_reason(case)
        if reason:
            raise GluonSweepError(
                f"--kernel gluon: the Gluon forward cannot run {case.id}: {reason}; narrow "
                "the cases (--dtype fp16,bf16, --head-dim 64,128,256, --mode fwd)"
            )
    space = requested_space(req)
    points = gluon_points(cases, space, smem_limit_bytes=smem)
    check_case_count(len(points), req.max_cases, "the cases × configs", "points")
    try:
        check_not_all_pruned(points, space, set(req.given))
    except ValueError as exc:
        raise GluonSweepError(str(exc)) from None
    return points, space
