"""The softcap's row sums from the bf16 P in packed bf16x2 adds (issue 19, session 7:
kernels/flash_gluon_var_sum.py, the SUM_BF16 bit, flash_gluon_varhost.SOFTCAP_SUM_BF16),
with P rounded on the integer ALU (P_ALU, SOFTCAP_P_ALU), and the session's GPU tools.

CPU: which launches take the bit (FIXED_MAX ones only: a bf16 softcap without ALiBi), that
it matches the kernel's constant and is off by default; the levels it asks for; the
plugin's and the speed tool's switches restore the defaults; the SASS tool's loop finder
and per-score classes on a synthetic listing. `slow`: the launch compiled for sm_90 by
triton 3.6 (where /tmp/tri36 holds it) has packed adds in its key-block loop and fewer
fp32 adds than the default. GPU (`-m gpu`): every softcap check of
tools/gpu/variants_gluon_checks.py (bf16 and fp16, d64/d128, causal both, a window, GQA,
Sq ≠ Sk, odd lengths, the `tl` backward on its output) and packed and longer ones with the
switch on, three of them with P_ALU too, against the float64 reference under the accuracy
rule.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from gluon_bwd_helpers import TRI36
from gluon_bwd_helpers import tool as _tool

from fa_bench.kernels import flash_gluon_varhost as vh
from fa_bench.kernels.flash_validate import make_variant

FAST = vh._SOFTCAP | vh._FIXED_MAX | vh._QSCALE


def _softcap(c: float = 50.0, slopes: bool = False):
    q = torch.zeros((2, 4, 8, 64), dtype=torch.bfloat16)
    return make_variant(
        q, batch=2, seq_q=8, seq_k=8, causal=True, window=(-1, -1),
        alibi_slopes=torch.ones(4) if slopes else None, softcap=c,
    )  # fmt: skip


def test_the_packed_sum_rides_on_the_fixed_offset_only(monkeypatch):
    v50 = _softcap()
    assert not vh.SOFTCAP_SUM_BF16  # a development switch until the H200 says otherwise
    assert vh.variant_bits(v50, dtype=torch.bfloat16) == FAST
    monkeypatch.setattr(vh, "SOFTCAP_SUM_BF16", True)
    assert vh.variant_bits(v50, dtype=torch.bfloat16) == FAST | vh._SUM_BF16
    # no fixed offset, no packed sum: fp16 (P overflows), ALiBi (unbounded scores), a
    # softcap past FIXED_MAX_SC, and without a dtype
    assert vh.variant_bits(v50, dtype=torch.float16) == vh._SOFTCAP
    assert not vh.variant_bits(_softcap(slopes=True), dtype=torch.bfloat16) & vh._SUM_BF16
    assert not vh.variant_bits(_softcap(200.0), dtype=torch.bfloat16) & vh._SUM_BF16
    assert vh.variant_bits(v50) == vh._SOFTCAP
    # the bit is clear of every other one (the softmax code's at 6 .. 10 included)
    others = vh._ALIBI_COL | vh._FIXED_MAX | (31 << 6) | 63
    assert not vh._SUM_BF16 & others and not vh._P_ALU & (others | vh._SUM_BF16)


def test_p_on_the_alu_rides_on_the_packed_sum_only(monkeypatch):
    v50 = _softcap()
    monkeypatch.setattr(vh, "SOFTCAP_P_ALU", True)
    assert vh.variant_bits(v50, dtype=torch.bfloat16) == FAST  # not without the packed sum
    monkeypatch.setattr(vh, "SOFTCAP_SUM_BF16", True)
    assert vh.variant_bits(v50, dtype=torch.bfloat16) == FAST | vh._SUM_BF16 | vh._P_ALU
    assert vh.variant_bits(v50, dtype=torch.float16) == vh._SOFTCAP


def test_p_alus_rounding_is_round_to_nearest_but_for_ties():
    """P_ALU's bf16: the high 16 bits of the fp32 pattern + 0x8000: within half a bf16
    ulp like F2FP's round to nearest even, the same value except on exact ties (P is
    positive and finite: no sign or NaN cases)."""
    g = torch.Generator().manual_seed(3)
    p = torch.exp2(torch.empty(1 << 16).uniform_(-80.0, 64.0, generator=g))
    bits = p.view(torch.int32).to(torch.int64)
    alu = (((bits + 0x8000) >> 16) << 16).to(torch.int32).view(torch.float32)
    rn = p.to(torch.bfloat16).float()
    tie = (bits & 0xFFFF) == 0x8000
    assert torch.equal(alu[~tie], rn[~tie])
    assert ((alu - p).abs() <= p.abs() * 2.0**-8).all()


def test_the_bit_and_its_levels_match_the_kernel():
    kernel = pytest.importorskip("fa_bench.kernels.flash_gluon_var_sum")  # needs Gluon
    assert int(kernel.SUM_BF16.value) == vh._SUM_BF16
    assert int(kernel.P_ALU.value) == vh._P_ALU
    # every register-local halving of a thread's columns: 128 keys → 8 columns left
    assert kernel.sum_levels(FAST | vh._SUM_BF16, 128) == 4
    assert kernel.sum_levels(FAST | vh._SUM_BF16, 64) == 3
    assert kernel.sum_levels(FAST, 128) == 0
    assert kernel.sum_levels(None, 128) == 0


def test_the_plugin_switches_around_each_call_only(monkeypatch):
    plugin = _tool("variants_gluon_s7_plugin")
    seen = []
    with plugin._sum_bf16(True):
        seen.append(vh.SOFTCAP_SUM_BF16)
    assert seen == [True] and vh.SOFTCAP_SUM_BF16 is False
    with pytest.raises(RuntimeError), plugin._sum_bf16(True):
        raise RuntimeError("a failing call")
    assert vh.SOFTCAP_SUM_BF16 is False
    # the baseline impl turns the session's switches off whatever the defaults are
    monkeypatch.setattr(vh, "SOFTCAP_SUM_BF16", True)
    monkeypatch.setattr(vh, "SOFTCAP_P_ALU", True)
    with plugin._switches(plugin._S6):
        assert (vh.SOFTCAP_SUM_BF16, vh.SOFTCAP_P_ALU) == (False, False)
    assert (vh.SOFTCAP_SUM_BF16, vh.SOFTCAP_P_ALU) == (True, True)


def test_the_speed_tools_candidates_are_valid_launches():
    from fa_bench.kernels import gluon_fields
    from fa_bench.kernels.flash_gluon import SMEM_BYTES, GluonConfig

    tool = _tool("variants_gluon_s7")
    assert tool.CANDIDATES["default"] == ((), {})
    timed = {c for *_shape, cands in tool.SHAPES for c in cands}
    for name, (switches, fields) in tool.CANDIDATES.items():
        assert all(isinstance(getattr(vh, n), bool) for n in switches), switches
        if name in tool.DIRECT:  # GluonConfig's own fields, launched by variant_forward
            cfg = GluonConfig(**fields, **tool.DIRECT[name])
            assert cfg.registers()[0] >= cfg.consumer_regs  # consumer 0 not starved
        else:
            values = dict(gluon_fields.UNSET, **fields)
            gluon_fields.check(values)  # a ValueError names a bad field or value
            # the launch the variant kernel runs for it
            cfg = vh.variant_config(gluon_fields.resolve(values, 128, True), 128)
        assert cfg.smem_bytes(128) <= SMEM_BYTES, name
        assert name in timed, name


_LISTING = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR16], RZ, !UPT ;
        /*0020*/                   MUFU.TANH R2, R24 ;
        /*0030*/                   MUFU.TANH R3, R25 ;
        /*0040*/                   FFMA R2, R2, R9, -R10 ;
        /*0050*/                   MUFU.EX2 R2, R2 ;
        /*0060*/                   MUFU.EX2 R3, R3 ;
        /*0070*/                   HADD2.BF16_V2 R4, R2, R3 ;
        /*0080*/              @!P1 FSEL R5, R2, -INF , P2 ;
        /*0090*/                   UIADD3 UR4, UR4, 0x1, URZ ;
        /*00a0*/               @P1 BRA 0x10 ;
        /*00b0*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P1, [UR8], R15 ;
        /*00c0*/              @!P1 BRA 0x0 ;
"""


def test_the_sass_tool_finds_the_softmax_loop_and_counts_per_score(tmp_path):
    tool = _tool("variants_gluon_sass") if _has_gluon_compile() else None
    if tool is None:
        pytest.skip("tools/gluon_compile.py needs triton's Gluon")
    import re

    lines = [
        (int(m.group(1), 16), m.group(2)) for m in map(tool._LINE.match, _LISTING.splitlines()) if m
    ]
    assert tool.opcode("@!P1 FSEL R5, R2, -INF , P2") == "FSEL"
    body = tool.softmax_loop(lines, scores=2)
    # the loop closed by "@P1 BRA 0x10", not the retry stub's longer span back to 0x0
    assert body[0] == "HGMMA" and body[-1] == "BRA" and len(body) == 10
    per = tool.classify(body, scores=2)
    assert per["MUFU"] == 2.0 and per["HADD2/HFMA2"] == 0.5 and per["HGMMA"] == 0.5
    assert per["mask (masked blocks only)"] == 0.5
    assert per["unmasked total"] == pytest.approx((10 - 1) / 2)
    assert re.search("uniform", " ".join(per))


def _has_gluon_compile() -> bool:
    try:
        from triton.experimental.gluon._runtime import GluonASTSource  # noqa: F401
    except Exception:
        return False
    return True


@pytest.mark.slow
@pytest.mark.skipif(
    not os.path.exists(f"{TRI36}/triton/__init__.py"), reason="no triton 3.6 installed aside"
)
def test_the_launch_compiles_for_sm90_with_packed_adds_in_its_loop():
    """triton 3.6 (the H200's) compiles the default and the packed-sum launch; the loop of
    the latter holds HADD2s and at most a sixth of the default's fp32 adds per score."""
    code = (
        "import json, sys; sys.path.insert(0, 'tools/gpu'); import variants_gluon_sass as t; "
        "print(json.dumps([t.row(n) for n in ('softcap', 'softcap sum-bf16')]))"
    )
    env = dict(os.environ, PYTHONPATH=TRI36)
    env.pop("TRITON_INTERPRET", None)
    root = Path(__file__).resolve().parent.parent
    out = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True,
                         text=True, timeout=600)  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    import json

    default, packed = json.loads(out.stdout.strip().splitlines()[-1])
    assert default["spills"] == 0 and packed["spills"] == 0
    assert packed["per_score"]["HADD2/HFMA2"] >= 0.45  # 30 per 64 scores
    assert default["per_score"]["HADD2/HFMA2"] == 0
    assert packed["per_score"]["unmasked total"] < default["per_score"]["unmasked total"]
    assert packed["per_score"]["moves (IMAD/MOV/PRMT)"] < 0.25  # no copy of P per block


# --- GPU: the accuracy rule with the packed sums ---------------------------------------------

needs_gluon_gpu = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
    reason="needs an sm_90 GPU",
)


def _softcap_checks() -> list[tuple]:
    """The checks tool's softcap cases without ALiBi, bf16 and fp16 (fp16 takes no fixed
    offset, so no packed sum: its launches must not carry the bit), and longer, odd and
    packed ones."""
    try:
        tool = _tool("variants_gluon_checks")
        cases = [c for c in tool._cases() if c[3].get("softcap") and not c[3].get("alibi")]
    except Exception:  # the tool's imports (CPU-only machines still collect the names)
        return []
    bf16 = torch.bfloat16
    dc, vc = tool._dense_check, tool._varlen_check
    cases += [
        ("bf16 d128 softcap 50 causal 4097 GQA 8:2", dc, (bf16, 128, 1, 8, 2, 4097, 4097),
         dict(causal=True, softcap=50.0)),
        ("bf16 d128 softcap 30 causal 1300x700 (empty rows)", dc, (bf16, 128, 1, 4, 1, 1300, 700),
         dict(causal=True, softcap=30.0)),
        ("bf16 d64 softcap 50 window (1000,0) causal 3000", dc, (bf16, 64, 1, 4, 2, 3000, 3000),
         dict(causal=True, window=(1000, -1), softcap=50.0)),
        ("bf16 d128 packed softcap 50 causal [1, 300, 1, 1000, 129, 64]", vc,
         (bf16, 128, [1, 300, 1, 1000, 129, 64], [1, 300, 1, 1000, 129, 64], 4, 2),
         dict(causal=True, softcap=50.0)),
    ]  # fmt: skip
    return cases


def _names() -> list[str]:
    return [c[0] for c in _softcap_checks()]


@pytest.mark.gpu
@needs_gluon_gpu
@pytest.mark.parametrize("name", _names())
def test_gpu_softcap_packed_sum_against_the_float64_reference(name, monkeypatch):
    """Each softcap check passes the accuracy rule with SOFTCAP_SUM_BF16 on; its bf16
    launches took the packed sum, its fp16 ones did not."""
    _, fn, args, kw = next(c for c in _softcap_checks() if c[0] == name)
    monkeypatch.setattr(vh, "SOFTCAP_SUM_BF16", True)
    seen: list[int] = []
    bits = vh.variant_bits
    monkeypatch.setattr(vh, "variant_bits", lambda *a, **k: seen.append(bits(*a, **k)) or seen[-1])
    res = fn(*args, **kw)
    assert all(r["passed"] for r in res.values()), res
    want = vh._SUM_BF16 if args[0] == torch.bfloat16 else 0
    assert seen and all(b & vh._SUM_BF16 == want for b in seen), seen


_P_ALU_CHECKS = (
    "bf16 d128 softcap 50 causal 1000",
    "bf16 d128 window (256,0) causal softcap 50 700x1500",
    "bf16 d128 packed softcap 50 causal [1, 300, 1, 1000, 129, 64]",
)


@pytest.mark.gpu
@needs_gluon_gpu
@pytest.mark.parametrize("name", [n for n in _names() if n in _P_ALU_CHECKS])
def test_gpu_softcap_p_on_the_alu_against_the_float64_reference(name, monkeypatch):
    """With P rounded on the integer ALU too (SOFTCAP_P_ALU), the accuracy rule holds and
    the launches took both bits."""
    _, fn, args, kw = next(c for c in _softcap_checks() if c[0] == name)
    monkeypatch.setattr(vh, "SOFTCAP_SUM_BF16", True)
    monkeypatch.setattr(vh, "SOFTCAP_P_ALU", True)
    seen: list[int] = []
    bits = vh.variant_bits
    monkeypatch.setattr(vh, "variant_bits", lambda *a, **k: seen.append(bits(*a, **k)) or seen[-1])
    res = fn(*args, **kw)
    assert all(r["passed"] for r in res.values()), res
    want = vh._SUM_BF16 | vh._P_ALU
    assert seen and all(b & want == want for b in seen), seen
