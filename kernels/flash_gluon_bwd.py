"""Host side of the warp-specialised Gluon backward for sm_90 (issue 18).

`gluon_bwd_reason(q, k, v, o, do, causal)` says why the Gluon backward cannot run these
tensors (None when it can); `gluon_backward(do, q, k, v, o, lse2, causal, scale, config)`
runs it on the forward's (o, lse2) (either forward's: lse2 is the log2-domain
log-sum-exp, +inf for rows without keys) and returns (dq, dk, dv) in the layouts of
q, k, v. Three launches: delta = rowsum(dO ∘ O) with the fp32 dQ workspace zeroed (the
`tl` preprocessing kernel), the Gluon kernel (kernels/flash_gluon_bwd_kernels.py: dK, dV,
and dQ shares reduce-added into the workspace), then dQ = scale · workspace in q's dtype
(the one-pass backward's `tl` postprocessing kernel); planned once per tensors' key and
replayed (kernels/flash_gluon_bwd_plan.py).

fp16/bf16 and head_dim 64 or 128 only, on sm_90 with triton 3.6 (Gluon's API moves
between releases); issue 19's window, softcap and ALiBi too (`variant`,
kernels/flash_gluon_bwd_var.py), not packed batches. Everything else (fp32, head_dim 256
or others, the CPU interpreter, packed batches) keeps the `tl` backwards. Importing
this module imports neither triton nor torch's CUDA.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from fa_bench.kernels import flash_gluon
from fa_bench.kernels.flash_gluon_bwd_config import DQ_CHUNK, GluonBwdConfig
from fa_bench.kernels.flash_gluon_bwd_desc import (  # noqa: F401 (re-exported)
    _box_layout,
    _descriptor,
    _row_descriptor,
    row_layout,
    tma_rows,
)
from fa_bench.kernels.flash_gluon_bwd_varhost import variant_reason

if TYPE_CHECKING:
    import torch

BWD_HEAD_DIMS = (64, 128)

# `cfg` with the deepest Q/dO ring (up to 4 stages) that fits shared memory.
_deepest = flash_gluon.deepest


# A developer override of the heuristic: "<role>" (every head_dim) or
# "<head_dim>=<role>,..." (those head dims) of candidate_bwd_configs; tools/gpu's
# GPU scripts set it to the role measured best for the `fa-bench run` that follows,
# before the heuristic below is updated to match.
ROLE_ENV = "FA_BENCH_GLUON_BWD_ROLE"


def _override(head_dim: int, causal: bool) -> GluonBwdConfig | None:
    """$FA_BENCH_GLUON_BWD_ROLE's launch at this head_dim, or None (ValueError naming an
    unknown role or a malformed entry)."""
    import os

    text = os.environ.get(ROLE_ENV, "").strip()
    if not text:
        return None
    role = None
    for entry in text.split(","):
        dim, sep, name = entry.strip().rpartition("=")
        if sep and not dim.strip().isdigit():
            raise ValueError(f"${ROLE_ENV}={text!r}: {entry!r} is not <head_dim>=<role>")
        if not sep or int(dim) == head_dim:
            role = name.strip()
    if role is None:
        return None
    cands = candidate_bwd_configs(head_dim)
    if role not in cands:
        raise ValueError(f"${ROLE_ENV}={text!r}: {role!r} is not one of {sorted(cands)}")
    return _for_causal(cands[role], causal)


def gluon_bwd_config(head_dim: int, causal: bool = False) -> GluonBwdConfig:
    """The heuristic ($FA_BENCH_GLUON_BWD_ROLE overrides it): FA3's Hopper tiles, 128 keys
    per CTA in two consumers of 64, query blocks of 64 rows at head_dim 128 and of 128
    rows at 64 (8-14% faster than 64-row blocks non-causal, -2 to +3% causal: bf16, 4k
    and 16k, H200, session 5 call B), the deepest Q/dO ring that fits (2 stages: 209 KB
    at d128, 195 KB at d64), a head's key blocks together (see GluonBwdConfig.kb_major).
    The roles `_ROLES` names replace that launch: at head_dim 64 and 128 the consumers
    take turns at all of a step's dQ (cuDNN's and FA3's sm90 dQ), dSᵀ read by dK from
    shared memory, dQ staged in the bank-conflict-free column order, a 2-deep ring and,
    non-causal at 128, the rotated query order (session 14)."""
    return _override(head_dim, causal) or _heuristic(head_dim, causal)


# The roles the heuristic takes per head_dim (candidate_bwd_configs' names; a head dim not
# named keeps session 6's launch, `_session6`). 64 (session 7): P and dS through shared
# memory with dQ's chunk queued early, in fa-bench run (session 8 call 0, bf16) 0.969 /
# 0.984 of cuDNN at 4k (non-causal / causal) and 0.904 / 0.916 at 16k, against session 6's
# launch's 0.956 / 0.946 and 0.935 / 0.919 (session 6 call D); do_bench, kernel alone
# (session 7 call 2): 4k +2.8% / +3.8%, 16k -2.0% / -1.1% against session 6's launch.
# 128 (session 12): FA3's shared dQ (half the reduce-adds) with dSᵀ read by dK from shared
# memory and a 2-deep ring, +4.6 / +8.7% at 4k (non-causal / causal) and +5.0 / +7.5% at
# 16k against session 6's launch in do_bench (bf16, kernel alone, docs/kernel.md).
# Both since session 14: the consumers' turns at all of dQ with its staging stores free of
# bank conflicts ("ws-dss-sdq-s2-alt-perm"); `fa-bench run` (call 5, ÷ cuDNN, 4k / 4k
# causal / 16k / 16k causal, bf16) d128 1.011 / 0.988 / 1.011 / 1.012 and d64 1.093 /
# 1.039 / 1.094 / 1.094, against session 12's roles with the permuted staging in the same
# call, 0.950 / 0.974 / 0.953 / 1.020 and 0.992 / 0.984 / 0.997 / 1.002. Session 15: causal,
# a few heads' key blocks interleaved ("-grp", GluonBwdConfig.head_groups): bf16 d128 4k
# causal 1.023 of cuDNN against the head-major order's 1.005 in the same call (call 1).
_ROLES: dict[int, str] = {64: "ws-dss-sdq-s2-alt-perm-grp", 128: "ws-dss-sdq-s2-alt-perm-grp"}
# _heuristic's launch by (head_dim, causal, role): built once
_HEURISTIC: dict[tuple[int, bool, str | None], GluonBwdConfig] = {}


def _heuristic(head_dim: int, causal: bool) -> GluonBwdConfig:
    role = _ROLES.get(head_dim)
    key = (head_dim, causal, role)
    if key in _HEURISTIC:
        return _HEURISTIC[key]
    if role is None:
        cfg = _session6(head_dim, causal)
    else:
        cfg = _for_causal(candidate_bwd_configs(head_dim)[role], causal)
    _HEURISTIC[key] = cfg
    return cfg


def _for_causal(cfg: GluonBwdConfig, causal: bool) -> GluonBwdConfig:
    """The launch as it runs (and is labelled): causal CTAs start at their diagonal (no
    rotation); without the mask every key block has the same work (no head groups)."""
    return dataclasses.replace(cfg, rotate=cfg.rotate and not causal,
                               head_groups=cfg.head_groups and causal)  # fmt: skip


def _session6(head_dim: int, causal: bool) -> GluonBwdConfig:
    wide = head_dim > 64
    base = GluonBwdConfig(block_m=64 if wide else 128, early_dq=wide, rotate=wide and not causal)
    return _deepest(base, head_dim)


# candidate_bwd_configs' launches by (head_dim, its "ws" role): built once, since the
# heuristic and the override ask for them on every backward call (session 12: building
# all of them cost ~0.55 ms of host time per call at head_dim 64 on the H200's host, ahead
# of the first kernel, which `fa-bench run` times in the first call of each batch)
_CANDIDATES: dict[tuple[int, str | None], dict[str, GluonBwdConfig]] = {}


def candidate_bwd_configs(head_dim: int) -> dict[str, GluonBwdConfig]:
    """`_candidates`' launches (a copy; built once per head_dim and heuristic role)."""
    key = (head_dim, _ROLES.get(head_dim))
    if key not in _CANDIDATES:
        _CANDIDATES[key] = _candidates(head_dim)
    return dict(_CANDIDATES[key])


def _candidates(head_dim: int) -> dict[str, GluonBwdConfig]:
    """What the compile check and the GPU check cover, by role: "ws" the heuristic's,
    "ws-plain" it without the early chunk and the rotation (the first heuristic),
    "ws-shallow" a ring one stage shallower (when it has more than two), "ws-sdq" FA3's
    shared dQ (head_dim 128) with the deepest ring that fits, "ws-m64" query blocks of
    64 rows at head_dim 64 (its first heuristic), "ws-rot" the rotated query-block order,
    "ws-early" dQ's first chunk queued early, "ws-kbmajor" the first causal grid order,
    "ws-pp" the consumers' ping-pong, "ws-early2" (head_dim 128) the heuristic with both
    dQ chunks queued early, "ws-dqfirst" the heuristic with FA3's dV, dQ, dK order,
    "ws-dqfirst1" (head_dim 128) with only dQ's first chunk before dK; session 7's
    A operands from shared memory (GluonBwdConfig.ops_smem): "ws-dss", "ws-pss", "ws-sum"
    on session 6's launch, and with every dQ chunk queued early ("-early2" at head_dim
    128, "-early" at 64); session 12's FA3 shared dQ on those operands: "ws-dss-sdq",
    "ws-pss-sdq" (the deepest ring), "ws-dss-sdq-s2" (two stages), "-norot" without the
    rotated order. All but "ws" are built on session 6's launch ("ws-s6")."""
    base = _session6(head_dim, False)
    # the heuristic's tiles and order with none of the dQ schedules (each role sets one)
    bare = dataclasses.replace(base, early_dq=False, early_dq_all=False, dq_first=0)
    plain = dataclasses.replace(bare, rotate=False)
    out = {"ws": base, "ws-s6": base, "ws-plain": plain,
           "ws-rot": dataclasses.replace(plain, rotate=True),
           "ws-early": dataclasses.replace(plain, early_dq=True),
           "ws-kbmajor": dataclasses.replace(base, kb_major=True),
           "ws-pp": dataclasses.replace(base, pingpong=True),
           "ws-dqfirst": dataclasses.replace(bare, dq_first=2)}  # fmt: skip
    if base.stages > 2:
        out["ws-shallow"] = dataclasses.replace(base, stages=base.stages - 1)
    out["ws-sdq"] = _deepest(dataclasses.replace(plain, shared_dq=True), head_dim)
    if head_dim == 2 * DQ_CHUNK:
        out["ws-early2"] = dataclasses.replace(bare, early_dq_all=True)
        out["ws-dqfirst1"] = dataclasses.replace(bare, dq_first=1)
    else:
        out["ws-m64"] = _deepest(dataclasses.replace(plain, block_m=64), head_dim)
    # session 7: A operands from shared memory, alone and with the dQ schedules they
    # might keep asynchronous (two chunks early at 128, one early at 64)
    early = dict(early_dq_all=True) if head_dim == 2 * DQ_CHUNK else dict(early_dq=True)
    tag = "early2" if head_dim == 2 * DQ_CHUNK else "early"
    for ops, name in ((1, "dss"), (2, "pss"), (3, "sum")):
        out[f"ws-{name}"] = _deepest(dataclasses.replace(base, ops_smem=ops), head_dim)
        out[f"ws-{name}-{tag}"] = _deepest(dataclasses.replace(bare, ops_smem=ops, **early),
                                           head_dim)  # fmt: skip
    # session 12: FA3's shared dQ (half the reduce-adds) on the shared-memory operands
    for ops, name in ((1, "dss"), (2, "pss")):
        out[f"ws-{name}-sdq"] = _deepest(dataclasses.replace(bare, ops_smem=ops, shared_dq=True),
                                         head_dim)  # fmt: skip
    sdq = out["ws-dss-sdq"]
    out["ws-dss-sdq-s2"] = dataclasses.replace(sdq, stages=2)  # more of the SM's L1 left
    out["ws-dss-sdq-norot"] = dataclasses.replace(sdq, rotate=False)
    out["ws-dss-sdq-s2-norot"] = dataclasses.replace(sdq, stages=2, rotate=False)
    # session 14: the dQ staging stores without bank conflicts (columns permuted)
    for role in ("ws-dss-sdq-s2", "ws-pss-early", "ws-dss-sdq"):
        if role in out:
            out[f"{role}-perm"] = dataclasses.replace(out[role], dq_perm=True)
            if out[role].ops_smem == 1:  # the consumers' turns at all of dQ, where it fits
                alt = dataclasses.replace(out[role], shared_dq=False, alt_dq=True, dq_perm=True)
                if alt.smem_bytes(head_dim) <= flash_gluon.SMEM_BYTES:
                    out[f"{role}-alt-perm"] = alt
                    # session 15: causal, a few heads' key blocks interleaved
                    out[f"{role}-alt-perm-grp"] = dataclasses.replace(alt, head_groups=True)
    if head_dim in _ROLES:  # "ws" is the heuristic's launch
        out["ws"] = out[_ROLES[head_dim]]
    return out


def gluon_bwd_reason(q: Any, k: Any, v: Any, o: Any, do: Any, causal: bool,
                     variant: Any = None) -> str | None:  # fmt: skip
    """Why the Gluon backward cannot run these tensors, or None if it can: the Gluon
    forward's conditions (sm_90, triton 3.6, fp16/bf16, TMA alignment, no interpreter),
    head_dim 64 or 128, o and dO shaped and aligned like q, and a variant it has
    (flash_gluon_bwd_varhost.variant_reason: no packed batch, nor a launch that spills)."""
    reason = variant_reason(variant, q.shape[-1], causal)
    reason = reason or flash_gluon.gluon_reason(q, k, v, causal)
    if reason:
        return reason
    head_dim = q.shape[3]
    if head_dim not in BWD_HEAD_DIMS:
        return f"head_dim={head_dim}: the Gluon backward takes {BWD_HEAD_DIMS}"
    for name, t in (("o", o), ("do", do)):
        reason = flash_gluon._tensor_reason(name, t)
        if reason:
            return reason
        if t.shape != q.shape or t.dtype != q.dtype or t.device != q.device:
            return f"{name} {tuple(t.shape)} {t.dtype} does not match q {tuple(q.shape)} {q.dtype}"
    for name, t in (("q", q), ("k", k), ("v", v), ("o", o), ("do", do)):
        if 0 in t.stride():  # an expanded (broadcast) tensor: no TMA descriptor over it
            return f"{name}.stride()={tuple(t.stride())}: a zero stride (broadcast tensor)"
    return None


def backward_choice(q: Any, k: Any, v: Any, o: Any, do: Any, causal: bool, cfg: Any,
                    default: bool = False,
                    variant: Any = None) -> GluonBwdConfig | None:  # fmt: skip
    """The Gluon launch a one-pass backward (`deterministic=False`) runs with, or None for
    the `tl` kernel, by `cfg.backward` (a FlashConfig): "tl" never, "auto" where the
    Gluon kernel can run, "gluon" always (ValueError naming why it cannot). `default`
    (flash_attention's `deterministic=None`): "tl" counts as "auto" (None: the two-kernel
    backward runs instead). `variant`: issue 19's (flash_validate.Variant, or None)."""
    if cfg.backward == "tl" and not default:
        return None
    reason = gluon_bwd_reason(q, k, v, o, do, causal, variant)
    if reason and cfg.backward == "gluon":
        raise ValueError(f"FlashConfig(backward='gluon') cannot run this backward: {reason}")
    return None if reason else gluon_bwd_config(q.shape[-1], causal)


def _check_args(cfg: Any, causal: Any, scale: Any, head_dim: int) -> GluonBwdConfig:
    if not isinstance(causal, bool):
        raise TypeError(f"causal={causal!r}: expected a bool")
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not scale > 0:
        raise ValueError(f"scale={scale!r}: expected a positive float")
    cfg = cfg if cfg is not None else gluon_bwd_config(head_dim, causal)
    if not isinstance(cfg, GluonBwdConfig):
        raise TypeError(f"config={cfg!r}: expected a GluonBwdConfig")
    if cfg.early_dq_all and head_dim != 2 * DQ_CHUNK:
        raise ValueError(
            f"config={cfg.label()}: early_dq_all queues dQ's two {DQ_CHUNK}-column chunks; "
            f"head_dim={head_dim}"
        )
    if cfg.smem_bytes(head_dim) > flash_gluon.SMEM_BYTES:
        raise ValueError(
            f"config={cfg.label()} at head_dim={head_dim} needs {cfg.smem_bytes(head_dim)} "
            f"bytes of shared memory, more than sm_90's {flash_gluon.SMEM_BYTES}: fewer stages"
        )
    return cfg


def gluon_backward(
    do: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    o: torch.Tensor,
    lse2: torch.Tensor,
    causal: bool,
    scale: float,
    config: GluonBwdConfig | None = None,
    checked: bool = False,
    variant: Any = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of softmax(q kᵀ · scale) v on sm_90 with the Gluon kernel.
    `checked=True`: the caller has just had `gluon_bwd_reason` say None for these
    tensors (flash_attention's dispatch, through `backward_choice`), so it is not asked
    twice per timed call. `variant`: the forward's window, softcap and ALiBi
    (flash_validate.Variant; o and lse2 must be that forward's)."""
    import torch

    from fa_bench.kernels import flash_gluon_bwd_plan

    reason = None if checked else gluon_bwd_reason(q, k, v, o, do, causal, variant)
    if reason:
        raise ValueError(f"gluon_backward cannot run these inputs: {reason}")
    batch, heads_q, seq_q, head_dim = q.shape
    if tuple(lse2.shape) != (batch, heads_q, seq_q) or lse2.dtype != torch.float32:
        raise ValueError(
            f"lse2 {tuple(lse2.shape)} {lse2.dtype}: expected ({batch}, {heads_q}, {seq_q}) "
            "float32 (the forward's log2-domain lse)"
        )
    cfg = _check_args(config, causal, scale, head_dim)
    lse2 = lse2.contiguous()
    # the fp32 dQ workspace and delta in one allocation: a small delta of its
    # own could land at another address each call (the small pool is shared with the L2
    # flush's and others' small tensors), and every address is part of a plan's key
    rows = batch * heads_q * seq_q
    buf = torch.empty(rows * (head_dim + 1), device=q.device, dtype=torch.float32)
    dq_ws = buf[: rows * head_dim].view(batch, heads_q, seq_q, head_dim)
    delta = buf[rows * head_dim :].view(batch, heads_q, seq_q)
    # delta and the zeroed workspace first: the GPU runs them while the host builds the
    # rest (its time is timed too when the GPU waits for it: see flash_gluon_bwd_plan)
    flash_gluon_bwd_plan.launch_pre(o, do, delta, dq_ws)
    dk, dv, dq = torch.empty_like(k), torch.empty_like(v), torch.empty_like(q)
    # the kernel, dQ's cast: replayed from a plan where one matches
    tensors = (q, k, v, o, do, dk, dv, dq, dq_ws)
    flash_gluon_bwd_plan.launch(cfg, tensors, lse2, delta, causal, float(scale), variant)
    return dq, dk, dv


def _launch(cfg: GluonBwdConfig, tensors: tuple, lse2: Any, delta: Any, causal: bool,
            scale: float, probe: int = 0, variant: Any = None) -> None:  # fmt: skip
    """One JIT launch of the Gluon kernel alone on (q, k, v, do, dk, dv, dq_ws)
    (flash_gluon_bwd_plan.main_call). `probe` (tools/gpu's accounts of the time, dQ left
    wrong): 2 skips the dQ reduce-adds."""
    from fa_bench.kernels import flash_gluon_bwd_plan

    fn, grid, args, kwargs = flash_gluon_bwd_plan.main_call(
        cfg, tensors, lse2, delta, causal, scale, probe, variant
    )
    fn[grid](*args, **kwargs)
