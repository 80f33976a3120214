"""ALiBi's per-column form in the Gluon variant kernel (kernels/flash_gluon_var.py
ALIBI_COL, flash_gluon_varhost.alibi_columns): on a causal call every visible key
j <= i + o, so −m·|i + o − j| = m·(j − base) − m·(i + o − base) and the row term
leaves the softmax, coming back only in lse2.

CPU: which launches take it (causal only, not with the development switch ALIBI_ABS),
that its bit sits above the softmax code's and matches the kernel's constant, and the
identity the kernel relies on, in float64 (same softmax, lse shifted by the row term).
`slow`: the per-column kernels compiled for sm_90 (triton 3.6 where available). GPU
(`-m gpu`): ALiBi causal, with a left window, (H,) and (B, H) slopes, Sq ≠ Sk, GQA,
against the float64 reference under the accuracy rule.
"""

from __future__ import annotations

import math

import pytest
import torch

from fa_bench.kernels import flash_gluon_varhost as vh
from fa_bench.kernels.flash_validate import make_variant

LOG2E = 1.4426950408889634


def _variant(causal: bool, window=(-1, -1), slopes=True):
    q = torch.zeros((2, 4, 8, 64), dtype=torch.bfloat16)
    return make_variant(
        q, batch=2, seq_q=8, seq_k=8, causal=causal, window=window,
        alibi_slopes=torch.ones(4) if slopes else None, softcap=0.0,
    )  # fmt: skip


def test_causal_alibi_takes_the_column_bias_and_nothing_else_does(monkeypatch):
    assert vh.variant_bits(_variant(True), causal=True) == vh._ALIBI | vh._ALIBI_COL
    left = _variant(True, window=(16, -1))  # a left window on a causal call: right = 0
    assert vh.variant_bits(left, causal=True) == 1 | vh._ALIBI | vh._ALIBI_COL
    assert vh.variant_bits(_variant(False), causal=False) == vh._ALIBI  # |·| form
    # a window reaching right of the diagonal keeps the |·| form
    assert vh.variant_bits(_variant(False, window=(16, 4)), causal=False) == 1 | vh._ALIBI
    assert not vh.alibi_columns(_variant(True, window=(16, -1), slopes=False), True)
    monkeypatch.setattr(vh, "ALIBI_ABS", True)  # session 5's form, for timing beside it
    assert vh.variant_bits(_variant(True), causal=True) == vh._ALIBI


def test_the_column_bit_clears_the_softmax_code_and_matches_the_kernel():
    bits = vh.variant_bits(_variant(True), softmax=31, causal=True)
    assert (bits >> 6) & 31 == 31 and bits & vh._ALIBI_COL
    assert vh._ALIBI_COL >= 1 << 11  # above every softmax code (< 32) at bit 6
    kernel = pytest.importorskip("fa_bench.kernels.flash_gluon_var")  # needs triton's Gluon
    assert int(kernel.ALIBI_COL.value) == vh._ALIBI_COL


def _lse2_and_p(s2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """log2-domain lse and softmax of log2-domain scores (−inf = masked)."""
    m = s2.amax(-1, keepdim=True)
    p = torch.exp2(s2 - m)
    return (m.squeeze(-1) + torch.log2(p.sum(-1))), p / p.sum(-1, keepdim=True)


@pytest.mark.parametrize("sq,sk,left", [(64, 64, -1), (48, 200, -1), (64, 256, 40)])
def test_the_column_bias_gives_the_same_softmax_and_the_row_term_restores_lse(sq, sk, left):
    """What the kernel computes (s + alibi_k·(j − base), lse2 − alibi_k·sc·(i + o − base))
    against the |·| form, in float64: a wrong sign or a missing row term fails."""
    g = torch.Generator().manual_seed(0)
    raw = torch.randn(sq, sk, generator=g, dtype=torch.float64) * 8
    scale, slope = 1 / math.sqrt(128), 0.5
    sc = scale * LOG2E
    alibi_k = slope * LOG2E / sc  # flash_gluon_varhost._kernel_args' alibi_mul · slope
    o = sk - sq
    i = torch.arange(sq, dtype=torch.float64)[:, None]
    j = torch.arange(sk, dtype=torch.float64)[None, :]
    visible = j <= i + o
    if left >= 0:
        visible &= j >= i + o - left
    ref = torch.where(visible, (raw - alibi_k * (i + o - j).abs()) * sc, -math.inf)
    base = 16 + o  # a consumer's first row 16: any base works, the kernel takes its own
    col = torch.where(visible, (raw + alibi_k * (j - base)) * sc, -math.inf)
    lse_ref, p_ref = _lse2_and_p(ref)
    lse_col, p_col = _lse2_and_p(col)
    torch.testing.assert_close(p_col, p_ref, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(lse_col - alibi_k * sc * (i[:, 0] + o - base), lse_ref)
    assert not torch.allclose(lse_col, lse_ref)  # the row term is needed


def _checks_tool():
    import importlib.util
    import sys
    from pathlib import Path

    gpu = Path(__file__).resolve().parent.parent / "tools" / "gpu"
    sys.path.insert(0, str(gpu))
    spec = importlib.util.spec_from_file_location("variants_gluon_checks",
                                                  gpu / "variants_gluon_checks.py")  # fmt: skip
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _causal_alibi_names() -> list[str]:
    """The GPU checks that run the per-column form: causal with ALiBi (any combination)."""
    try:
        cases = _checks_tool()._cases()
    except Exception:  # the tool's imports (CPU-only machines still list the names)
        return []
    return [n for n, _fn, _a, kw in cases if kw.get("alibi") and kw.get("causal")]


def test_the_gpu_checks_cover_the_column_form():
    names = _causal_alibi_names()
    if not names:
        pytest.skip("tools/gpu/variants_gluon_checks.py not importable here")
    text = " | ".join(names)
    for want in ("alibi causal 1000", "alibi (B,H) causal 700x2100",
                 "alibi window (512,0) causal 4600", "packed window (200,0) softcap 30 alibi",
                 "grads softcap 50 alibi causal"):  # fmt: skip
        assert want in text, want


needs_gluon_gpu = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
    reason="needs an sm_90 GPU",
)


@pytest.mark.gpu
@needs_gluon_gpu
@pytest.mark.parametrize("name", _causal_alibi_names())
def test_gpu_column_alibi_against_the_float64_reference(name, monkeypatch):
    """Each causal ALiBi check passes the accuracy rule and its launches took ALIBI_COL."""
    tool = _checks_tool()
    _, fn, args, kw = next(c for c in tool._cases() if c[0] == name)
    seen: list[int] = []
    bits = vh.variant_bits
    monkeypatch.setattr(vh, "variant_bits", lambda *a, **k: seen.append(bits(*a, **k)) or seen[-1])
    res = fn(*args, **kw)
    assert all(r["passed"] for r in res.values()), res
    assert seen and all(b & vh._ALIBI_COL for b in seen), seen


# --- the softcap's fixed offset (FIXED_MAX) -----------------------------------------------


def _softcap_variant(c: float, slopes: bool = False):
    q = torch.zeros((2, 4, 8, 64), dtype=torch.bfloat16)
    return make_variant(
        q, batch=2, seq_q=8, seq_k=8, causal=True, window=(-1, -1),
        alibi_slopes=torch.ones(4) if slopes else None, softcap=c,
    )  # fmt: skip


def test_fixed_max_takes_bounded_bf16_softcaps_only(monkeypatch):
    v50 = _softcap_variant(50.0)
    fast = vh._SOFTCAP | vh._FIXED_MAX | vh._QSCALE
    assert vh.variant_bits(v50, dtype=torch.bfloat16) == fast  # SOFTCAP_FAST: the default
    assert vh.variant_bits(v50, dtype=torch.float16) == vh._SOFTCAP  # not for fp16
    assert vh.variant_bits(v50) == vh._SOFTCAP  # nor without a dtype
    slopes = _softcap_variant(50.0, slopes=True)
    assert vh.variant_bits(slopes, dtype=torch.bfloat16) == vh._SOFTCAP | vh._ALIBI
    monkeypatch.setattr(vh, "SOFTCAP_FAST", False)  # the switches alone
    assert vh.variant_bits(v50, dtype=torch.bfloat16) == vh._SOFTCAP
    monkeypatch.setattr(vh, "FIXED_MAX", True)
    assert vh.variant_bits(v50, dtype=torch.bfloat16) == vh._SOFTCAP | vh._FIXED_MAX
    assert not vh.fixed_max(v50, torch.float16)  # p up to 2^HEADROOM overflows fp16
    assert not vh.fixed_max(_softcap_variant(50.0, slopes=True), torch.bfloat16)
    # c · log2(e) past FIXED_MAX_SC would leave p below fp32's normal range
    top = vh.FIXED_MAX_SC / LOG2E
    assert vh.fixed_max(_softcap_variant(top * 0.999), torch.bfloat16)
    assert not vh.fixed_max(_softcap_variant(top * 1.001), torch.bfloat16)
    assert 2 * vh.FIXED_MAX_SC - vh._HEADROOM <= 126
    kernel = pytest.importorskip("fa_bench.kernels.flash_gluon_var")
    assert int(kernel.FIXED_MAX.value) == vh._FIXED_MAX
    assert float(kernel.HEADROOM.value) == vh._HEADROOM


@pytest.mark.parametrize("shift", [-1.0, 0.0, 1.0])
def test_the_fixed_offset_gives_the_softmax_and_lse_in_fp32(shift):
    """softmax_fixed's arithmetic in fp32 at the largest softcap it takes: rows whose
    tanh sits at −1 (the smallest p, 2^(HEADROOM − 2·sc)), at 0 and at +1 (the largest)
    give the float64 softmax and lse2 = (sc − HEADROOM) + log2(l); the running-max-free
    sum stays finite and nonzero."""
    sc = vh.FIXED_MAX_SC
    g = torch.Generator().manual_seed(1)
    t = (shift + 0.01 * torch.randn(4, 4096, generator=g, dtype=torch.float64)).clamp(-1, 1)
    t32 = t.float()
    p = torch.exp2(t32 * sc - (sc - vh._HEADROOM))
    assert torch.isfinite(p).all() and (p > 0).all() and (p.abs() >= 2.0**-126).all()
    sums = p.sum(-1, dtype=torch.float32)
    lse2 = (sc - vh._HEADROOM) + torch.log2(sums.double())
    ref_lse2 = torch.logsumexp(t * sc * math.log(2), -1) / math.log(2)
    torch.testing.assert_close(lse2, ref_lse2, rtol=0, atol=1e-4)
    want = torch.softmax(t * sc * math.log(2), -1)
    torch.testing.assert_close((p / sums[:, None]).double(), want, rtol=1e-4, atol=1e-9)


def test_the_gpu_checks_set_each_mode_and_restore_the_defaults():
    """A development check runs exactly its tag's switches (SOFTCAP_FAST off) and the
    next check gets the defaults back (SOFTCAP_FAST on), not everything off."""
    tool = _checks_tool()
    seen = []

    def probe(**kw):
        seen.append((vh.SOFTCAP_FAST, vh.FIXED_MAX, vh.QSCALE))
        return {}

    for mode, want in (
        ("plain", (False, False, False)),
        ("fixed", (False, True, False)),
        ("fixed qscale", (False, True, True)),
        ("", (True, False, False)),
    ):
        tool._run_check(probe, (), {"dev": mode} if mode else {})
        assert seen[-1] == want, mode
        assert (vh.SOFTCAP_FAST, vh.FIXED_MAX, vh.QSCALE) == (True, False, False)


def _softcap_fast_names() -> list[str]:
    """The bf16 GPU checks whose softcap takes the default's FIXED_MAX + QSCALE."""
    try:
        cases = _checks_tool()._cases(("bf16",))
    except Exception:
        return []
    return [n for n, _fn, _a, kw in cases if kw.get("softcap") and not kw.get("alibi")]


@pytest.mark.gpu
@needs_gluon_gpu
@pytest.mark.parametrize("name", _softcap_fast_names())
def test_gpu_softcap_fixed_offset_against_the_float64_reference(name, monkeypatch):
    """Each bf16 softcap check (no ALiBi) passes the accuracy rule, its launches having
    taken FIXED_MAX and QSCALE (the default, SOFTCAP_FAST)."""
    tool = _checks_tool()
    _, fn, args, kw = next(c for c in tool._cases(("bf16",)) if c[0] == name)
    seen: list[int] = []
    bits = vh.variant_bits
    monkeypatch.setattr(vh, "variant_bits", lambda *a, **k: seen.append(bits(*a, **k)) or seen[-1])
    res = fn(*args, **kw)
    assert all(r["passed"] for r in res.values()), res
    want = vh._FIXED_MAX | vh._QSCALE
    assert seen and all(b & want == want for b in seen), seen
