"""The fp16 softcap's threshold rescale (issue 19, session 9): the LAZY bit of the variant
kernel and its development switch (flash_gluon_varhost.SOFTCAP_LAZY_FP16, off; on by
$FA_BENCH_SOFTCAP_LAZY at import), which launches take it, the step's math emulated on
the CPU (flash_gluon_var.softmax_lazy / lazy_rescale in torch) against the exact softmax,
the session's GPU tools and script. `slow`: the bit compiles for sm_90 with triton 3.6
(GLUON_TRITON_PATH or /tmp/tri36) on both softcap launches without new spills.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from gluon_bwd_helpers import TRI36
from gluon_bwd_helpers import tool as _tool

from fa_bench.kernels import flash_gluon_var as kernel
from fa_bench.kernels import flash_gluon_varhost as vh
from fa_bench.kernels.flash_validate import Variant, Varlen

ROOT = Path(__file__).resolve().parent.parent
GPU_TOOLS = ROOT / "tools" / "gpu"
BF16, FP16 = torch.bfloat16, torch.float16
SCALE = 128**-0.5


def _v(window=None, softcap=50.0, alibi=False, varlen=False) -> Variant:
    cu = torch.tensor([0, 3, 9], dtype=torch.int32)
    return Variant(window=window, softcap=softcap, slopes=torch.ones(1, 4) if alibi else None,
                   varlen=Varlen(cu, cu, 6, 6) if varlen else None, tanh=1)  # fmt: skip


def test_the_bits_agree_with_the_kernel_and_are_clear_of_the_others():
    assert int(kernel.LAZY.value) == vh._LAZY
    assert int(kernel.LAZY_WARP.value) == vh._LAZY_WARP
    others = (vh._WINDOW | vh._SOFTCAP | vh._ALIBI | vh._VARLEN | vh._TANH_F16X2 | vh._QSCALE
              | (31 << 6) | vh._ALIBI_COL | vh._FIXED_MAX | vh._SUM_BF16 | vh._P_ALU)  # fmt: skip
    for bit in (vh._LAZY, vh._LAZY_WARP):
        assert bit & (bit - 1) == 0 and not bit & others
    assert vh._LAZY != vh._LAZY_WARP
    # P <= 2^LAZY_TAU must stay a finite fp16 number with room for the exp2's rounding
    tau = float(kernel.LAZY_TAU.value)
    assert 0 < tau and 2.0**tau * 1.01 < torch.finfo(FP16).max


def test_the_switch_is_off_and_takes_fp16_softcap_launches_only(monkeypatch):
    cap = _v()
    assert not vh.SOFTCAP_LAZY_FP16
    assert vh.variant_bits(cap, 0, True, FP16, SCALE) == vh._SOFTCAP
    monkeypatch.setattr(vh, "SOFTCAP_LAZY_FP16", True)
    assert vh.variant_bits(cap, 0, True, FP16, SCALE) == vh._SOFTCAP | vh._LAZY
    assert vh.variant_bits(cap, 0, False, FP16, SCALE) & vh._LAZY  # non-causal too
    # the rescale needs no bound on the scores: with a window, ALiBi, packed as well
    for v in (_v(window=(8, 0)), _v(alibi=True), _v(varlen=True), _v((8, 0), 30.0, False, True)):
        assert vh.variant_bits(v, 0, True, FP16, SCALE) & vh._LAZY, v
    # but not a packed batch with ALiBi (ptxas spills at d128)
    for v in (_v(alibi=True, varlen=True), _v((8, 0), 30.0, True, True)):
        assert not vh.variant_bits(v, 0, True, FP16, SCALE) & vh._LAZY, v
    assert vh.variant_bits(_v(alibi=True), 0, True, FP16) & vh._ALIBI_COL  # with the column form
    # bf16 keeps the fixed offset (no m to move), no softcap no rescale switch, no dtype no
    fast = vh._SOFTCAP | vh._FIXED_MAX | vh._QSCALE
    assert vh.variant_bits(cap, 0, True, BF16, SCALE) == fast
    assert not vh.variant_bits(_v(softcap=0.0, alibi=True), 0, True, FP16) & vh._LAZY
    assert not vh.variant_bits(cap, 0, True, None) & vh._LAZY
    assert not vh.variant_bits(cap, 0, True, torch.float32) & vh._LAZY
    # with SOFTCAP_QSCALE_FP16 both bits
    monkeypatch.setattr(vh, "SOFTCAP_QSCALE_FP16", True)
    assert vh.variant_bits(cap, 0, True, FP16, SCALE) == vh._SOFTCAP | vh._QSCALE | vh._LAZY
    assert vh.lazy_max(cap, FP16, False) is False and vh.lazy_max(cap, FP16, True) is True


def test_the_per_warp_form_rides_on_the_threshold_rescale_only(monkeypatch):
    cap = _v()
    assert not vh.SOFTCAP_LAZY_WARP
    monkeypatch.setattr(vh, "SOFTCAP_LAZY_WARP", True)
    assert vh.variant_bits(cap, 0, True, FP16, SCALE) == vh._SOFTCAP  # not without LAZY
    monkeypatch.setattr(vh, "SOFTCAP_LAZY_FP16", True)
    want = vh._SOFTCAP | vh._LAZY | vh._LAZY_WARP
    assert vh.variant_bits(cap, 0, True, FP16, SCALE) == want
    assert not vh.variant_bits(cap, 0, True, BF16, SCALE) & vh._LAZY_WARP


def test_the_per_warp_ptx_skips_with_its_values_tied():
    """The rescale's PTX: one warp-uniform branch on the first flag operand, n multiplies
    in place (each result tied to its value), n alphas; the vote covers both rows."""
    n = int(kernel._PACK.value)
    asm, con = str(kernel._RESCALE_ASM.value), str(kernel._RESCALE_CON.value).split(",")
    assert con == ["=r"] * n + [str(i) for i in range(n)] + ["r"] * (2 * n)
    assert f"setp.eq.s32 %keep, ${3 * n}, 0;" in asm and "bra.uni LAZY_SKIP" in asm
    assert asm.count("mul.f32") == n and f"mul.f32 $0, $0, ${2 * n};" in asm
    assert asm.startswith("{") and asm.endswith("}")  # the label stays local to each copy
    vote = str(kernel._VOTE_ASM.value)
    assert "vote.sync.any.pred" in vote and "$2" in vote and "$3" in vote


@pytest.mark.parametrize(
    "value, on, warp",
    [(None, False, False), ("", False, False), ("0", False, False), ("1", True, False),
     ("warp", True, True)],
)  # fmt: skip
def test_the_environment_turns_the_switches_on_at_import(value, on, warp):
    env = dict(os.environ)
    env.pop(vh.LAZY_ENV, None)
    if value is not None:
        env[vh.LAZY_ENV] = value
    code = ("from fa_bench.kernels import flash_gluon_varhost as v; "
            "print(v.SOFTCAP_LAZY_FP16, v.SOFTCAP_LAZY_WARP)")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str(on), str(warp)]


def _lazy_forward(s: torch.Tensor, v: torch.Tensor, sc: float, block: int, tau: float | None):
    """The kernel's forward over rows of raw scores s (after softcap and mask, fp32; −inf
    masked) in key blocks, P rounded to fp16 as PV takes it: the running max (tau None) or
    LAZY's kept offset (flash_gluon_var.softmax_lazy then lazy_rescale). (o, lse2, the
    largest P, the blocks that rescaled)."""
    rows = s.shape[0]
    m = torch.full((rows,), -math.inf)
    l = torch.zeros(rows)  # noqa: E741
    acc = torch.zeros(rows, v.shape[1])
    p_max, rescaled = 0.0, 0
    for j0 in range(0, s.shape[1], block):
        sb, vb = s[:, j0 : j0 + block], v[j0 : j0 + block]
        m_blk = torch.maximum(m, sb.max(dim=1).values)
        if tau is None or j0 == 0:  # the first block: the plain step (m = −inf before)
            m_new = m_blk
        else:
            with torch.no_grad():
                diff = (m_blk - m) * sc  # −inf − −inf = NaN: not > tau, kept
            m_new = torch.where(diff > tau, m_blk, m)
        m_scaled = torch.where(m_new == -math.inf, 0.0, m_new * sc)
        p = torch.exp2(sb * sc - m_scaled[:, None])
        if bool((m_new != m).any()):
            alpha = torch.where(m_new == m, 1.0, torch.exp2((m - m_new) * sc))
            l, acc = l * alpha, acc * alpha[:, None]  # noqa: E741
            rescaled += 1
        p16 = p.to(FP16)
        assert torch.isfinite(p16).all()
        p_max = max(p_max, float(p.max()))
        l = l + p.sum(dim=1)  # noqa: E741
        acc = acc + p16.float() @ vb
        m = m_new
    empty = l == 0
    o = acc / torch.where(empty, 1.0, l)[:, None]
    lse2 = torch.where(empty, math.inf, m * sc + torch.log2(torch.where(empty, 1.0, l)))
    return o, lse2, p_max, rescaled


def softcapped_rows(pattern: str, seed: int) -> tuple[torch.Tensor, torch.Tensor, float]:
    """(s, v, sc): 16 rows of 1024 softcapped scores (softcap 50, in units of sc, −inf
    masked) and their values. "late": a large logit in the last 5 keys; "ramp": a rise of
    14 along the row; "masked start": rows 0-3 see no key, rows 4-7 keys from 300 on only;
    "low then late": every logit 45 down (below session 10's floor), the last 7 up by 60;
    "all low": every logit 60 down."""
    g = torch.Generator().manual_seed(seed)
    rows, n, d, cap = 16, 1024, 32, 50.0
    sc = cap * math.log2(math.e)
    raw = torch.randn((rows, n), generator=g) * 1.5
    if pattern == "late":
        raw[:, -5:] += 14.0
    elif pattern == "ramp":
        raw += torch.linspace(0.0, 14.0, n)
    elif pattern == "low then late":
        raw -= 45.0
        raw[:, -7:] += 60.0
    elif pattern == "all low":
        raw -= 60.0
    s = torch.tanh(raw / cap)  # the kernel's softcapped score, in units of sc
    if pattern == "masked start":
        s[:4] = -math.inf
        s[4:8, :300] = -math.inf
    return s, torch.randn((n, d), generator=g), sc


def assert_as_exact_as_the_running_max(o, lse2, o_run, s, v, sc: float) -> None:
    """An emulated forward's (o, lse2) against the exact softmax (float64) of the scores s
    (units of sc, −inf masked): o within twice the running max's error (+1e-3), lse2 within
    1e-4 and +inf exactly where a row sees no key."""
    logits = s.double() * sc * math.log(2.0)  # natural-log units
    w = torch.softmax(logits, dim=1)
    seen = torch.isfinite(logits).any(dim=1)
    o_ref = torch.where(seen[:, None], torch.nan_to_num(w) @ v.double(), 0.0)
    lse_ref = torch.where(seen, torch.logsumexp(logits, dim=1) / math.log(2.0), math.inf)
    err_run = (o_run.double() - o_ref).abs().max().item()
    err = (o.double() - o_ref).abs().max().item()
    assert err <= 2 * err_run + 1e-3, (err, err_run)
    assert torch.equal(torch.isinf(lse2), torch.isinf(lse_ref))
    fin = torch.isfinite(lse_ref)
    assert (lse2[fin].double() - lse_ref[fin]).abs().max().item() < 1e-4


@pytest.mark.parametrize("pattern", ["random", "late", "ramp", "masked start"])
def test_the_threshold_rescale_is_exact_math_whatever_the_data(pattern):
    """The emulated LAZY step against the exact softmax (float64): o and lse2 as close as
    the running max's, P never above 2^LAZY_TAU (fp16 finite), rescales only when a row
    rises past the threshold (the late logit, the ramp) and rows without keys empty."""
    s, v, sc = softcapped_rows(pattern, seed=7)
    n = s.shape[1]
    tau = float(kernel.LAZY_TAU.value)
    o_run, _lse, p_run, _ = _lazy_forward(s, v, sc, 64, None)
    o_lazy, lse_lazy, p_lazy, rescaled = _lazy_forward(s, v, sc, 64, tau)
    assert_as_exact_as_the_running_max(o_lazy, lse_lazy, o_run, s, v, sc)
    assert p_run <= 1.0 + 1e-6 and p_lazy <= 2.0**tau * 1.001
    blocks = n // 64
    if pattern in ("late", "ramp"):
        assert 0 < rescaled < blocks - 1, rescaled
    if pattern == "random":
        assert rescaled <= blocks // 4, rescaled  # the maxima settle after a few blocks


def test_the_compile_tools_cover_the_bit():
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import gluon_compile
    finally:
        sys.path.remove(str(ROOT / "tools"))
    lazy = [b for b in gluon_compile.VAR_BITS if b & vh._LAZY]
    assert {b & 15 for b in lazy} >= {vh._SOFTCAP, vh._SOFTCAP | vh._WINDOW}
    assert all(b & vh._SOFTCAP and not b & vh._FIXED_MAX for b in lazy)
    tool = _tool("variants_gluon_s9_sass")
    combos = tool.combos(quick=False)
    assert {(c.launch, c.head_dim) for c in combos} == {("c2", 64), ("c2", 128), ("c3", 128)}
    lazy = vh._SOFTCAP | vh._LAZY
    assert {c.var for c in combos} == {vh._SOFTCAP, lazy, lazy | vh._LAZY_WARP}
    assert len(combos) == 3 * 2 * 2 * 3 and len(tool.combos(quick=True)) == 2 * 2 * 3
    assert tool.config("c3", 128, True) == vh.C3_N64
    # --served: every fp16 softcap kind lazy_max takes, the dispatch's launch, three bit sets.
    # The s8 SASS tool it imports drops TRITON_INTERPRET when it runs: loaded here first
    # (_tool puts the variable back and registers the module, so served() does not run it
    # again), or every later test in this process would compile instead of interpret.
    saved = os.environ.get("TRITON_INTERPRET")
    _tool("variants_gluon_s8_sass")
    served = tool.served()
    assert os.environ.get("TRITON_INTERPRET") == saved
    kinds = {c.kind for c in served}
    assert kinds and all("softcap" in k and not ("alibi" in k and "varlen" in k) for k in kinds)
    assert len(kinds) == 6 and len(served) == 6 * 2 * 2 * 3
    for i in range(0, len(served), 3):
        off, lazy, warp = served[i : i + 3]
        assert not off.var & vh._LAZY and lazy.var == off.var | vh._LAZY
        assert warp.var == lazy.var | vh._LAZY_WARP
        c3 = off.kind in vh.C3_KINDS["fp16"] and off.causal and off.head_dim == 128
        assert off.launch == ("c3" if c3 else "c2") == warp.launch
    assert not vh.SOFTCAP_LAZY_FP16 and not vh.SOFTCAP_LAZY_WARP  # put back
    assert tool.config("c2", 128, True).consumers == 2
    # the rescale's skip: a conditional forward branch over an exp2 without a tanh
    body = [(0x10, "@!P5 BRA 0x40"), (0x20, "MUFU.EX2 R1, R1"), (0x30, "FMUL R2, R2, R1"),
            (0x40, "@P1 BRA 0x70"), (0x50, "MUFU.TANH R3, R3"), (0x60, "MUFU.EX2 R3, R3"),
            (0x70, "BRA 0x10")]  # fmt: skip
    assert tool.forward_span(body) == 2
    assert tool.fmul_spans(body) == 0  # not FMULs only
    warp = [(0x10, "@!P0 BRA 0x40"), (0x20, "FMUL R1, R1, R9"), (0x30, "FMUL R2, R2, R9"),
            (0x40, "@!P0 BRA 0x60"), (0x50, "FMUL R3, R3, R9"), (0x60, "BRA 0x10")]  # fmt: skip
    assert tool.fmul_spans(warp) == 3
    rows = [dict(launch="c3", dtype="fp16", head_dim=128, causal=True, var=2, ok=True,
                 spill_stores=0, config="c3"),
            dict(launch="c3", dtype="fp16", head_dim=128, causal=True, var=2 | vh._LAZY,
                 ok=True, spill_stores=4, config="c3")]  # fmt: skip
    assert len(tool.regressions(rows)) == 1
    rows[1]["spill_stores"] = 0
    assert tool.regressions(rows) == []
    # rows of another kind are their own baseline
    rows += [dict(rows[0], kind="window+softcap", spill_stores=8),
             dict(rows[1], kind="window+softcap", spill_stores=8)]  # fmt: skip
    assert tool.regressions(rows) == []


def test_the_speed_tools_switch_the_lazy_launches():
    s8 = _tool("variants_gluon_s8")
    seen = []
    for name in ("c2", "c2l", "c2w", "c3", "c3l", "c3w", "c3q"):
        with s8.launch(name):
            seen.append((bool(vh.C3_KINDS), vh.SOFTCAP_LAZY_FP16, vh.SOFTCAP_LAZY_WARP,
                         vh.SOFTCAP_QSCALE_FP16))  # fmt: skip
    assert seen == [(False, False, False, False), (False, True, False, False),
                    (False, True, True, False), (True, False, False, False),
                    (True, True, False, False), (True, True, True, False),
                    (True, False, False, True)]  # fmt: skip
    assert not vh.SOFTCAP_LAZY_FP16 and not vh.SOFTCAP_LAZY_WARP
    s9 = _tool("variants_gluon_s9")
    assert set(s9.LAUNCHES) == {"c2", "c2l", "c2w", "c3", "c3l", "c3w"}
    assert {b for _a, b in s9.PAIRS} <= set(s9.LAUNCHES) >= {a for a, _b in s9.PAIRS}
    assert all(d == "fp16" and k == "softcap" for k, _b, _n, d in s9.ROWS)
    assert {(b, n) for _k, b, n, _d in s9.ROWS} == {(8, 8192), (2, 32768)}
    assert s9.verdict([{"c3l_over_c3": 1.05}, {"c3l_over_c3": 1.0}]) is True
    assert s9.verdict([{"c3l_over_c3": 1.005}]) is False
    assert s9.verdict([]) is None
    assert s9.best_form([{"c3l_over_c3": 1.04, "c3w_over_c3": 1.02}]) == "1"
    assert s9.best_form([{"c3l_over_c3": 0.98, "c3w_over_c3": 1.02}]) == "warp"
    assert s9.best_form([]) == "warp"


def test_the_gpu_script_parses_and_its_paths_exist():
    script = GPU_TOOLS / "variants_gluon_s9.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    text = script.read_text()
    for path in set(re.findall(r"\b((?:tools|tests)/[\w/.-]+\.(?:py|sh|toml))", text)):
        assert (ROOT / path).exists(), path
    assert vh.LAZY_ENV in text and "test_flash_gluon_var_s9_gpu.py" in text


def _sass_tool(tmp_path, *flags: str) -> list[dict]:
    env = dict(os.environ, PYTHONPATH=TRI36)
    env.pop("TRITON_INTERPRET", None)
    out = tmp_path / "s9.json"
    res = subprocess.run(
        [sys.executable, "tools/gpu/variants_gluon_s9_sass.py", *flags, "--json", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    return json.loads(out.read_text())


@pytest.mark.slow
@pytest.mark.skipif(
    not os.path.exists(f"{TRI36}/triton/__init__.py"), reason="no triton 3.6 installed aside"
)
def test_the_lazy_bit_compiles_for_sm90_without_new_spills(tmp_path):
    """triton 3.6 compiles softcap without LAZY, with it and with LAZY_WARP on both
    launches (d128 causal, fp16 and bf16), no spills, O's rescale behind branches in the
    key loop, and LAZY_WARP without the uniform test's barriers."""
    rows = _sass_tool(tmp_path, "--quick")
    assert len(rows) == 12 and all(r["ok"] for r in rows), rows
    assert all(r["spill_stores"] == 0 and r["spill_loads"] == 0 for r in rows), rows
    lazy = [r for r in rows if r["var"] & vh._LAZY]
    # O's rescale (64 FMUL per thread at d128) skipped
    assert len(lazy) == 8 and all(r["skipped"] >= 64 for r in lazy), lazy
    plain = {(r["config"], r["dtype"]): r for r in rows if not r["var"] & vh._LAZY}
    for r in lazy:
        base = plain[(r["config"], r["dtype"])]
        if r["var"] & vh._LAZY_WARP:  # no reduction: the plain launch's barriers
            assert r["bar"] == base["bar"] and r["loop"] - r["skipped"] < base["loop"], r
        else:
            assert r["bar"] > base["bar"], r


@pytest.mark.slow
@pytest.mark.skipif(
    not os.path.exists(f"{TRI36}/triton/__init__.py"), reason="no triton 3.6 installed aside"
)
def test_every_served_fp16_softcap_kind_compiles_without_new_spills(tmp_path):
    """Every fp16 softcap kind the switch serves, d64 and d128, causal both, on the
    dispatch's launch: LAZY and LAZY_WARP compile and spill no more than without them (the
    tool exits 1 otherwise)."""
    rows = _sass_tool(tmp_path, "--served")
    assert len(rows) == 6 * 2 * 2 * 3 and all(r["ok"] for r in rows)
