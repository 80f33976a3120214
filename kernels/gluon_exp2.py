"""exp2 for the Gluon softmax with part of the elements on the FMA pipes (issue 21), and
the softmax's row reductions as trees (the same head_dim 64 study).

Why: at head_dim 64 a consumer's two matmuls per 64 × 128 tile take about as long on the
tensor cores as its 8192 exponentials take on the MUFU unit (16 per clock per SM), so the
softmax, not the matmuls, sets the pace (docs/kernel.md, "The Gluon forward"). Computing
one exponential in `emu` on the FMA/ALU pipes instead (FlashAttention-4's idea, here in
PTX of our own) moves work off the MUFU onto pipes that have room.

The emulated 2^x (x ≤ 0 in the softmax: s·c − m·c), in fp32:
  1. t = max(x, −127): below that 2^x is 0 in the result anyway, and −inf (a masked
     score) would make the split NaN;
  2. j = round(t): adding 1.5·2²³ leaves the rounded integer in the low mantissa bits of
     `jm` (round to nearest even), subtracting it again gives j as a float;
  3. f = t − j ∈ [−0.5, 0.5];
  4. 2^f ≈ 1 + f·(C1 + f·(C2 + f·C3)) (Horner, three FMAs; a degree-3 fit of the relative
     error on [−0.5, 0.5] with the constant term exactly 1, so 2^0 = 1: max relative error
     1.02e-4, a fifth of fp16's half ulp (4.9e-4) and a twentieth of bf16's (3.9e-3));
  5. 2^j is put in by adding jm << 23 to the bits of 2^f (jm's bits shifted left by 23
     keep exactly j's two's complement in the exponent field): t = −127 gives exactly 0.
Eight instructions for one MUFU.EX2. P and the row sum l use the same fp32 value, so the
normalisation is consistent; only 2^f's relative error reaches O.

`exp2_split(x, EMU)` (Gluon): EMU = 0 is gl.exp2 (every element on the MUFU); EMU = 2, 4
or 8 computes every EMU-th element emulated and the others with ex2.approx.ftz.f32 (what
gl.exp2 emits for fp32), through one inline-asm block over EMU consecutive register
elements of the thread (register-local in any layout, the wgmma accumulator's included).
Which fraction pays depends on how busy the issue slots already are (tools/gpu/
gluon_d64.py measures 1/8, 1/4 and 1/2).

`row_max` / `row_sum` with TREE fold a row in halves inside each thread (reshape to a
trailing pair, split, combine), so the max that every exponential waits for is a depth-6
tree rather than a 32-long dependent chain per row (triton reduces a thread's elements in
sequence); the same instructions, shorter latency.

The PTX text is built here from the same constants the CPU tests read
(tests/test_gluon_exp2.py evaluates it instruction by instruction in numpy); the FP8
Gluon forward (kernels/flash_gluon_fp8_kernels.py) carries its own copy of the same
scheme, which it can import from here.
"""

# Gluon constexpr annotations inside the (untyped) jit functions are for triton, not mypy.
# mypy: disable-error-code="annotation-unchecked"

from __future__ import annotations

import struct

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

# The fractions exp2_split takes: every EMU-th element emulated (0: none).
EMU_CHOICES = (0, 2, 4, 8)
# 2^f ≈ 1 + C1 f + C2 f² + C3 f³ on [−0.5, 0.5], as fp32 bit patterns (fitted to the
# relative error with the constant term pinned to 1; max relative error 1.02e-4).
POLY_BITS = (0x3F317AFC, 0x3E7805DC, 0x3D615074)
CLAMP = -127.0
# 1.5 · 2²³: t + ROUNDER rounds t to an integer held in the low mantissa bits.
ROUNDER = 12582912.0
# The documented bound of the polynomial's relative error (the tests check it).
MAX_REL_ERR = 1.03e-4


def f32_bits(value: float) -> int:
    """The fp32 bit pattern of `value` (rounded to fp32)."""
    return int(struct.unpack("<I", struct.pack("<f", value))[0])


def f32_of_bits(bits: int) -> float:
    """The fp32 value of a 32-bit pattern."""
    return float(struct.unpack("<f", struct.pack("<I", bits & 0xFFFFFFFF))[0])


def _imm(bits: int) -> str:
    """A PTX fp32 immediate: 0f followed by the 8 hex digits of its bits."""
    return f"0f{bits:08X}"


def emulated_lines(dst: str, src: str) -> list[str]:
    """PTX for dst = 2^src on the FMA/ALU pipes (the module docstring's steps 1-5); uses
    the scratch registers %t, %j, %f, %p, %e declared by `split_asm`."""
    c1, c2, c3 = (_imm(b) for b in POLY_BITS)
    rounder = _imm(f32_bits(ROUNDER))
    return [
        f"max.ftz.f32 %t, {src}, {_imm(f32_bits(CLAMP))};",
        f"add.rn.f32 %j, %t, {rounder};",
        f"sub.rn.f32 %f, %j, {rounder};",
        "sub.rn.f32 %f, %t, %f;",
        f"fma.rn.f32 %p, %f, {c3}, {c2};",
        f"fma.rn.f32 %p, %p, %f, {c1};",
        f"fma.rn.f32 %p, %p, %f, {_imm(f32_bits(1.0))};",
        "shl.b32 %e, %j, 23;",
        f"add.s32 {dst}, %p, %e;",
    ]


def split_asm(emu: int) -> str:
    """The inline-asm block over `emu` packed elements: outputs $0..$(emu−1), inputs
    $emu..$(2·emu−1); the last element emulated, the others on the MUFU."""
    if emu not in EMU_CHOICES or emu == 0:
        raise ValueError(f"emu={emu!r}: expected one of {EMU_CHOICES[1:]}")
    lines = ["{", ".reg .b32 %t, %j, %f, %p, %e;"]
    lines += [f"ex2.approx.ftz.f32 ${i}, ${emu + i};" for i in range(emu - 1)]
    lines += emulated_lines(f"${emu - 1}", f"${2 * emu - 1}")
    lines.append("}")
    return " ".join(lines)


def split_constraints(emu: int) -> str:
    """The inline asm's constraint string: `emu` 32-bit outputs, then `emu` inputs."""
    return ",".join(["=r"] * emu + ["r"] * emu)


_ASM_2 = gl.constexpr(split_asm(2))
_ASM_4 = gl.constexpr(split_asm(4))
_ASM_8 = gl.constexpr(split_asm(8))
_CON_2 = gl.constexpr(split_constraints(2))
_CON_4 = gl.constexpr(split_constraints(4))
_CON_8 = gl.constexpr(split_constraints(8))


@gluon.jit
def exp2_split(x, EMU: gl.constexpr = 0):
    """2^x of an fp32 tensor, every EMU-th element (0: none) on the FMA pipes."""
    if EMU == 2:
        return gl.inline_asm_elementwise(_ASM_2, _CON_2, [x], dtype=gl.float32, is_pure=True,
                                         pack=2)  # fmt: skip
    elif EMU == 4:
        return gl.inline_asm_elementwise(_ASM_4, _CON_4, [x], dtype=gl.float32, is_pure=True,
                                         pack=4)  # fmt: skip
    elif EMU == 8:
        return gl.inline_asm_elementwise(_ASM_8, _CON_8, [x], dtype=gl.float32, is_pure=True,
                                         pack=8)  # fmt: skip
    elif EMU == -1:  # DIAG_NO_EXP2_BIT's timing diagnostic: no exponential (wrong results)
        return x
    else:
        # 0, or None where a kernel's EMU was left out of an AST-source compile (defaults
        # apply only to launches): everything on the MUFU
        return gl.exp2(x)


# --- the softmax's variant code, and its row reductions as trees ------------------------
#
# The kernels take one constexpr SOFTMAX (GluonConfig.softmax_code): the exp2 split's EMU
# in the low bits, TREE_BIT for tree-shaped row reductions. An AST-source compile that
# leaves it out (tools/gluon_compile.py) passes None: the plain softmax.
TREE_BIT = 16
# A timing diagnostic, never a launch of the API (GluonConfig has no field for it): P's
# exponentials replaced by their arguments (no MUFU at all; the results are wrong), so
# tools/gpu/gluon_d64.py can time the kernel without the exp2's cost.
DIAG_NO_EXP2_BIT = 32


@gluon.constexpr_function
def softmax_emu(code):
    """The exp2 split's EMU of a SOFTMAX code (None: 0; the diagnostic: -1)."""
    if code is not None and code & DIAG_NO_EXP2_BIT:
        return -1
    return 0 if code is None else code % TREE_BIT


@gluon.constexpr_function
def softmax_tree(code):
    """Whether a SOFTMAX code asks for tree-shaped row max and sum."""
    return code is not None and (code & TREE_BIT) != 0


@gluon.constexpr_function
def tree_levels(n):
    """Halvings of a row of n scores that stay inside a thread in the wgmma accumulator
    layout, after the first (adjacent column pairs): a thread holds the pairs of n / 8
    groups of 8 columns, so log2(n / 8); the last 4 columns' pairs are across a quad."""
    return max(int(n).bit_length() - 4, 0)


@gluon.jit
def _combine(a, b, IS_MAX: gl.constexpr):
    if IS_MAX:
        return gl.maximum(a, b)
    else:
        return a + b


@gluon.jit
def _tree(x, IS_MAX: gl.constexpr):
    """x [M, N] folded in halves to [M, 4] inside each thread: a dependency depth of
    log2(N) − 2 instead of the N / 4-long chain of a thread's sequential reduction (the
    exponentials wait for the max; the next step's l waits for the sum)."""
    M: gl.constexpr = x.shape[0]
    N: gl.constexpr = x.shape[1]
    a, b = x.reshape([M, N // 2, 2]).split()  # adjacent columns: a register pair
    y = _combine(a, b, IS_MAX)
    for i in gl.static_range(tree_levels(N)):
        # the top column bit of what is left: register-local, a permute makes it last
        hi, lo = y.reshape([M, 2, N // (4 << i)]).permute((0, 2, 1)).split()
        y = _combine(hi, lo, IS_MAX)
    return y


@gluon.jit
def row_max(s, like, TREE: gl.constexpr = False):
    """max over axis 1 in the layout of `like` (a row statistic); TREE: by halves."""
    if TREE:
        return gl.convert_layout(gl.max(_tree(s, True), axis=1), like.type.layout)
    else:
        return gl.max(s, axis=1)


@gluon.jit
def row_sum(p, like, TREE: gl.constexpr = False):
    """sum over axis 1 in the layout of `like`; TREE: by halves (another fp32 order)."""
    if TREE:
        return gl.convert_layout(gl.sum(_tree(p, False), axis=1), like.type.layout)
    else:
        return gl.sum(p, axis=1)
