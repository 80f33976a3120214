"""Host side of the Gluon FlashAttention forward for sm_90 (issue 21).

`gluon_reason(q, k, v, causal)` says why the Gluon kernel cannot run these inputs (None
when it can), `gluon_preferred` whether it also measured faster than the `tl` forward
there (what an automatic dispatch should ask); `gluon_forward(q, k, v, causal, scale,
config)` runs it and returns (o, lse2) with exactly the conventions of
`flash_attention._forward`: o in q's layout (B, Hq, Sq, D), lse2 the log2-domain
log-sum-exp (B, Hq, Sq) fp32 with +inf for rows that see no key, bottom-right causal,
GQA, any sequence lengths. So the `tl` backward consumes it unchanged.

The kernels (kernels/flash_gluon_kernels.py) are written against triton 3.6.0's Gluon
API; this module imports triton only when a kernel is launched or the API is probed, so
importing it touches no device and no triton.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar, cast

# The launch (descriptors, grid, the plans that replay it) lives in flash_gluon_plan.
from fa_bench.kernels import flash_gluon_plan

# The input checks live in flash_gluon_checks; their names stay importable from here.
from fa_bench.kernels.flash_gluon_checks import (  # noqa: F401
    _TMA_ALIGN,
    GLUON_TRITON,
    HEAD_DIMS,
    _api_reason,
    _tensor_reason,
    gluon_reason,
    version_reason,
)
from fa_bench.kernels.flash_gluon_plan import _descriptor, _shared_layout  # noqa: F401

if TYPE_CHECKING:
    import torch

_LOG2E = 1.4426950408889634
VARIANTS = ("ws", "pipelined")
# GluonConfig.exp2_emu's values: kernels/gluon_exp2.EMU_CHOICES (not imported: that module
# imports triton, this one must not).
EXP2_EMU = (0, 2, 4, 8)
# The SOFTMAX code's bit for tree reductions (gluon_exp2.TREE_BIT, mirrored likewise).
_TREE_BIT = 16
# sm_90's shared memory per block (227 KB) less what the kernels keep for mbarriers.
SMEM_BYTES = 227 * 1024 - 1024
# setmaxnreg takes multiples of 8 from 24 to 256.
_MIN_REGS, _MAX_REGS = 24, 256


@dataclass(frozen=True)
class GluonConfig:
    """Launch parameters of the Gluon forward.

    variant: "ws" (warp specialised: a producer warp and two consumer warpgroups) or
      "pipelined" (one partition issuing its own TMA loads; the fallback).
    block_m: query rows per consumer warpgroup ("ws": 64, each of the two consumers
      owns its own tile, a CTA covers 2·block_m rows) or per CTA ("pipelined": 64
      with 4 warps, 128 with 8).
    block_n: keys per step; stages: depth of the K/V ring in shared memory.
    num_warps: warps of the "pipelined" kernel (4 or 8); "ws" always has 4 per consumer.
    pingpong: the two "ws" consumers take turns to issue their matmuls.
    persistent: "ws" only: one CTA per SM looping over the tiles (heaviest causal
      tiles first) instead of one CTA per tile.
    consumers: "ws" consumer warpgroups per CTA: 2, or 3 without ping-pong and with
      fewer registers each (FA3's head_dim 64 shape: 192 rows per CTA).
    q_buffers: persistent only: 2 Q buffers per consumer let the next tile's Q load while
      this tile runs (no bubble between tiles), at the cost of ring stages.
    producer_regs / consumer_regs: per-thread registers of the "ws" producer's
      warpgroup and of consumer 1 (consumer 0 gets what is left of the 64K).
    exp2_emu: every exp2_emu-th exponential of P computed on the FMA pipes instead of the
      MUFU unit (kernels/gluon_exp2.py: 2, 4 or 8; 0 = none, the measured default).
    tree_reduce: the softmax's row max and sum folded in halves inside each thread (a
      short dependency chain) instead of triton's sequential per-thread reduction.
    """

    variant: str = "ws"
    block_m: int = 64
    block_n: int = 128
    stages: int = 2
    num_warps: int = 4
    pingpong: bool = True
    persistent: bool = False
    consumers: int = 2
    q_buffers: int = 1
    producer_regs: int = 24
    consumer_regs: int = 240
    exp2_emu: int = 0
    tree_reduce: bool = False

    def __post_init__(self) -> None:
        if self.variant not in VARIANTS:
            raise ValueError(f"GluonConfig.variant={self.variant!r}: expected one of {VARIANTS}")
        for name, valid in (
            ("block_m", (64, 128)),
            ("block_n", (32, 64, 128, 256)),
            ("stages", (1, 2, 3, 4)),
            ("num_warps", (4, 8)),
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or value not in valid:
                raise ValueError(f"GluonConfig.{name}={value!r}: expected one of {valid}")
        if self.variant == "pipelined" and self.block_m != 16 * self.num_warps:
            # wgmma tiles rows 16 per warp: 4 warps hold 64 rows, 8 warps 128
            raise ValueError(
                f"GluonConfig(variant='pipelined', block_m={self.block_m}, "
                f"num_warps={self.num_warps}): block_m must be 16 * num_warps"
            )
        if self.variant == "ws" and (self.block_m != 64 or self.num_warps != 4):
            raise ValueError(
                f"GluonConfig(variant='ws', block_m={self.block_m}, num_warps={self.num_warps}): "
                "each ws consumer is one warpgroup of 4 warps owning 64 rows"
            )
        for name in ("pingpong", "persistent", "tree_reduce"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"GluonConfig.{name}={getattr(self, name)!r}: expected a bool")
        if type(self.exp2_emu) is not int or self.exp2_emu not in EXP2_EMU:
            raise ValueError(f"GluonConfig.exp2_emu={self.exp2_emu!r}: expected one of {EXP2_EMU}")
        if self.consumers not in (2, 3) or isinstance(self.consumers, bool):
            raise ValueError(f"GluonConfig.consumers={self.consumers!r}: expected 2 or 3")
        if self.consumers == 3 and (self.pingpong or self.persistent):
            raise ValueError(
                f"GluonConfig(consumers=3, pingpong={self.pingpong}, "
                f"persistent={self.persistent}): three consumers run without ping-pong, "
                "not persistent"
            )
        if self.variant == "ws" and self.registers()[0] < self.consumer_regs:
            raise ValueError(
                f"GluonConfig(consumers={self.consumers}, consumer_regs={self.consumer_regs}, "
                f"producer_regs={self.producer_regs}): consumer 0 would get only "
                f"{self.registers()[0]} registers of the 64K"
            )
        if self.q_buffers not in (1, 2) or isinstance(self.q_buffers, bool):
            raise ValueError(f"GluonConfig.q_buffers={self.q_buffers!r}: expected 1 or 2")
        if self.q_buffers == 2 and not self.persistent:
            raise ValueError("GluonConfig(q_buffers=2): only the persistent kernel has them")
        if self.persistent and self.variant != "ws":
            raise ValueError(
                f"GluonConfig(variant={self.variant!r}, persistent=True): only 'ws' is persistent"
            )
        check_regs(self)

    @property
    def rows_per_cta(self) -> int:
        return self.consumers * self.block_m if self.variant == "ws" else self.block_m

    def registers(self) -> tuple[int, int, int]:
        """Per-thread registers of (consumer 0, the other consumers, the producer's
        warpgroup) as triton 3.6's AllocateWarpGroups splits the 64K of a "ws" CTA: the
        start value 64K / threads (a multiple of 8), the workers' requests, the rest to
        the default partition (consumer 0)."""
        warpgroups = self.consumers + 1
        start = 65536 // (warpgroups * 128) // 8 * 8
        rest = start + (start - self.consumer_regs) * (self.consumers - 1)
        rest += start - self.producer_regs
        return min(rest // 8 * 8, 256), self.consumer_regs, self.producer_regs

    def softmax_code(self) -> int:
        """The kernels' SOFTMAX constexpr: exp2_emu, plus 16 for tree reductions (0: the
        plain softmax, whose generated code is the one before these fields existed)."""
        return self.exp2_emu + (_TREE_BIT if self.tree_reduce else 0)

    def smem_bytes(self, head_dim: int, elem_bytes: int = 2) -> int:
        """Shared memory of the Q tile(s) and the K/V ring (the O tile reuses Q's)."""
        q_rows = self.rows_per_cta * self.q_buffers
        return (q_rows + 2 * self.stages * self.block_n) * head_dim * elem_bytes

    def label(self) -> str:
        """A short name for tables: the variant and its tiles."""
        text = f"{self.variant}-m{self.block_m}-n{self.block_n}-s{self.stages}"
        emu = f"-e{self.exp2_emu}" if self.exp2_emu else ""
        emu += "-t" if self.tree_reduce else ""
        if self.variant == "pipelined":
            return f"{text}-w{self.num_warps}{emu}"
        text = text if self.consumers == 2 else f"{text}-c{self.consumers}"
        text = text if self.pingpong else f"{text}-nopp"
        text = f"{text}-q{self.q_buffers}" if self.q_buffers != 1 else text
        text = f"{text}-persist" if self.persistent else text
        return f"{text}{emu}"


def check_regs(cfg: Any) -> None:
    """ValueError unless the config's producer_regs and consumer_regs are register counts
    setmaxnreg takes (the forward's, the fp8 forward's and the backward's configs)."""
    for name in ("producer_regs", "consumer_regs"):
        value = getattr(cfg, name)
        if (
            isinstance(value, bool)
            or not isinstance(value, int)
            or value % 8
            or not _MIN_REGS <= value <= _MAX_REGS
        ):
            raise ValueError(
                f"{type(cfg).__name__}.{name}={value!r}: expected a multiple of 8 in "
                f"[{_MIN_REGS}, {_MAX_REGS}] (setmaxnreg)"
            )


_Cfg = TypeVar("_Cfg")


def deepest(cfg: _Cfg, head_dim: int) -> _Cfg:
    """`cfg` (a config dataclass with `stages` and smem_bytes(head_dim): the forward's,
    the fp8 forward's, the backward's) with the deepest ring (up to 4 stages) that fits
    shared memory."""
    for stages in (4, 3, 2, 1):
        deeper = dataclasses.replace(cast(Any, cfg), stages=stages)
        if deeper.smem_bytes(head_dim) <= SMEM_BYTES:
            return cast(_Cfg, deeper)
    return cast(_Cfg, dataclasses.replace(cast(Any, cfg), stages=1))


_deepest = deepest


def _ws_base(head_dim: int) -> GluonConfig:
    """The warp-specialised kernel, 128-key steps (64 at head_dim 256) and the deepest ring
    that fits shared memory (d64: 4 stages, 144 KB; d128: 3, 224 KB; d256: 2, 192 KB)."""
    return _deepest(GluonConfig(block_n=64 if head_dim > 128 else 128), head_dim)


def gluon_config(head_dim: int, causal: bool = False) -> GluonConfig:
    """The heuristic: `_ws_base`, except
    - causal head_dim <= 64: the "pipelined" kernel (128 rows, 8 warps, 2 stages) beat it
      on the H200 in all four measured shapes (bf16/fp16, 4k/16k: 426-469 against 388-440
      TFLOP/s, docs/kernel.md);
    - non-causal 64 < head_dim <= 128: the persistent grid with two Q buffers (the next
      tile's Q loads while this one's O is stored; a 2-deep ring then fits) measured
      642 / 636 TFLOP/s against 589 / 614 for `_ws_base` at bf16 d128 4k / 16k (session 5,
      call A, tools/gpu/gluon_check.py), and 631 against 602 in `fa-bench sweep` at 4k.
      Causal it was slower (510 / 536 against 515 / 595), and at d64 within the noise;
    - non-causal head_dim <= 64: three consumers over 128-key steps (FA3's d64 shape: 192
      rows per CTA, no ping-pong, 160 registers each, 4 stages): on the H200 (session 5
      call C, tools/gpu/gluon_d64.py, every launch through the accuracy rule first) bf16
      458.5 / 497.6 TFLOP/s at 4k / 16k against 443.0 / 460.1 for `_ws_base` (fp16 449.4 /
      479.3 against 434.8 / 447.3), cuDNN 475.0 / 464.7 (fp16 451.9 / 444.4) in the same
      process: 1.07-1.08x cuDNN at 16k, 0.965 / 0.995 at 4k; in `fa-bench run` (call D)
      479.4 / 510.2 (fp16 457.6 / 487.5) against cuDNN 462.0 / 456.2 (445.0 / 445.9):
      1.03-1.12x. Its 148 bytes of ptxas spills are the mask's column offsets, reloaded
      only in the masked last key block."""
    if causal and head_dim <= 64:
        return GluonConfig(variant="pipelined", block_m=128, num_warps=8, block_n=128, stages=2)
    if not causal and head_dim <= 64:
        three = GluonConfig(block_n=128, consumers=3, pingpong=False, consumer_regs=160)
        return _deepest(three, head_dim)
    if not causal and 64 < head_dim <= 128:
        base = dataclasses.replace(_ws_base(head_dim), persistent=True, q_buffers=2)
        return _deepest(base, head_dim)
    return _ws_base(head_dim)


def candidate_configs(head_dim: int) -> dict[str, GluonConfig]:
    """What a sweep (and tools/gpu/gluon_check.py) should time at this head_dim, by role:
    "ws" the plain warp-specialised launch (`_ws_base`: the heuristic's for causal head_dim
    128 and for head_dim 256), "ws-nopp" without ping-pong, "ws-persist" persistent,
    "ws-persist-q2" with two Q buffers (the non-causal head_dim 128 heuristic), "ws-shallow"
    a ring one stage shallower (when it has two), "ws-c3" three consumers over 128-key steps
    (head_dim 64: the non-causal heuristic), "pipelined" the fallback (8 warps × 128 rows up
    to head_dim 128, 4 × 64 above; the causal head_dim 64 heuristic)."""
    base = _ws_base(head_dim)
    out = {
        "ws": base,
        "ws-nopp": dataclasses.replace(base, pingpong=False),
        "ws-persist": dataclasses.replace(base, persistent=True),
        "ws-persist-q2": _deepest(
            dataclasses.replace(base, persistent=True, q_buffers=2), head_dim
        ),
    }
    if base.stages > 1:
        out["ws-shallow"] = dataclasses.replace(base, stages=base.stages - 1)
    if head_dim <= 64:
        # FA3's head_dim 64 shape, as the non-causal heuristic takes it (the 64-key form,
        # which kept clear of spills, measured 7-12% slower on the H200: docs/kernel.md)
        out["ws-c3"] = gluon_config(head_dim, causal=False)
    warps = 8 if head_dim <= 128 else 4
    out["pipelined"] = GluonConfig(
        variant="pipelined", block_m=16 * warps, num_warps=warps, block_n=base.block_n, stages=2
    )
    return out


# Where the Gluon kernel beat our `tl` forward on the H200 (run B, docs/kernel.md): head_dim
# -> the shortest key length measured faster (d128: from 1k, 1.13-1.25x; d64: from 4k,
# 1.01-1.13x with the heuristic's kernels; below, ws lost to tl at d64 1k and 2k causal).
# Head dims not listed (256: not timed yet) stay on `tl` unless asked for.
_PAYS_FROM_SEQ_K = {128: 1024, 64: 4096}


def gluon_preferred(q: Any, k: Any, v: Any, causal: bool) -> bool:
    """Whether an automatic dispatch should run the Gluon kernel: it can
    (`gluon_reason` is None) and it measured faster than the `tl` forward there."""
    if gluon_reason(q, k, v, causal) is not None:
        return False
    threshold = _PAYS_FROM_SEQ_K.get(q.shape[3])
    return threshold is not None and k.shape[2] >= threshold


def gluon_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool,
    scale: float,
    config: GluonConfig | None = None,
    *,
    checked: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(q kᵀ · scale) v on sm_90 with the Gluon kernel: (o, lse2) as `_forward`.
    `checked`: the caller's dispatch has already had `gluon_reason` accept the inputs (its
    checks are ~10% of a short call's host time; not repeated)."""
    import torch

    reason = None if checked else gluon_reason(q, k, v, causal)
    if reason:
        raise ValueError(f"gluon_forward cannot run these inputs: {reason}")
    if not isinstance(causal, bool):
        raise TypeError(f"causal={causal!r}: expected a bool")
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not scale > 0:
        raise ValueError(f"scale={scale!r}: expected a positive float")
    batch, heads_q, seq_q, head_dim = q.shape
    cfg = config if config is not None else gluon_config(head_dim, causal)
    if not isinstance(cfg, GluonConfig):
        raise TypeError(f"config={cfg!r}: expected a GluonConfig")
    if cfg.smem_bytes(head_dim) > SMEM_BYTES:
        raise ValueError(
            f"config={cfg.label()} at head_dim={head_dim} needs {cfg.smem_bytes(head_dim)} bytes "
            f"of shared memory, more than sm_90's {SMEM_BYTES}: fewer stages or a smaller block_n"
        )
    o = torch.empty_like(q)  # keeps q's layout
    lse2 = torch.empty((batch, heads_q, seq_q), device=q.device, dtype=torch.float32)
    _launch(cfg, q, k, v, o, lse2, causal, float(scale) * _LOG2E)
    return o, lse2


def _launch(cfg: GluonConfig, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
            lse2: torch.Tensor, causal: bool, qk_scale: float) -> None:  # fmt: skip
    """One launch of the config's kernel: planned once per tensors' key and replayed
    (kernels/flash_gluon_plan.py)."""
    flash_gluon_plan.launch(cfg, q, k, v, o, lse2, causal, qk_scale)
