"""The fp16 softcap's sum check (issue 19, session 10): the SUMCHECK bit of the variant
kernel (kernels/flash_gluon_var_fp16.py) and its switch (flash_gluon_varhost.SOFTCAP_SUM_FP16,
the default for 64-key launches since session 10's H200 run; $FA_BENCH_SOFTCAP_SUM=0 at
import turns it off), which launches take it, and the step's math emulated on the CPU
against the exact softmax. `slow`: the bit compiles for sm_90 with triton 3.6
(GLUON_TRITON_PATH or /tmp/tri36) without spills and without a row max in the key loop.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from gluon_bwd_helpers import TRI36
from test_flash_gluon_var_s9 import (
    _lazy_forward,
    _v,
    assert_as_exact_as_the_running_max,
    softcapped_rows,
)

from fa_bench.kernels import flash_gluon_var as kernel
from fa_bench.kernels import flash_gluon_var_fp16 as fp16k
from fa_bench.kernels import flash_gluon_var_sum as sumk
from fa_bench.kernels import flash_gluon_varhost as vh

ROOT = Path(__file__).resolve().parent.parent
BF16, FP16 = torch.bfloat16, torch.float16
SCALE = 128**-0.5


def test_the_bits_agree_with_the_kernel_and_are_clear_of_the_others():
    assert vh._SUM_EARLY == int(fp16k.SUM_EARLY.value) == 2 * int(fp16k.SUMCHECK.value)
    bit = int(fp16k.SUMCHECK.value)
    assert vh._SUMCHECK == bit
    others = [kernel.WINDOW, kernel.SOFTCAP, kernel.ALIBI, kernel.VARLEN, kernel.TANH_F16X2,
              kernel.QSCALE, kernel.ALIBI_COL, kernel.FIXED_MAX, kernel.LAZY, kernel.LAZY_WARP,
              sumk.SUM_BF16, sumk.P_ALU]  # fmt: skip
    assert all(bit & int(o.value) == 0 and bit > int(o.value) for o in others)
    assert bit & (31 << 6) == 0  # the softmax code's bits


def test_the_default_takes_fp16_softcaps_without_alibi_on_64_key_launches(monkeypatch):
    assert vh.SOFTCAP_SUM_FP16  # the default since session 10's H200 run
    n64 = vh.C3_N64.block_n
    assert n64 == vh.SUM_BLOCK_N
    for v in (_v(), _v(window=(4096, 0)), _v(varlen=True), _v(window=(8, 8), varlen=True)):
        bits = vh.variant_bits(v, 0, True, FP16, SCALE, n64)
        assert bits & vh._SUMCHECK and not bits & vh._LAZY, v
        assert not vh.variant_bits(v, 0, True, FP16, SCALE, 128) & vh._SUMCHECK, v
        assert not vh.variant_bits(v, 0, True, FP16, SCALE) & vh._SUMCHECK, v  # unknown
    assert not vh.variant_bits(_v(), 0, True, BF16, SCALE, n64) & vh._SUMCHECK  # fixed offset
    assert not vh.variant_bits(_v(alibi=True), 0, True, FP16, SCALE, n64) & vh._SUMCHECK
    assert not vh.variant_bits(_v(softcap=0.0, window=(8, 0)), 0, True, FP16, None, n64) & (
        vh._SUMCHECK
    )
    # the floor keeps the smallest p a normal fp32 number up to c · log2(e) = SUM_SC_MAX
    c_max = vh.SUM_SC_MAX / math.log2(math.e)
    assert vh.sum_check(_v(softcap=c_max * 0.999), FP16, block_n=n64)
    assert not vh.sum_check(_v(softcap=c_max * 1.001), FP16, block_n=n64)
    assert 2 * vh.SUM_SC_MAX - float(fp16k.FLOOR.value) <= 126
    monkeypatch.setattr(vh, "SOFTCAP_SUM_FP16", False)
    assert not vh.variant_bits(_v(), 0, True, FP16, SCALE, n64) & vh._SUMCHECK


def test_the_early_rounding_is_off_and_rides_on_the_sum_check_only(monkeypatch):
    n64 = vh.SUM_BLOCK_N
    assert not vh.SOFTCAP_SUM_EARLY
    assert not vh.variant_bits(_v(), 0, True, FP16, SCALE, n64) & vh._SUM_EARLY
    monkeypatch.setattr(vh, "SOFTCAP_SUM_EARLY", True)
    bits = vh.variant_bits(_v(), 0, True, FP16, SCALE, n64)
    assert bits & vh._SUM_EARLY and bits & vh._SUMCHECK
    for args in ((_v(), 0, True, FP16, SCALE, 128), (_v(), 0, True, BF16, SCALE, n64),
                 (_v(alibi=True), 0, True, FP16, SCALE, n64)):  # fmt: skip
        assert not vh.variant_bits(*args) & vh._SUM_EARLY, args


def test_the_early_ptx_rounds_again_only_behind_the_warp_branch():
    """Operands for 16 elements: outputs $0-$7 (f16x2) tied to the speculative P's
    registers ($8-$15), the fp32 p $16-$31, the alphas $32-$47, the flags from $48; each
    output packs element 2k low, 2k + 1 high (cvt.rn.f16x2.f32 d, hi, lo)."""
    asm, con = fp16k._EARLY_ASM.value, fp16k._EARLY_CON.value.split(",")
    assert con[:8] == ["=r"] * 8 and con[8:16] == [str(i) for i in range(8)]
    assert con[16:] == ["r"] * 48
    head, body = asm.split("@%keep bra.uni EARLY_SKIP;")
    assert "setp.eq.s32 %keep, $48, 0;" in head and body.strip().endswith("EARLY_SKIP: }")
    for k in range(8):
        lo, hi = 2 * k, 2 * k + 1
        assert f"mul.f32 %x, ${16 + lo}, ${32 + lo};" in body
        assert f"mul.f32 %y, ${16 + hi}, ${32 + hi};" in body
        assert f"cvt.rn.f16x2.f32 ${k}, %y, %x;" in body
    assert body.count("cvt.rn.f16x2.f32") == 8 and "$8," not in body  # tied inputs unread


def test_the_sum_check_takes_precedence_over_the_threshold_rescale(monkeypatch):
    monkeypatch.setattr(vh, "SOFTCAP_SUM_FP16", True)
    monkeypatch.setattr(vh, "SOFTCAP_LAZY_FP16", True)
    monkeypatch.setattr(vh, "SOFTCAP_LAZY_WARP", True)
    bits = vh.variant_bits(_v(), 0, True, FP16, SCALE, vh.SUM_BLOCK_N)
    assert bits & vh._SUMCHECK and not bits & (vh._LAZY | vh._LAZY_WARP)
    bits = vh.variant_bits(_v(alibi=True), 0, True, FP16, SCALE, vh.SUM_BLOCK_N)  # ALiBi: LAZY
    assert bits & vh._LAZY and not bits & vh._SUMCHECK


@pytest.mark.parametrize("value, on", [(None, True), ("", True), ("0", False), ("1", True)])
def test_the_environment_turns_the_default_off_at_import(value, on):
    env = dict(os.environ)
    env.pop(vh.SUM_ENV, None)
    if value is not None:
        env[vh.SUM_ENV] = value
    code = "from fa_bench.kernels import flash_gluon_varhost as v; print(v.SOFTCAP_SUM_FP16)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str(on)]


def _sum_forward(s: torch.Tensor, v: torch.Tensor, sc: float, block: int):
    """softmax_sumcheck's steps in torch over rows of softcapped scores s (units of sc, −inf
    masked), P rounded to fp16 as PV takes it: (o, lse2, the largest P before the rounding,
    the row moves after the first block)."""
    floor, p_sum_max = float(fp16k.FLOOR.value), float(fp16k.P_SUM_MAX.value)
    l_min = float(fp16k.L_MIN.value)
    rows = s.shape[0]
    m = torch.full((rows,), -math.inf)  # log2 units
    l = torch.zeros(rows)  # noqa: E741
    acc = torch.zeros(rows, v.shape[1])
    p_max, moves = 0.0, 0
    for j0 in range(0, s.shape[1], block):
        sb, vb = s[:, j0 : j0 + block], v[j0 : j0 + block]
        m_eff = torch.clamp(m, min=sc - floor)
        p = torch.exp2(sb * sc - m_eff[:, None])
        assert torch.isfinite(p).all()
        blk = p.sum(dim=1)
        move = ((blk > p_sum_max) | (m_eff != m) | (l + blk < l_min)) & (blk > 0)
        m_new = torch.where(move, m_eff + torch.log2(blk), m)
        a_p = torch.where(move, torch.exp2(m_eff - m_new), 1.0)
        a_o = torch.where(move, torch.exp2(m - m_new), 1.0)
        l = torch.where(move, l * a_o + blk * a_p, l + blk)  # noqa: E741
        p = p * a_p[:, None]
        p16 = p.to(FP16)
        assert torch.isfinite(p16).all()
        p_max = max(p_max, float(p.max()))
        acc = acc * a_o[:, None] + p16.float() @ vb
        moves += int(move.sum()) if j0 else 0
        m = m_new
    empty = l == 0
    o = acc / torch.where(empty, 1.0, l)[:, None]
    lse2 = torch.where(empty, math.inf, m + torch.log2(torch.where(empty, 1.0, l)))
    return o, lse2, p_max, moves


PATTERNS = ["random", "late", "ramp", "masked start", "low then late", "all low"]


@pytest.mark.parametrize("pattern", PATTERNS)
def test_the_sum_check_is_exact_math_whatever_the_data(pattern):
    """The emulated steps against the exact softmax (float64): o and lse2 as close as the
    running max's, P never above P_SUM_MAX (fp16 finite), rows below the floor exact too,
    rows without keys empty, and random rows settle after their first block."""
    s, v, sc = softcapped_rows(pattern, seed=11)
    rows, n = s.shape
    o_run, _lse, _p, _ = _lazy_forward(s, v, sc, 64, None)
    o_sum, lse_sum, p_sum, moves = _sum_forward(s, v, sc, 64)
    assert_as_exact_as_the_running_max(o_sum, lse_sum, o_run, s, v, sc)
    assert p_sum <= float(fp16k.P_SUM_MAX.value)
    if pattern == "random":
        assert moves == 0, moves
    if pattern == "all low":  # below the floor every block moves: slow, but exact
        assert moves == rows * (n // 64 - 1), moves


def test_the_row_ptx_keeps_the_defaults_and_branches_per_warp():
    asm = fp16k._ROW_ASM.value
    assert asm.count("bra.uni") == 1 and asm.count("@%mv") == 4
    assert asm.index("add.f32 %l, $9, $8") < asm.index("bra.uni")  # l + sum where none moves
    # the results written after every input is read: in the key loop l and l' share a
    # register (the PTX ties the loop-carried value), so an early write corrupts l
    body, tail = asm.split("SUM_DONE:")
    assert not any(f"${i}," in body for i in range(4))
    assert all(f"mov.b32 ${i}," in tail for i in range(4))
    assert fp16k._ROW_CON.value.count("=r") == 4 and fp16k._ROW_CON.value.count(",r") == 6


@pytest.mark.slow
@pytest.mark.skipif(
    not os.path.exists(f"{TRI36}/triton/__init__.py"), reason="no triton 3.6 installed aside"
)
def test_the_bit_compiles_for_sm90_without_spills_or_a_row_max(tmp_path):
    """C3_N64 (causal d128; with SUM_EARLY too) and the two-consumer launch, fp16: no spills,
    no FMNMX left in the key loop but the floor's two (the running max has 36 at C3_N64),
    and P's and O's scaling (32 + 64 FMUL per thread at C3_N64) behind the warp's branches."""
    code = (
        "import sys, json, os; os.environ.pop('TRITON_INTERPRET', None); "
        "sys.path[:0] = ['tools', 'tools/gpu']; import variants_gluon_s9_sass as t; "
        "from fa_bench.kernels import flash_gluon_varhost as vh; "
        "import gluon_compile as gc, variants_gluon_sass as vs; rows = []\n"
        "early = vh._SOFTCAP | vh._SUMCHECK | vh._SUM_EARLY\n"
        "for launch, d, var in (('c3', 128, 0), ('c2', 128, 0), ('c2', 64, 0), "
        "('c3', 128, early)):\n"
        "    cfg = t.config(launch, d, True)\n"
        "    var = var or vh._SOFTCAP | vh._SUMCHECK\n"
        "    k = gc.compile_variant(cfg, 'fp16', d, True, var)\n"
        "    info = gc.ptxas_info(k.asm['ptx']); lines = vs.sass(k.asm['cubin'])\n"
        "    ops = vs.softmax_loop(lines, 64 * cfg.block_n // 128)\n"
        "    body = t._loop_lines(lines, len(ops))\n"
        "    rows.append(dict(info, fmnmx=ops.count('FMNMX'), skipped=t.fmul_spans(body)))\n"
        "print(json.dumps(rows))"
    )
    env = dict(os.environ, PYTHONPATH=TRI36)
    env.pop("TRITON_INTERPRET", None)
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=1200)  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    import json

    rows = json.loads(res.stdout.strip().splitlines()[-1])
    assert all(r["spill_stores"] == 0 and r["spill_loads"] == 0 for r in rows), rows
    assert all(r["fmnmx"] <= 2 for r in rows), rows  # the floor's: one per row a thread holds
    # SUM_EARLY: O's 64 FMUL behind the branch, P's inside the rounding branch
    assert all(r["skipped"] >= want for r, want in zip(rows, (96, 128, 96, 64), strict=True)), rows
