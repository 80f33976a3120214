"""Host side of issue 19's variants in the Gluon backward (kernels/flash_gluon_bwd_var.py):
which variants it runs, the kernel's `VAR` bits and runtime values, and the part of a
plan's key they add. Imports neither triton nor torch's CUDA.

The Gluon backward takes a sliding window, ALiBi and the softcap, in any combination;
packed (varlen) batches keep the two-kernel `tl` backward, as does a softcap whose tanh
is not the hardware's fast one (flash_validate.FAST_TANH off: the forward then used
libdevice's, whose derivative the fast tanh would not match to the last bits).
"""

from __future__ import annotations

from typing import Any

WINDOW = 1
SOFTCAP = 2
ALIBI = 4
# a softcap's K scaled by scale / c in shared memory (flash_gluon_bwd_var._scale_k): one
# multiply per score less; fp16 only where scale / c >= 2^-10, so K · scale / c stays a
# normal fp16 number for |k| >= 2^-4 (the forward's SOFTCAP_QSCALE_FP16 rule)
K_SCALED = 8
_FP16_MIN_CAP_IN = 2.0**-10
_LOG2E = 1.4426950408889634
# the kernel's var values of a dense call (none of them read)
_DENSE = (0, 0, 0.0, 0.0, None, 0)


# Launches whose consumers spill past about half a kilobyte (tools/gpu/gluon_bwd_compile.py
# --var, triton 3.6.0, bf16): by (head_dim, the variant's bits without K_SCALED, causal).
# On the H200 (session 17 call 5, bf16 d64 8k, against the two-kernel backward) the ones
# measured ran slower: ALiBi non-causal (740 B) 0.706x, ALiBi with the softcap 0.910x
# causal (592 B) and 0.457x not (1764 B), while those up to 456 B ran 1.12-1.31x (softcap,
# ALiBi causal, dense); the rest here spill as much (748-2128 B) and keep the two-kernel
# backward unmeasured.
_SPILLS = {
    64: {(ALIBI, False), (WINDOW | ALIBI, False), (SOFTCAP | ALIBI, True),
         (SOFTCAP | ALIBI, False), (WINDOW | SOFTCAP, True), (WINDOW | SOFTCAP, False),
         (WINDOW | SOFTCAP | ALIBI, True), (WINDOW | SOFTCAP | ALIBI, False)},
    128: {(WINDOW | SOFTCAP | ALIBI, False)},
}  # fmt: skip
_NAMES = {WINDOW: "window", SOFTCAP: "softcap", ALIBI: "ALiBi"}


def variant_reason(variant: Any, head_dim: int, causal: bool) -> str | None:
    """Why the Gluon backward does not run this variant (None when it does, or for None):
    packed batches, a tanh other than the fast one, or a launch that spills (`_SPILLS`)."""
    if variant is None:
        return None
    if variant.varlen is not None:
        return "packed (varlen) batches: the Gluon backward has none"
    bits = variant_bits(variant) & ~K_SCALED
    if (bits, bool(causal)) in _SPILLS.get(head_dim, set()):
        kind = "+".join(name for bit, name in _NAMES.items() if bits & bit)
        return (
            f"{kind} at head_dim={head_dim} ({'' if causal else 'non-'}causal): the Gluon "
            "kernel spills over half a kilobyte there (where measured, it ran slower than "
            "the two-kernel backward)"
        )
    if variant.softcap > 0 and variant.tanh != 1:
        return (
            f"softcap with tanh={variant.tanh} (flash_validate.FAST_TANH / PACKED_TANH): "
            "the Gluon backward takes tanh.approx.f32 only"
        )
    return None


def k_scaled(variant: Any, scale: float, fp16: bool) -> bool:
    """Whether the kernel scales K by scale / c (K_SCALED) for this softcap."""
    if variant is None or variant.softcap <= 0:
        return False
    return not fp16 or scale / variant.softcap >= _FP16_MIN_CAP_IN


def variant_bits(variant: Any, scale: float = 1.0, fp16: bool = False) -> int:
    """The kernel's VAR constexpr (0 for None: the dense kernel); `fp16`: q's dtype is
    float16 (K_SCALED's rule)."""
    if variant is None:
        return 0
    return (
        (WINDOW if variant.window is not None else 0)
        | (SOFTCAP if variant.softcap > 0 else 0)
        | (ALIBI if variant.slopes is not None else 0)
        | (K_SCALED if k_scaled(variant, scale, fp16) else 0)
    )


def dq_scale(variant: Any, scale: float, fp16: bool) -> float:
    """What dQ's cast multiplies the workspace by: the scale, or c where K was scaled by
    scale / c (dQ = scale · dS K = c · dS K')."""
    return float(variant.softcap) if k_scaled(variant, scale, fp16) else float(scale)


def variant_args(variant: Any, scale: float) -> tuple:
    """The kernel's (win_left, win_right, cap_in, cap_out, slopes, slope_stride_b): the
    window's kernel bounds, scale / c and c · log2(e), the (batch, heads_q) slopes (a
    tensor, or a plan's stand-in for one) and their batch stride; unused values 0."""
    if variant is None:
        return _DENSE
    left, right = variant.window if variant.window is not None else (0, 0)
    cap = float(variant.softcap)
    cap_in, cap_out = (scale / cap, cap * _LOG2E) if cap > 0 else (0.0, 0.0)
    slopes = variant.slopes
    stride_b = slopes.stride()[0] if slopes is not None else 0
    return (int(left), int(right), float(cap_in), float(cap_out), slopes, int(stride_b))


def variant_key(variant: Any) -> tuple:
    """What a plan's key needs of the variant: its bounds, softcap and the slopes'
    address and layout (their values are read by the kernel on every launch)."""
    if variant is None:
        return ()
    from fa_bench.kernels.bound_launch import signature

    sig = None if variant.slopes is None else signature(variant.slopes)
    return (variant.window, float(variant.softcap), sig)


def stand_in(variant: Any, ptr: Any) -> Any:
    """The variant with its slopes replaced by `ptr(slopes)` (a plan's stand-in)."""
    import dataclasses

    if variant is None or variant.slopes is None:
        return variant
    return dataclasses.replace(variant, slopes=ptr(variant.slopes))
