"""Host side of the warp-specialised FP8 (e4m3) Gluon forward for sm_90 (issue 21, part 3).

`fp8_gluon_reason(q, k, v)` says why the Gluon fp8 kernel cannot run these inputs (None
when it can: sm_90, triton 3.6's Gluon, float8_e4m3fn, head_dim 64 or 128, TMA-aligned
q, k and o, V K-major); `fp8_gluon_forward(q, k, v, descales, causal, scale, config)`
runs it and returns (o, lse2) with the `tl` fp8 kernel's conventions (o bf16 in
(B, Hq, Sq, D), lse2 log2-domain (B, Hq, Sq) fp32, +inf for rows with no key). The
kernel is kernels/flash_gluon_fp8_kernels.py; flash_fp8.flash_attention_fp8 dispatches.

V's K-major storage (B, H, D, S) has a row stride of seqlen_k bytes: TMA needs a
multiple of 16. Where it is not, `fp8_gluon_reason` names it (the dispatch then runs the
`tl` fp8 kernel) and a forced Gluon launch copies V into storage whose rows are padded to
16 bytes (`padded_v`), once per call.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fa_bench.kernels import device_props, flash_gluon
from fa_bench.kernels.flash_gluon_fp8_table import TABLE_ENV, range_start, table_range, table_role

# padded_v, fp8_gluon_reason and HEAD_DIMS re-exported: their home was this module
from fa_bench.kernels.flash_gluon_fp8_tma import HEAD_DIMS as HEAD_DIMS
from fa_bench.kernels.flash_gluon_fp8_tma import _descriptor
from fa_bench.kernels.flash_gluon_fp8_tma import fp8_gluon_reason as fp8_gluon_reason
from fa_bench.kernels.flash_gluon_fp8_tma import padded_v as padded_v

if TYPE_CHECKING:
    import torch

# sm_90's shared memory per block (227 KB) less what the kernel keeps for mbarriers.
SMEM_BYTES = flash_gluon.SMEM_BYTES
_EMU = (0, 2, 4)


@dataclass(frozen=True)
class Fp8GluonConfig:
    """Launch of the fp8 "ws" kernel: two consumer warpgroups of 64 rows (a CTA covers
    128), a producer warp.

    block_n: keys per step (64, 128 or 256); stages: depth of the K/Vᵀ ring (1-4).
    pingpong: the two consumers take turns to issue their matmuls.
    emu: 0, or every emu-th (2: half, 4: a quarter) softmax exponential computed with
      a polynomial on the FMA pipes instead of the MUFU unit.
    producer_regs / consumer_regs: setmaxnreg of the producer's warpgroup and of consumer
      1 (consumer 0 gets the rest of the 64K: 240 for 24 / 240).
    p_smem: P reaches PV's wgmma through shared memory (two 64 × block_n buffers per
      consumer) instead of registers, whose conversion to the 8-bit A-operand layout costs
      warp shuffles and byte permutes.
    persistent: one CTA per SM looping over a fixed tile order (heaviest causal tiles
      first; kernels/flash_gluon_fp8_persist.py) instead of one CTA per tile.
    lazy_rescale: a row's maximum moves only when it grew by more than LAZY_TAU (0.75 in
      log2 units: P ≤ 430 in e4m3), and O is rescaled only in the key steps where some
      row's maximum moved (flash_gluon_fp8_parts).
    ahead: QKᵀ one key block ahead of the softmax (kernels/flash_gluon_fp8_ahead.py;
      P through shared memory, no ping-pong).
    consumers: 2, or 3 consumer warpgroups (a CTA covers 192 rows; not ahead; ping-pong
      then passes the turn round robin; consumer_regs at most 160: the 64K registers over
      four warpgroups).
    o_in_p: each consumer's bf16 O tile in its two P buffers (p_smem, not persistent; at
      head_dim ≤ block_n): the shared memory for a fourth ring stage with three consumers.
    own_end: (three consumers) each consumer stops at its own rows' last key block and only
      passes the CTA's later ones on (past its diagonal, all masked), not computing them.
    lean_mask: the causal mask with one compare per score (flash_gluon_fp8_kernels._mask_fp8).
    lpt: (persistent) each CTA's tiles from a host plan that hands the tile order out
      greedily to the least-loaded CTA (kernels/flash_gluon_fp8_sched.py) instead of the
      round robin, whose causal CTAs differ by up to 1.2 × in work.
    """

    block_n: int = 128
    stages: int = 4
    pingpong: bool = True
    emu: int = 0
    producer_regs: int = 24
    consumer_regs: int = 240
    block_m: int = 64
    p_smem: bool = False
    persistent: bool = False
    lazy_rescale: bool = False
    ahead: bool = False
    consumers: int = 2
    o_in_p: bool = False
    lpt: bool = False
    own_end: bool = False
    lean_mask: bool = False

    def __post_init__(self) -> None:
        for name, valid in (
            ("block_n", (64, 128, 256)),
            ("stages", (1, 2, 3, 4)),
            ("emu", _EMU),
            ("block_m", (64,)),
            ("consumers", (2, 3)),
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or value not in valid:
                raise ValueError(f"Fp8GluonConfig.{name}={value!r}: expected one of {valid}")
        for name in ("pingpong", "p_smem", "persistent", "lazy_rescale", "ahead", "o_in_p",
                     "lpt", "own_end", "lean_mask"):  # fmt: skip
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"Fp8GluonConfig.{name}={getattr(self, name)!r}: expected a bool")
        if self.ahead and (self.pingpong or not self.p_smem or self.persistent):
            raise ValueError(
                f"Fp8GluonConfig(ahead=True, pingpong={self.pingpong}, p_smem={self.p_smem}, "
                f"persistent={self.persistent}): QKᵀ ahead takes P through shared memory, "
                "without ping-pong, not persistent"
            )
        if self.consumers == 3 and (self.ahead or self.consumer_regs > 160):
            raise ValueError(
                f"Fp8GluonConfig(consumers=3, ahead={self.ahead}, consumer_regs="
                f"{self.consumer_regs}): three consumers run the plain key loop with at most 160 "
                "registers each"
            )
        if self.o_in_p and (self.persistent or not self.p_smem):
            raise ValueError(
                f"Fp8GluonConfig(o_in_p=True, persistent={self.persistent}, p_smem={self.p_smem}):"
                " the O tiles go into the P buffers of a non-persistent launch only"
            )
        if (self.own_end and self.consumers != 3) or (self.lean_mask and self.ahead):
            raise ValueError(
                f"Fp8GluonConfig(own_end={self.own_end}, lean_mask={self.lean_mask}, consumers="
                f"{self.consumers}, ahead={self.ahead}): own_end is the three-consumer key "
                "loop's, lean_mask not the ahead loop's"
            )
        if self.lpt and not self.persistent:
            raise ValueError(
                "Fp8GluonConfig(lpt=True, persistent=False): the tile plan is the persistent "
                "launch's"
            )
        flash_gluon.check_regs(self)

    def softmax_code(self) -> int:
        """The kernels' SOFTMAX constexpr: emu, + 16 for the lazy rescale, + 32 ahead, + 64
        own_end, + 128 lean_mask."""
        flags = (self.lazy_rescale, self.ahead, self.own_end, self.lean_mask)
        return self.emu + sum(bit for bit, on in zip((16, 32, 64, 128), flags, strict=True) if on)

    def smem_bytes(self, head_dim: int) -> int:
        """Two fp8 Q tiles, the fp8 K/Vᵀ ring, two bf16 O tiles (and two P buffers per
        consumer)."""
        rows = self.consumers * self.block_m
        p_bufs = 2 * rows * self.block_n if self.p_smem else 0
        ring = 2 * self.stages * self.block_n * head_dim
        o_tiles = max(0, rows * head_dim * 2 - p_bufs) if self.o_in_p else rows * head_dim * 2
        return rows * head_dim + ring + o_tiles + p_bufs

    def label(self) -> str:
        """A short name for tables and the backend label."""
        text = f"fp8-ws-m{self.block_m}-n{self.block_n}-s{self.stages}"
        text = text if self.pingpong else f"{text}-nopp"
        text = f"{text}-psmem" if self.p_smem else text
        text = f"{text}-emu{self.emu}" if self.emu else text
        text = f"{text}-lazy" if self.lazy_rescale else text
        text = f"{text}-ahead" if self.ahead else text
        text = f"{text}-c{self.consumers}" if self.consumers != 2 else text
        text = f"{text}-oinp" if self.o_in_p else text
        text = f"{text}-own" if self.own_end else text
        text = f"{text}-lmask" if self.lean_mask else text
        text = f"{text}-persist" if self.persistent else text
        return f"{text}-lpt" if self.lpt else text


# `cfg` with the deepest ring (up to 4 stages) that fits shared memory.
deepest = flash_gluon.deepest


# A developer override of the heuristic: "<role>" or "<non-causal role>,<causal role>" of
# candidate_configs (tools/gpu/fp8_final.sh sets it to the roles it measured best, for
# the `fa-bench run` that follows, before the heuristic below is updated to match).
ROLE_ENV = "FA_BENCH_FP8_GLUON_ROLE"


def _base_config(head_dim: int) -> Fp8GluonConfig:
    return deepest(Fp8GluonConfig(block_n=128, p_smem=True), head_dim)


def fp8_gluon_config(head_dim: int, causal: bool = False,
                     seq_q: int | None = None) -> Fp8GluonConfig:  # fmt: skip
    """The heuristic: the candidate_configs role flash_gluon_fp8_table.ROLE_TABLE gives
    (seq_q None: its first range); "ws" is 128-key steps, P through shared memory, the
    deepest ring that fits, ping-pong, every exp2 on the MUFU (measured in docs/kernel.md).
    $FA_BENCH_FP8_GLUON_ROLE overrides it (ValueError naming an unknown role)."""
    import os

    override = os.environ.get(ROLE_ENV, "").strip()
    if override:
        roles = override.split(",")
        role = roles[-1] if causal and len(roles) > 1 else roles[0]
        cands = candidate_configs(head_dim)
        if role not in cands:
            raise ValueError(f"${ROLE_ENV}={override!r}: {role!r} is not one of {sorted(cands)}")
        return cands[role]
    cands = dict(_candidates(head_dim))
    role = table_role(head_dim, causal, seq_q)
    if role not in cands:  # only an override can name one
        raise ValueError(f"${TABLE_ENV}: {role!r} is not one of {sorted(cands)}")
    return cands[role]


def candidate_configs(head_dim: int) -> dict[str, Fp8GluonConfig]:
    """What the GPU check times, by role, in order of interest: the heuristic's; its
    persistent form; a quarter or half of the exponentials emulated; P in registers
    (alone and with a quarter emulated); no ping-pong; a 3- and a 2-stage ring; 64-key
    steps.
    (256-key steps are not a candidate: S alone is then 128 fp32 registers per thread,
    and ptxas spilled 1.2-2.1 KB per thread at 240 registers, triton 3.6.0, 2026-11-30.)"""
    return dict(_candidates(head_dim))


@functools.cache
def _candidates(head_dim: int) -> tuple[tuple[str, Fp8GluonConfig], ...]:
    """candidate_configs' items, built once per head_dim (the role override reads them in
    every call)."""
    base = _base_config(head_dim)
    preg = deepest(dataclasses.replace(base, p_smem=False), head_dim)
    c3 = deepest(dataclasses.replace(base, consumers=3, consumer_regs=160), head_dim)
    c3x = dataclasses.replace(c3, own_end=True, lean_mask=True)
    return tuple(
        {
            "ws": base,
            "ws-persist": dataclasses.replace(base, persistent=True),
            "ws-emu4": dataclasses.replace(base, emu=4),
            "ws-preg": preg,
            "ws-emu2": dataclasses.replace(base, emu=2),
            "ws-lazy": dataclasses.replace(base, lazy_rescale=True),
            "ws-ahead": dataclasses.replace(base, ahead=True, pingpong=False),
            "ws-nopp": dataclasses.replace(base, pingpong=False),
            "ws-preg-emu4": dataclasses.replace(preg, emu=4),
            "ws-s3": dataclasses.replace(base, stages=3),
            "ws-s2": dataclasses.replace(base, stages=2),
            "ws-n64": deepest(dataclasses.replace(base, block_n=64), head_dim),
            "ws-c3": c3,
            "ws-c3-nopp": dataclasses.replace(c3, pingpong=False),
            "ws-c3-oinp": deepest(dataclasses.replace(c3, o_in_p=True), head_dim),
            "ws-c3-persist": dataclasses.replace(c3, persistent=True),
            "ws-c3-lpt": dataclasses.replace(c3, persistent=True, lpt=True),
            "ws-c3-lptx": dataclasses.replace(c3x, persistent=True, lpt=True),
            "ws-c3x": c3x,
        }.items()
    )


# Where the Gluon fp8 kernel is the automatic choice: (head_dim, causal) -> the shortest
# key length from which it measured faster than the `tl` fp8 kernel on the H200
# (tools/gpu/fp8_gluon_check.py, session 5 call C, TFLOP/s Gluon / tl: d128 2k 761 / 683,
# 4k 806 / 719, 16k 853 / 735; causal 2k 407 / 556 (slower), 4k 699 / 599, 16k 827 / 674;
# d64 4k 490 / 500 and causal 428 / 440 (slower), 16k 533 / 508 and causal 513 / 479;
# 1k: 412 / 635 and causal 200 / 447, slower).
_PAYS_FROM_SEQ_K: dict[tuple[int, bool], int] = {
    (128, False): 2048,
    (128, True): 4096,
    (64, False): 16384,
    (64, True): 16384,
}

# FlashConfig's gluon_* fields that name a bf16 Gluon launch the fp8 kernel has no form of
_UNSUPPORTED_FIELDS = ("gluon_variant", "gluon_warps", "gluon_consumers", "gluon_q_buffers")


def fp8_gluon_preferred(q: Any, k: Any, v: Any, causal: bool) -> bool:
    """Whether an automatic dispatch runs the Gluon fp8 kernel: it can (no V copy) and its
    head_dim, causality and key length are in the table above."""
    threshold = _PAYS_FROM_SEQ_K.get((q.shape[-1], bool(causal)))
    if threshold is None or k.shape[2] < threshold:
        return False
    return fp8_gluon_reason(q, k, v) is None


def from_fields(cfg: Any, head_dim: int, causal: bool, seq_q: int | None = None) -> Fp8GluonConfig:
    """The heuristic's launch with a FlashConfig's gluon_block_n / gluon_stages /
    gluon_pingpong / gluon_persistent laid over it (0 / None: the heuristic's; an unset
    ring depth: the deepest that fits). ValueError naming a field the fp8 kernel has no
    form of, or a launch that does not fit shared memory."""
    for name in _UNSUPPORTED_FIELDS:
        value = getattr(cfg, name)
        if value not in (0, "", None):
            raise ValueError(
                f"FlashConfig.{name}={value!r}: the Gluon fp8 kernel has one form (ws, two "
                "consumers, one Q buffer); it takes gluon_block_n, gluon_stages, "
                "gluon_pingpong, gluon_persistent"
            )
    base = fp8_gluon_config(head_dim, causal, seq_q)
    if cfg.gluon_block_n:
        base = deepest(dataclasses.replace(base, block_n=cfg.gluon_block_n), head_dim)
    if cfg.gluon_stages:
        base = dataclasses.replace(base, stages=cfg.gluon_stages)
    if cfg.gluon_pingpong is not None:
        base = dataclasses.replace(base, pingpong=cfg.gluon_pingpong)
    if cfg.gluon_persistent is not None:
        base = dataclasses.replace(base, persistent=cfg.gluon_persistent)
    if base.smem_bytes(head_dim) > SMEM_BYTES:
        raise ValueError(
            f"FlashConfig(gluon_block_n={cfg.gluon_block_n}, gluon_stages={cfg.gluon_stages}): "
            f"the fp8 launch {base.label()} needs {base.smem_bytes(head_dim)} bytes of shared "
            f"memory at head_dim {head_dim}, more than sm_90's {SMEM_BYTES}"
        )
    return base


def fp8_gluon_choice(q: Any, k: Any, v: Any, causal: bool, cfg: Any) -> Fp8GluonConfig | None:
    """The Gluon fp8 launch a flash_attention_fp8 call runs, or None for the `tl` fp8
    kernel: FlashConfig.forward "tl" never, "gluon" always (ValueError with the reason
    where it cannot), "auto" where `fp8_gluon_preferred`."""
    if cfg.forward == "tl":
        return None
    if cfg.forward == "gluon":
        reason = fp8_gluon_reason(q, k, v, allow_v_copy=True)
        if reason:
            raise ValueError(f"FlashConfig(forward='gluon') cannot run this fp8 call: {reason}")
    elif not fp8_gluon_preferred(q, k, v, causal):
        return None
    import os

    head_dim, causal = q.shape[-1], bool(causal)
    # the table's range (not seq_q) is the cache key: one entry per range
    index = table_range(head_dim, causal, q.shape[2])
    overrides = os.environ.get(ROLE_ENV, "") + "|" + os.environ.get(TABLE_ENV, "")
    return _resolved(cfg, head_dim, causal, overrides, index)


@functools.lru_cache(maxsize=256)
def _resolved(cfg: Any, head_dim: int, causal: bool, override: str, index: int) -> Fp8GluonConfig:
    """from_fields, cached per (FlashConfig, head_dim, causal, role and table overrides,
    table range):
    it runs in every timed call, where rebuilding it cost ~40 µs of host time (CPU
    profile)."""
    del override  # a key only: fp8_gluon_config reads it again
    return from_fields(cfg, head_dim, causal, range_start(head_dim, causal, index))


def fp8_gluon_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, descales: dict,
                      causal: bool, scale: float, config: Fp8GluonConfig | None = None,
                      checked: bool = False) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """(o, lse2) of validated fp8 inputs (flash_fp8._validate_fp8; v K-major) on sm_90.
    `checked`: the caller has had `fp8_gluon_choice` take them (no second check)."""
    import torch

    reason = None if checked else fp8_gluon_reason(q, k, v, allow_v_copy=True)
    if reason:
        raise ValueError(f"the Gluon fp8 forward cannot run these inputs: {reason}")
    head_dim = q.shape[-1]
    cfg = config if config is not None else fp8_gluon_config(head_dim, causal, q.shape[2])
    if not isinstance(cfg, Fp8GluonConfig):
        raise TypeError(f"config={cfg!r}: expected an Fp8GluonConfig")
    if cfg.smem_bytes(head_dim) > SMEM_BYTES or (cfg.o_in_p and cfg.block_n < head_dim):
        raise ValueError(
            f"config={cfg.label()} at head_dim={head_dim} needs {cfg.smem_bytes(head_dim)} "
            f"bytes of shared memory (sm_90 has {SMEM_BYTES}), and o_in_p block_n ≥ head_dim"
        )
    v = padded_v(v)
    batch, heads_q, seq_q, _ = q.shape
    heads_kv, seq_k = k.shape[1], k.shape[2]
    o = torch.empty(q.shape, device=q.device, dtype=torch.bfloat16)
    lse2 = torch.empty((batch, heads_q, seq_q), device=q.device, dtype=torch.float32)
    vt = v.transpose(-1, -2)  # (B, H, D, S) view of V's K-major storage, unit last stride
    descs = (
        _descriptor(q, [1, 1, cfg.block_m, head_dim]),
        _descriptor(k, [1, 1, cfg.block_n, head_dim]),
        _descriptor(vt, [1, 1, head_dim, cfg.block_n]),
        _descriptor(o, [1, 1, cfg.block_m, head_dim]),
    )
    args = (
        *descs,
        lse2,
        descales["q_descale"],
        descales["k_descale"],
        descales["v_descale"],
        heads_q,
        heads_q // heads_kv,
        seq_q,
        seq_k,
        float(scale) * 1.4426950408889634,
    )
    consts = dict(
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, HEAD_DIM=head_dim, STAGES=cfg.stages,
        CAUSAL=bool(causal), PINGPONG=cfg.pingpong, SOFTMAX=cfg.softmax_code(),
        PRODUCER_REGS=cfg.producer_regs, CONSUMER_REGS=cfg.consumer_regs, P_SMEM=cfg.p_smem,
        num_warps=4,
    )  # fmt: skip
    tiles = -(-seq_q // (cfg.consumers * cfg.block_m))
    if cfg.persistent:
        from fa_bench.kernels.flash_gluon_fp8_persist import _fwd_fp8_persistent
        from fa_bench.kernels.flash_gluon_fp8_sched import launch_plan
        from fa_bench.kernels.flash_gluon_fp8_table import persist_bh_group

        n_bh = batch * heads_q
        sms = device_props.sm_count(q.device)
        grid: tuple[int, ...] = (min(sms, tiles * n_bh),)
        group = persist_bh_group(n_bh, heads_q, heads_kv, seq_k, head_dim)
        plan = launch_plan(q.device, cfg, (n_bh, heads_q, seq_q, seq_k), grid[0], group, causal)
        _fwd_fp8_persistent[grid](*args, n_bh, group, plan, CONSUMERS=cfg.consumers,
                                  LPT=cfg.lpt, **consts)  # fmt: skip
    else:
        from fa_bench.kernels.flash_gluon_fp8_kernels import _fwd_fp8_ws

        _fwd_fp8_ws[(tiles, batch * heads_q)](*args, CONSUMERS=cfg.consumers,
                                              O_IN_P=cfg.o_in_p, **consts)  # fmt: skip
    return o, lse2
