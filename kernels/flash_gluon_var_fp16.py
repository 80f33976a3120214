"""The fp16 softcap's softmax without a row max: the sum check (issue 19, session 10).

Why: bf16 softcap launches subtract one fixed offset (FIXED_MAX, kernels/flash_gluon_var.py)
and so skip the row max and every rescale; fp16 cannot, since its P overflows past 65504
and loses precision below 2^-14, and the running max (or session 9's threshold form,
LAZY) costs an FMNMX per score and a reduction per row before any exp2 may start.

How: each row keeps an offset m (in log2 units, m · sc) that moves only when it must, and
the block's own row sum, which the softmax computes anyway, tells when:
- p = 2^(s · sc − m_eff) in fp32 with m_eff = max(m, sc − FLOOR): tanh bounds s · sc by
  sc, so p ≤ 2^FLOOR and a row sum of up to 128 of them stays finite in fp32;
- a row moves when its block sum exceeds P_SUM_MAX (every p of the row is at most its
  sum, so a row that stays has P ≤ 2^15, finite in fp16), when m_eff is not m (a new
  row, or a row below the floor), or when all it has summed is under L_MIN (P would sit
  in fp16's subnormals); a row with nothing visible yet never moves;
- a moving row takes m' = m_eff + log2(block sum), so its P (scaled by 2^(m_eff − m')
  before the rounding to fp16) is at most 1, and O and l are scaled by 2^(m − m').
Each warp votes; a warp none of whose 16 rows moved skips the per-row update, the scaling
of P and the rescale of O inside inline PTX (uniform branches), so once the offsets settle
a step costs per score TANH, FFMA, EX2, FADD and half an F2FP: the bf16 fixed offset's
count. The math is exact for any offsets (lse2 = m · sc + log2(l)); the host takes the
bit for fp16 softcaps without ALiBi (which unbounds the scores) while 2 · sc − FLOOR ≤ 126,
so the smallest p stays a normal fp32 number.
"""

# Gluon constexpr annotations inside the (untyped) jit functions are for triton, not mypy.
# mypy: disable-error-code="annotation-unchecked"

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from fa_bench.kernels.flash_gluon_var import _N, _PACK, _VOTE_ASM, row_operands, warp_mul
from fa_bench.kernels.gluon_exp2 import exp2_split, row_sum, softmax_emu, softmax_tree

# The VAR bit (flash_gluon_varhost mirrors it; a test checks), above LAZY_WARP (131072).
SUMCHECK = gl.constexpr(262144)
FLOOR = gl.constexpr(112.0)
P_SUM_MAX = gl.constexpr(32768.0)
L_MIN = gl.constexpr(2.0**-7)

# One row's update, operands $0-$3 the results (m', alpha_p, alpha_o, l'), $4 the warp's
# vote, $5 whether this row moves, $6 m_eff, $7 m, $8 the block sum, $9 l: a warp without a
# moving row branches past the MUFU work (lg2, two ex2) to the defaults (m, 1, 1, l + sum).
# The results are written last, from temporaries: an output may share its register with
# an input (no early clobber). In the key loop the PTX gives l and l' one register (the
# loop-carried value), so a first version that wrote l + sum into $3 before reading $9
# counted a moving row's block twice (session 10's GPU tests: rows that moved after their
# first block were off by a factor of 2 in l).
_ROW_ASM = gl.constexpr(
    "{ .reg .pred %skip, %mv; .reg .f32 %m, %ap, %ao, %l, %t, %a, %b, %c; "
    "mov.b32 %m, $7; mov.f32 %ap, 0f3F800000; mov.f32 %ao, 0f3F800000; add.f32 %l, $9, $8; "
    "setp.eq.s32 %skip, $4, 0; @%skip bra.uni SUM_DONE; "
    "setp.ne.s32 %mv, $5, 0; lg2.approx.f32 %t, $8; add.f32 %t, %t, $6; "
    "sub.f32 %a, $6, %t; ex2.approx.f32 %a, %a; sub.f32 %b, $7, %t; ex2.approx.f32 %b, %b; "
    "mul.f32 %c, $9, %b; fma.rn.f32 %c, $8, %a, %c; "
    "@%mv mov.f32 %m, %t; @%mv mov.f32 %ap, %a; @%mv mov.f32 %ao, %b; @%mv mov.f32 %l, %c; "
    "SUM_DONE: mov.b32 $0, %m; mov.b32 $1, %ap; mov.b32 $2, %ao; mov.b32 $3, %l; }"
)
_ROW_CON = gl.constexpr("=r,=r,=r,=r,r,r,r,r,r,r")

# with SUMCHECK, a development switch (flash_gluon_varhost.SOFTCAP_SUM_EARLY, off; session 10,
# not yet measured): P is rounded to fp16 right after its exp2, beside the row sum, and
# only the warps that voted a move round it again from P · alpha_p inside PTX, so the
# rounding leaves the check's dependency chain (sum, vote, row update, scaling).
SUM_EARLY = gl.constexpr(524288)


def _early_asm(n: int) -> str:
    """PTX over n elements (n even): outputs $0.. the n/2 f16x2 registers of P, tied to
    the speculative P's; inputs after them the fp32 p, their alphas and the flags (the
    first read). Where the flag is 0 the outputs stay the speculative P."""
    h = n // 2
    p0, a0, f0 = 2 * h, 2 * h + n, 2 * h + 2 * n
    lines = ["{ .reg .pred %keep; .reg .f32 %x, %y;", f"setp.eq.s32 %keep, ${f0}, 0;",
             "@%keep bra.uni EARLY_SKIP;"]  # fmt: skip
    for k in range(h):
        lo, hi = 2 * k, 2 * k + 1
        lines += [
            f"mul.f32 %x, ${p0 + lo}, ${a0 + lo}; mul.f32 %y, ${p0 + hi}, ${a0 + hi};",
            f"cvt.rn.f16x2.f32 ${k}, %y, %x;",  # element 2k in the low half
        ]
    return " ".join([*lines, "EARLY_SKIP: }"])


_EARLY_ASM = gl.constexpr(_early_asm(_N))
_EARLY_CON = gl.constexpr(",".join(["=r"] * (_N // 2) + [str(i) for i in range(_N // 2)]
                                   + ["r"] * (3 * _N)))  # fmt: skip


@gluon.jit
def _early_fix(p16, p, alpha, flag, layout: gl.constexpr):
    """SUM_EARLY: the speculative fp16 P, rounded again from p · alpha in the warps whose
    flag is set."""
    a, f = row_operands(alpha, flag, layout)
    return gl.inline_asm_elementwise(_EARLY_ASM, _EARLY_CON, [p16, p, a, f],
                                     dtype=gl.float16, is_pure=True, pack=_PACK)  # fmt: skip


@gluon.jit
def softmax_sumcheck(s, m_s, l_i, sc, dtype: gl.constexpr, p_layout: gl.constexpr,
                     SOFTMAX: gl.constexpr, EARLY: gl.constexpr = False):  # fmt: skip
    """One step: (m', l', P in dtype for PV, O's alpha, the warp's flag); m in log2 units
    (m · sc: −inf for a row that has seen no key). O · alpha is for the caller, after
    PV_{j−1}'s wait (`warp_mul` with the flag). EARLY: SUM_EARLY's speculative rounding."""
    s_layout: gl.constexpr = s.type.layout
    m_eff = gl.maximum(m_s, sc - FLOOR)
    # the exp2 split's emulation holds for these arguments too (at most FLOOR, far below
    # fp32's exponent limit): a launch's SOFTCAP_EMU share goes to the FMA pipes
    p = exp2_split(s * sc - gl.expand_dims(m_eff, 1), softmax_emu(SOFTMAX))
    if EARLY:
        p16 = p.to(dtype)  # inf where p > 65504: such a row moves, its warp rounds again
    blk = row_sum(p, l_i, softmax_tree(SOFTMAX))
    move = (blk > P_SUM_MAX) | (m_eff != m_s) | (l_i + blk < L_MIN)
    mv = gl.where(move & (blk > 0.0), 1, 0)
    flag = gl.inline_asm_elementwise(_VOTE_ASM, "=r,=r,r,r", [mv], dtype=gl.int32,
                                     is_pure=False, pack=2)  # fmt: skip
    m_new, a_p, a_o, l_new = gl.inline_asm_elementwise(
        _ROW_ASM, _ROW_CON, [flag, mv, m_eff, m_s, blk, l_i],
        dtype=(gl.float32, gl.float32, gl.float32, gl.float32), is_pure=True, pack=1,
    )  # fmt: skip
    if EARLY:
        p16 = _early_fix(p16, p, a_p, flag, s_layout)
    else:
        p16 = warp_mul(p, a_p, flag, s_layout).to(dtype)
    return m_new, l_new, gl.convert_layout(p16, p_layout), a_o, flag
