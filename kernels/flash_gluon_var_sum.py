"""The softcap's row sums from the bf16 P in packed bf16x2 adds (issue 19, session 7).

Why: under FIXED_MAX (kernels/flash_gluon_var.py) a softcap score costs TANH, FFMA, EX2,
FADD and half an F2FP; the FADD is the row sum l, 31 dependent fp32 adds per row and
thread of a 64 × 128 tile. P is rounded to bf16 and packed in pairs (F2FP) for the PV
matmul anyway, so `row_sum_bf16x2` adds those packed registers, two columns per
instruction (`add.rn.bf16x2`, one HFMA2 on sm_90), halving the columns a thread holds
`levels` times (register-local, as gluon_exp2._tree), then widens what is left to fp32 for
the last in-thread pair and the cross-thread sum: 15 packed adds and a few conversions
per row where the fp32 sum takes 31 FADDs.

Precision: each level rounds a partial sum of 2, 4, 8, 16 bf16 values to bf16 (relative
error ≤ 2^-9 per level, unbiased round-to-nearest), then the block's sums add in fp32
across the key blocks. The sum is of exactly the bf16 P that multiplies V, so l and O
agree on P (the fp32 sum of the unrounded p differs from that P by as much: in a CPU
emulation of 8192-key rows both are within 0.4% of the exact sum of the bf16 P); the
accuracy rule decides (GPU tests). Fewer levels (fewer bf16 roundings, the rest in fp32)
compiled to more instructions than the fp32 sum: the halves get repacked.

When: the sums of block j's P are taken in step j + 1, right after PV_j is issued
(`lazy_sum`), in the time the consumer waits for S_{j+1}: the wgmma only reads P's
registers. Summed in step j, the packed P is needed before PV_{j−1}'s wait, and ptxas kept a
second copy of it (32 register moves per block, more instructions than it saved).
"""

# Gluon constexpr annotations inside the (untyped) jit functions are for triton, not mypy.
# mypy: disable-error-code="annotation-unchecked"

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from fa_bench.kernels.gluon_exp2 import tree_levels

# The VAR bit (flash_gluon_varhost mirrors it; a test checks): a FIXED_MAX launch's row sums
# from the bf16 P in packed adds, every register-local level (tree_levels: 4 at 128 keys).
# Above FIXED_MAX (8192).
SUM_BF16 = gl.constexpr(16384)


# With SUM_BF16: P rounded to bf16 by integer ops (IADD 0x8000 on the fp32 bits, then the
# high halves packed by PRMT: round half away from zero in magnitude, where F2FP rounds to
# nearest even). Why: if F2FP issues on the MUFU's pipe (tools/gpu/variants_gluon_s7.py
# mufu measures it), the softcap's 0.5 F2FP per score competes with its two MUFU ops; the
# ALU pipe has room (SASS: 32 F2FP become 64 VIADD + 32 PRMT per block and thread). The
# packed sums add the same P, so l and O agree on its rounding. (Truncating, PRMT alone,
# compiled to more instructions: the halves went through extra moves.)
P_ALU = gl.constexpr(32768)


@gluon.constexpr_function
def sum_levels(var, n):
    """How many packed bf16 halvings a launch's VAR asks for at n keys per block (0: the
    fp32 sum)."""
    return tree_levels(n) if var is not None and var & 16384 else 0


@gluon.jit
def _add_bf16x2(a, b):
    """a + b elementwise in bf16, two elements per instruction (add.rn.bf16x2)."""
    return gl.inline_asm_elementwise(
        "add.rn.bf16x2 $0, $1, $2;", "=r,r,r", [a, b], dtype=gl.bfloat16, is_pure=True, pack=2
    )


@gluon.jit
def row_sum_bf16x2(pb, like, LEVELS: gl.constexpr):
    """The row sums of pb ([M, N] bf16, the wgmma accumulator layout) in the layout of
    `like` (a row statistic): LEVELS halvings by the top column bit in packed bf16 adds,
    the rest in fp32."""
    M: gl.constexpr = pb.shape[0]
    N: gl.constexpr = pb.shape[1]
    y = pb
    for i in gl.static_range(LEVELS):
        # the top column bit of what is left: register-local, a permute makes it last
        hi, lo = y.reshape([M, 2, N >> (i + 1)]).permute((0, 2, 1)).split()
        y = _add_bf16x2(hi, lo)
    return gl.convert_layout(gl.sum(y.to(gl.float32), axis=1), like.type.layout)


@gluon.jit
def lazy_sum(p, l_i, s_layout: gl.constexpr, LEVELS: gl.constexpr):
    """l + the row sums of a block's P (bf16, PV's register operand in p_layout), taken
    once that PV is issued (see the module docstring)."""
    return l_i + row_sum_bf16x2(gl.convert_layout(p, s_layout), l_i, LEVELS)


@gluon.jit
def p_bf16(p, VAR: gl.constexpr):
    """fp32 P as bf16: F2FP (cvt.rn), or P_ALU's integer rounding (the high 16 bits of
    each fp32 after adding 0x8000)."""
    if VAR & 32768:
        bits = p.to(gl.uint32, bitcast=True) + 0x8000
        return (bits >> 16).to(gl.uint16).to(gl.bfloat16, bitcast=True)
    else:
        return p.to(gl.bfloat16)
