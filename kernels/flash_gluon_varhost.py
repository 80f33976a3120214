"""Host side of the Gluon forward's variants (issue 19): window, ALiBi, softcap and
packed batches in the warp-specialised kernel (kernels/flash_gluon_var_ws.py).

`variant_reason(variant)` says why the Gluon kernel cannot run a variant (None when it
can: only a softcap whose tanh is not tanh.approx.f32 is refused), `variant_preferred`
whether an automatic dispatch should take it, `variant_config` the launch it runs and
`variant_forward` runs it, returning (o, lse2) with `flash_attention._forward`'s
conventions, so the `tl` backward takes them unchanged. Like kernels/flash_gluon.py, it
imports triton only when a kernel is launched.
"""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING, Any

from fa_bench.kernels.flash_gluon import (
    _PAYS_FROM_SEQ_K,
    SMEM_BYTES,
    GluonConfig,
    _deepest,
    gluon_reason,
)

if TYPE_CHECKING:
    import torch

    from fa_bench.kernels.flash_validate import Variant

_LOG2E = 1.4426950408889634
# The VAR constexpr's bits (flash_gluon_var.WINDOW, SOFTCAP, ALIBI, VARLEN, TANH_F16X2; a
# test checks).
_WINDOW, _SOFTCAP, _ALIBI, _VARLEN, _TANH_F16X2, _QSCALE = 1, 2, 4, 8, 16, 32
_ALIBI_COL = 4096  # flash_gluon_var.ALIBI_COL: above the softmax code's bits
_FIXED_MAX = 8192  # flash_gluon_var.FIXED_MAX
# flash_gluon_var.HEADROOM, and the largest softcap (c · log2(e) ≤ this) whose fixed
# offset keeps every p a normal number: 2 · c · log2(e) − HEADROOM ≤ 126.
_HEADROOM = 64.0
FIXED_MAX_SC = (126.0 + _HEADROOM) / 2
# A development switch (tools/gpu/variants_gluon.py times it): the softcap's tanh as
# tanh.approx.f16x2, two per MUFU op, instead of tanh.approx.f32. Not the default until
# measured faster and within the accuracy rule on the H200.
TANH_F16X2 = False
# A development switch: a softcap launch's exp2 split (GluonConfig.exp2_emu: every N-th
# exponential of P on the FMA pipes, kernels/gluon_exp2.py), for the MUFU unit the
# softcap's tanh also needs; 0 = the config's own.
SOFTCAP_EMU = 0
# A development switch: the tree-shaped row reductions (GluonConfig.tree_reduce,
# kernels/gluon_exp2.py) for every variant launch: the softcap's tanh and ALiBi's terms
# lengthen the chain the row max waits for.
TREE = False
# A development switch: a softcap launch scales Q by scale / c once per tile (rounded to
# the input dtype) instead of each score by it: one multiply per score less.
QSCALE = False
# A development switch: ALiBi's |i + o − j| per score even where every visible key is at
# or left of the diagonal (session 5's form), in place of the per-column bias
# (flash_gluon_var.ALIBI_COL); for timing the two side by side.
ALIBI_ABS = False
# A development switch: a softcap launch (bf16, no ALiBi, c·log2(e) ≤ FIXED_MAX_SC)
# subtracts a fixed offset in place of the running row max (flash_gluon_var.FIXED_MAX):
# no row max and no rescale of O per key block.
FIXED_MAX = False
# The default for a softcap launch that can take the fixed offset (`fixed_max`): FIXED_MAX
# and QSCALE together (session 6, call B on the H200: softcap 50, 8 × 8k, 535.2 TFLOP/s
# against 492.1 without them, 481.1 with FIXED_MAX alone; the checks passed with both).
# Off: the switches alone decide (the GPU tools' development rows turn it off).
SOFTCAP_FAST = True
# A development switch (session 8): an fp16 softcap launch scales Q by scale / c once per
# tile too (the QSCALE bit; bf16 takes it with the fixed offset), where scale / c >=
# QSCALE_FP16_MIN: Q·scale/c then stays a normal fp16 number for |q| >= 2^-4 (fp16's
# normals start at 2^-14), its rounding fp16's own. Not the default until measured faster
# and within the accuracy rule on the H200 (tools/gpu/variants_gluon_s8.py "c3q").
SOFTCAP_QSCALE_FP16 = False
QSCALE_FP16_MIN = 2.0**-10
# A development switch (session 7): a FIXED_MAX launch's row sums from the bf16 P in packed
# bf16x2 adds (flash_gluon_var_sum.SUM_BF16: 30 HADD2 in place of 60 FADD per block and
# thread in the SASS). Not the default until measured faster and within the accuracy rule.
SOFTCAP_SUM_BF16 = False
_SUM_BF16 = 16384  # flash_gluon_var_sum.SUM_BF16
# A development switch (session 7), with SOFTCAP_SUM_BF16: P rounded to bf16 on the integer
# ALU (flash_gluon_var_sum.P_ALU) in place of F2FP, in case F2FP shares the MUFU's pipe.
SOFTCAP_P_ALU = False
_P_ALU = 32768  # flash_gluon_var_sum.P_ALU
# A development switch (session 9): an fp16 softcap launch keeps each row's offset m until
# a key block's maximum exceeds it by more than flash_gluon_var.LAZY_TAU (8, log2 units: p
# <= 256 in fp16) and rescales O and l only in the steps where some row moved (the LAZY
# bit), where it now rescales O every key block (fp16 cannot take the fixed offset: P of
# 2^HEADROOM overflows it). Off until measured faster and within the accuracy rule on the
# H200 (tools/gpu/variants_gluon_s9.sh). With SOFTCAP_LAZY_WARP (LAZY_WARP) each warp
# decides for its 16 rows by a vote and skips O's rescale inside inline PTX, in place of
# the warpgroup's uniform `if` (a shared-memory reduction and two barriers per step).
# $FA_BENCH_SOFTCAP_LAZY at import (a GPU script's `fa-bench run`): "1" the switch, "warp"
# both.
LAZY_ENV = "FA_BENCH_SOFTCAP_LAZY"
SOFTCAP_LAZY_FP16 = os.environ.get(LAZY_ENV, "") not in ("", "0")
SOFTCAP_LAZY_WARP = os.environ.get(LAZY_ENV, "") == "warp"
_LAZY = 65536  # flash_gluon_var.LAZY
_LAZY_WARP = 131072  # flash_gluon_var.LAZY_WARP
# The default (session 10): an fp16 softcap launch (no ALiBi, c·log2(e) <= SUM_SC_MAX, 64-key
# blocks: C3_N64) keeps each row's offset until the block's own row sum says it must move
# (the SUMCHECK bit, kernels/flash_gluon_var_fp16.py): no row max at all, and O, l and P
# scaled only in the warps where a row moved. On the H200 (docs/kernel.md, session 10) it
# made C3_N64's fp16 softcap 50 5-6% faster (0.88-0.89 of the dense kernel against
# 0.83-0.84); on the two-consumer 128-key launch it measured 0.5-3% slower, so that launch
# keeps the running max. It takes precedence over LAZY. $FA_BENCH_SOFTCAP_SUM=0 at import
# turns it off.
SUM_ENV = "FA_BENCH_SOFTCAP_SUM"
SOFTCAP_SUM_FP16 = os.environ.get(SUM_ENV, "1") != "0"
SUM_BLOCK_N = 64
# A development switch (session 10, not yet measured): with the sum check, P is rounded to
# fp16 before the check and again only in the warps that moved (flash_gluon_var_fp16.
# SUM_EARLY), which takes the rounding off the check's dependency chain.
SOFTCAP_SUM_EARLY = False
_SUM_EARLY = 524288  # flash_gluon_var_fp16.SUM_EARLY
_SUMCHECK = 262144  # flash_gluon_var_fp16.SUMCHECK
# 2·sc − flash_gluon_var_fp16.FLOOR (112) <= 126: the smallest p stays a normal fp32 number
SUM_SC_MAX = 119.0


def fixed_max(variant: Variant, dtype: Any, switch: bool | None = None) -> bool:
    """Whether a softcap launch can take (`switch` None: takes, by FIXED_MAX or
    SOFTCAP_FAST) the fixed offset: tanh bounds the scores; bf16 only (P of up to
    2^HEADROOM overflows fp16); ALiBi unbounds them."""
    import torch

    if switch is None:
        switch = FIXED_MAX or SOFTCAP_FAST
    return (
        switch
        and variant.softcap > 0
        and variant.slopes is None
        and dtype == torch.bfloat16
        and variant.softcap * _LOG2E <= FIXED_MAX_SC
    )


def lazy_max(variant: Variant, dtype: Any, switch: bool | None = None) -> bool:
    """Whether a launch takes (`switch` None: by SOFTCAP_LAZY_FP16) the threshold rescale:
    an fp16 softcap (with a window, ALiBi or packed too: the rescale needs no bound on the
    scores), never beside the fixed offset (which has no m to move), nor where a packed
    batch meets ALiBi: at d128 ptxas spills there (softcap+alibi+varlen causal 4 bytes where
    the running max has none; all four 32-44 bytes against 28)."""
    if switch is None:
        switch = SOFTCAP_LAZY_FP16
    if not switch or variant.softcap <= 0:  # the default: no cost in a timed forward
        return False
    if variant.slopes is not None and variant.varlen is not None:
        return False
    import torch

    return dtype == torch.float16 and not fixed_max(variant, dtype, True)


def sum_check(
    variant: Variant, dtype: Any, switch: bool | None = None, block_n: int | None = None
) -> bool:
    """Whether a launch takes (`switch` None: by SOFTCAP_SUM_FP16) the sum check: an fp16
    softcap without ALiBi (whose bias unbounds the scores), c·log2(e) <= SUM_SC_MAX, on a
    launch of SUM_BLOCK_N keys per block (block_n None, unknown: no)."""
    if switch is None:
        switch = SOFTCAP_SUM_FP16
    if not switch or variant.softcap <= 0 or variant.slopes is not None:
        return False
    if block_n != SUM_BLOCK_N:
        return False
    import torch

    return dtype == torch.float16 and variant.softcap * _LOG2E <= SUM_SC_MAX


def alibi_columns(variant: Variant, causal: bool) -> bool:
    """Whether ALiBi takes the per-column bias: slopes on a causal call (every visible key
    j <= i + o; a window on it has the right bound 0, checked all the same)."""
    if variant.slopes is None or ALIBI_ABS or not causal:
        return False
    return variant.window is None or variant.window[1] <= 0


def _qscale_fp16(variant: Variant, dtype: Any, scale: float | None) -> bool:
    """Whether an fp16 softcap launch may fold scale / c into Q (SOFTCAP_QSCALE_FP16):
    fp16, and scale / c at least QSCALE_FP16_MIN (None: unknown, no)."""
    import torch

    if dtype != torch.float16 or variant.softcap <= 0 or scale is None:
        return False
    return scale / variant.softcap >= QSCALE_FP16_MIN


def variant_bits(
    variant: Variant,
    softmax: int = 0,
    causal: bool = False,
    dtype: Any = None,
    scale: float | None = None,
    block_n: int | None = None,
) -> int:
    """The variant kernel's VAR constexpr for this variant (0 never: a variant has one):
    the variant bits, from the sixth bit on the softmax's code (the launch's
    GluonConfig.softmax_code(): its exp2 split, + 16 for tree reductions; a softcap
    launch takes SOFTCAP_EMU's split when that is set), ALIBI_COL for a causal ALiBi
    (`alibi_columns`), FIXED_MAX for a bounded softcap (`fixed_max`, by q's dtype) and
    with it QSCALE under SOFTCAP_FAST, SUM_BF16 under SOFTCAP_SUM_BF16 and with that P_ALU
    under SOFTCAP_P_ALU; QSCALE for an fp16 softcap under SOFTCAP_QSCALE_FP16 (by the
    call's `scale`, `_qscale_fp16`); LAZY for an fp16 softcap under SOFTCAP_LAZY_FP16
    (`lazy_max`) and with it LAZY_WARP under SOFTCAP_LAZY_WARP; SUMCHECK in LAZY's place
    for an fp16 softcap under SOFTCAP_SUM_FP16 (`sum_check`, by the launch's block_n), and
    with it SUM_EARLY under SOFTCAP_SUM_EARLY."""
    if variant.softcap > 0 and SOFTCAP_EMU:
        softmax = softmax - softmax % 16 + SOFTCAP_EMU
    if TREE:
        softmax |= 16
    bits = softmax << 6
    bits |= _WINDOW if variant.window is not None else 0
    bits |= _SOFTCAP if variant.softcap > 0 else 0
    bits |= _TANH_F16X2 if variant.softcap > 0 and TANH_F16X2 else 0
    qscale = QSCALE or (SOFTCAP_FAST and fixed_max(variant, dtype, True))
    qscale = qscale or (SOFTCAP_QSCALE_FP16 and _qscale_fp16(variant, dtype, scale))
    bits |= _QSCALE if variant.softcap > 0 and qscale else 0
    bits |= _ALIBI if variant.slopes is not None else 0
    bits |= _ALIBI_COL if alibi_columns(variant, causal) else 0
    bits |= _FIXED_MAX if fixed_max(variant, dtype) else 0
    bits |= _SUM_BF16 if SOFTCAP_SUM_BF16 and bits & _FIXED_MAX else 0
    bits |= _P_ALU if SOFTCAP_P_ALU and bits & _SUM_BF16 else 0
    bits |= _SUMCHECK if sum_check(variant, dtype, block_n=block_n) else 0
    bits |= _SUM_EARLY if SOFTCAP_SUM_EARLY and bits & _SUMCHECK else 0
    bits |= _LAZY if lazy_max(variant, dtype) and not bits & _SUMCHECK else 0
    bits |= _LAZY_WARP if SOFTCAP_LAZY_WARP and bits & _LAZY else 0
    return bits | (_VARLEN if variant.varlen is not None else 0)


def variant_reason(variant: Variant) -> str | None:
    """Why the Gluon kernel cannot run this variant (None if it can)."""
    if variant.softcap > 0 and variant.tanh != 1:
        return (
            f"softcap with tanh mode {variant.tanh} (0 libdevice's, 2 bf16x2): the Gluon kernel "
            "takes tanh.approx.f32 only (flash_validate.FAST_TANH on, PACKED_TANH off)"
        )
    return None


def longest_keys(k: Any, variant: Variant) -> int:
    """The longest sequence's key count: a packed batch's max_seqlen_k, else k's length."""
    return variant.varlen.max_k if variant.varlen is not None else int(k.shape[2])


def variant_preferred(k: Any, head_dim: int, variant: Variant) -> bool:
    """Whether "auto" takes the Gluon kernel for a variant the kernel can run: the dense
    rule (it measured faster than `tl` from these key lengths at this head_dim) on the
    longest sequence."""
    threshold = _PAYS_FROM_SEQ_K.get(head_dim)
    return threshold is not None and longest_keys(k, variant) >= threshold


def variant_config(
    cfg: GluonConfig,
    head_dim: int,
    variant: Variant | None = None,
    dtype: Any = None,
    causal: bool = False,
    pinned: bool = False,
) -> GluonConfig:
    """The launch a variant runs: the dense choice when it is the non-persistent "ws"
    kernel; a persistent one without persistence (one Q buffer, the deepest ring that
    then fits); the "pipelined" kernel (causal d64) becomes the plain "ws" launch (128-key
    steps, 64 at d256, the deepest ring): the variants exist in the non-persistent "ws"
    kernel only. Three consumers (non-causal d64's heuristic since session 5's call C)
    also become that plain launch: the variants were built and measured with two.
    Given the call's `variant`, q's `dtype` and `causal`, and unless the caller `pinned`
    the launch (a FlashConfig gluon_* field set), `three_consumers` may take the
    three-consumer 64-key launch (C3_N64) in place of that plain one."""
    if cfg.variant != "ws" or cfg.consumers != 2:
        cfg = _deepest(GluonConfig(block_n=64 if head_dim > 128 else 128), head_dim)
    elif cfg.persistent:
        cfg = _deepest(dataclasses.replace(cfg, persistent=False, q_buffers=1), head_dim)
    if variant is not None and not pinned and three_consumers(variant, dtype, head_dim, causal):
        return C3_N64
    return cfg


# Session 8: three consumer warpgroups over 64-key blocks (192 query rows per CTA, a
# 4-deep K/V ring, no ping-pong, 160 registers each; ptxas: no spills for any VAR
# combination it serves, tools/gpu/variants_gluon_s8_sass.py). Session 8's call 0
# (do_bench, softcap 50 causal bf16 8 x 8k): 559.7 TFLOP/s = 0.992 x dense, against the
# two-consumer 128-key launch's 0.904 (527.4): the softcap's tanh shares the MUFU unit
# with exp2, and a third warpgroup's softmax keeps it busy while the others' matmuls run.
C3_N64 = GluonConfig(block_n=64, stages=4, consumers=3, pingpong=False, consumer_regs=160)
# Which variant kinds (`variant_kind`) take C3_N64, by q's dtype: head_dim 128, causal
# only (where it was measured). Set from the H200's A/B (tools/gpu/variants_gluon_s8.py);
# a kind not listed keeps the two-consumer launch.
C3_KINDS: dict[str, frozenset[str]] = {
    "bf16": frozenset({"softcap"}),
    "fp16": frozenset({"softcap"}),
}
C3_HEAD_DIMS = (128,)
# Kinds C3_N64 never serves, whatever C3_KINDS lists: ptxas spills their consumers at 160
# registers (triton 3.6, sm_90: window+alibi+varlen 4/12 bytes, all four 36/52 causal and
# 108/124 not, in either dtype; tools/gpu/variants_gluon_s8_sass.py).
C3_SPILLS = frozenset({"window+alibi+varlen", "window+softcap+alibi+varlen"})
# q's dtype -> its C3_KINDS key, by the dtype object (str(dtype) costs ~0.3 µs per call in
# a timed forward); filled on first use, torch being imported lazily here
_DTYPE_NAMES: dict[Any, str] = {}


def variant_kind(variant: Variant) -> str:
    """The variant's features joined by "+" in a fixed order: window, softcap, alibi,
    varlen (e.g. "window+softcap"); a causal call without a window has none of "window"."""
    parts = (
        ("window", variant.window is not None),
        ("softcap", variant.softcap > 0),
        ("alibi", variant.slopes is not None),
        ("varlen", variant.varlen is not None),
    )
    return "+".join(name for name, on in parts if on)


def three_consumers(variant: Variant, dtype: Any, head_dim: int, causal: bool) -> bool:
    """Whether this call takes C3_N64: causal, a head_dim in C3_HEAD_DIMS, and its kind
    listed in C3_KINDS for q's dtype (bf16 / fp16) and not in C3_SPILLS."""
    if not causal or head_dim not in C3_HEAD_DIMS:
        return False
    if not _DTYPE_NAMES:
        import torch

        _DTYPE_NAMES.update({torch.bfloat16: "bf16", torch.float16: "fp16"})
    kinds = C3_KINDS.get(_DTYPE_NAMES.get(dtype, ""), frozenset())
    kind = variant_kind(variant)
    return kind in kinds and kind not in C3_SPILLS


def _kernel_args(variant: Variant, scale: float, o: torch.Tensor) -> tuple[float, dict]:
    """(sc, the variant arguments): sc is the softmax's log2 factor (see
    flash_gluon_var's docstring); arguments of a variant that is off are None."""
    sc = variant.softcap * _LOG2E if variant.softcap > 0 else scale * _LOG2E
    args: dict = dict.fromkeys(
        ("win_left", "win_right", "cap_mul", "slopes_ptr", "stride_slope_b", "alibi_mul",
         "cu_q", "cu_k", "o_ptr", "stride_os", "stride_oh")
    )  # fmt: skip
    if variant.window is not None:
        args.update(win_left=variant.window[0], win_right=variant.window[1])
    if variant.softcap > 0:
        args["cap_mul"] = scale / variant.softcap
    if variant.slopes is not None:
        slopes = variant.slopes
        args.update(slopes_ptr=slopes, stride_slope_b=slopes.stride(0), alibi_mul=_LOG2E / sc)
    if variant.varlen is not None:
        args.update(cu_q=variant.varlen.cu_q, cu_k=variant.varlen.cu_k, o_ptr=o,
                    stride_os=o.stride(2), stride_oh=o.stride(1))  # fmt: skip
    return sc, args


def variant_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool,
    scale: float,
    cfg: GluonConfig,
    variant: Variant,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(o, lse2) of a variant call on the Gluon kernel; a packed batch comes as (1, H, T,
    D) views with `variant.varlen` (lse2 then (1, H, T)). ValueError naming what the
    kernel cannot run."""
    import torch

    from fa_bench.kernels import flash_gluon_var_ws
    from fa_bench.kernels.flash_gluon import _descriptor

    reason = gluon_reason(q, k, v, causal) or variant_reason(variant)
    if reason:
        raise ValueError(f"variant_forward cannot run these inputs: {reason}")
    if not isinstance(cfg, GluonConfig):
        raise TypeError(f"cfg={cfg!r}: expected a GluonConfig")
    if cfg.smem_bytes(q.shape[3]) > SMEM_BYTES:
        raise ValueError(
            f"cfg={cfg.label()} at head_dim={q.shape[3]} needs more shared memory than "
            f"sm_90's {SMEM_BYTES} bytes"
        )
    if cfg.variant != "ws" or cfg.persistent:
        raise ValueError(
            f"config={cfg.label()}: the variants run in the non-persistent 'ws' kernel "
            "(variant_config gives its launch)"
        )
    batch, heads_q, seq_q, head_dim = q.shape
    o = torch.empty_like(q)  # keeps q's layout (a packed (T, H, D) view's too)
    lse2 = torch.empty((batch, heads_q, seq_q), device=q.device, dtype=torch.float32)
    sc, extra = _kernel_args(variant, scale, o)
    packed = variant.varlen
    o_desc = _descriptor(o, cfg.block_m)
    rows = cfg.rows_per_cta
    if packed is not None:  # query tiles on the slow axis: every sequence's heaviest first
        grid = (packed.batch * heads_q, -(-packed.max_q // rows))
    else:
        grid = (-(-seq_q // rows), batch * heads_q)
    flash_gluon_var_ws._fwd_ws_var[grid](
        _descriptor(q, cfg.block_m), _descriptor(k, cfg.block_n), _descriptor(v, cfg.block_n),
        o_desc, lse2, heads_q, heads_q // k.shape[1], seq_q, k.shape[2], sc, **extra,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, HEAD_DIM=head_dim, STAGES=cfg.stages,
        CAUSAL=causal, NUM_WARPS=4, PINGPONG=cfg.pingpong, PRODUCER_REGS=cfg.producer_regs,
        CONSUMER_REGS=cfg.consumer_regs, CONSUMERS=cfg.consumers,
        VAR=variant_bits(variant, cfg.softmax_code(), causal, q.dtype, scale, cfg.block_n),
        num_warps=4,
    )  # fmt: skip
    return o, lse2
