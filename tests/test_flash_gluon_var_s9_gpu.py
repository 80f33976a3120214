"""GPU tests (`-m gpu`, sm_90) of the fp16 softcap's threshold rescale (issue 19, session
9: flash_gluon_varhost.SOFTCAP_LAZY_FP16, the LAZY bit, in both forms: the warpgroup's
uniform `if`, and SOFTCAP_LAZY_WARP's vote per warp): with the switch on, every fp16
softcap check of tools/gpu/variants_gluon_checks.py (d64 and d128, causal both, windows,
ALiBi, packed, the `tl` backward on its output; not packed with ALiBi, which the switch
leaves on the running max) and checks whose rows' maxima rise after
the first key block (a large logit in the row's last keys, a ramp that rises by less than
the threshold per block but by far more in all, a rise in one row of a tile only) on both
launches (two consumers, and C3_N64), with odd lengths and GQA, against the float64
reference under the accuracy rule; each asserts the launch carried the LAZY bit.

Test ids carry "lazy" and the launch, so a GPU script selects with -k.
"""

from __future__ import annotations

import pytest
import torch
from gluon_bwd_helpers import tool as _tool

from fa_bench.kernels import flash_gluon_varhost as vh

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
        reason="needs an sm_90 GPU",
    ),
]
FP16 = torch.float16


def _checks() -> list[tuple]:
    """(id, check function, args, kwargs): the checks tool's fp16 softcap cases, but packed
    batches with ALiBi (flash_gluon_varhost.lazy_max leaves them on the running max)."""
    try:
        tool = _tool("variants_gluon_checks")
    except Exception:  # CPU-only machines still collect the names
        return []
    return [
        c for c in tool._cases(("fp16",))
        if "softcap" in c[3] and not (c[1] is tool._varlen_check and c[3].get("alibi"))
    ]  # fmt: skip


_CHECKS = _checks()


def _spy(monkeypatch) -> tuple[list[str], list[int]]:
    """The labels and VAR bits of every launch variant_forward takes from here on."""
    seen: list[str] = []
    bits: list[int] = []
    forward, real_bits = vh.variant_forward, vh.variant_bits

    def spy(q, k, v, causal, scale, cfg, variant):
        seen.append(cfg.label())
        return forward(q, k, v, causal, scale, cfg, variant)

    def spy_bits(*a, **kw):
        bits.append(real_bits(*a, **kw))
        return bits[-1]

    monkeypatch.setattr(vh, "variant_forward", spy)
    monkeypatch.setattr(vh, "variant_bits", spy_bits)
    return seen, bits


def _switch(monkeypatch, form: str) -> int:
    """SOFTCAP_LAZY_FP16 on, SOFTCAP_LAZY_WARP for form "warp"; form "sum": session 10's
    SOFTCAP_SUM_FP16 alone. The bits a launch carries."""
    if form in ("sum", "sum-early"):
        monkeypatch.setattr(vh, "SOFTCAP_SUM_FP16", True)
        monkeypatch.setattr(vh, "SOFTCAP_SUM_EARLY", form == "sum-early")
        return vh._SUMCHECK | (vh._SUM_EARLY if form == "sum-early" else 0)
    monkeypatch.setattr(vh, "SOFTCAP_SUM_FP16", False)  # the default takes precedence
    monkeypatch.setattr(vh, "SOFTCAP_LAZY_FP16", True)
    monkeypatch.setattr(vh, "SOFTCAP_LAZY_WARP", form == "warp")
    return vh._LAZY | (vh._LAZY_WARP if form == "warp" else 0)


# the warpgroup's uniform `if`; LAZY_WARP's vote and PTX branches; the sum check (SUMCHECK),
# and with P rounded before the check (SUM_EARLY, a development switch)
FORMS = ["if", "warp", "sum", "sum-early"]


def _crafted(pattern: str, b: int, hq: int, hk: int, sq: int, sk: int, d: int, g):
    """(q, k, v) whose rows' maxima rise after the first key block: "late" puts a key of
    logit ~ +14 (log2 units ~ +19 through softcap 50) in the last 7 keys; "ramp" raises
    every key's logit linearly along the sequence (each 64-key block by less than the
    threshold, the whole row by ~ 14); "one row" does "late" for query row 37 only."""
    q = torch.randn((b, hq, sq, d), generator=g, device="cuda")
    k = torch.randn((b, hk, sk, d), generator=g, device="cuda")
    v = torch.randn((b, hk, sk, d), generator=g, device="cuda")
    boost = 14.0 / (d**-0.5 * 4.0)  # q·k · scale = 14 where q[..., 0] = 4
    if pattern == "ramp":
        q[..., 0] = 4.0
        k[..., 0] = torch.linspace(0.0, boost, sk, device="cuda")
    elif pattern == "late":
        q[..., 0] = 4.0
        k[:, :, -7:, 0] = boost
    elif pattern == "low then late":  # below the sum check's floor, then a rise of ~90
        q[..., 0] = 4.0
        k[..., 0] = -3.0 * boost
        k[:, :, -7:, 0] = boost
    else:  # one row
        q[:, :, 37, 0] = 4.0
        k[:, :, -7:, 0] = boost
    return tuple(t.to(FP16) for t in (q, k, v))


# (pattern, b, hq, hk, sq, sk, d, causal): odd lengths, GQA, MQA, Sq != Sk
SHAPES = [
    ("late", 1, 8, 2, 1000, 1000, 128, True),
    ("late", 2, 4, 4, 577, 1999, 128, False),
    ("ramp", 1, 8, 2, 4097, 4097, 128, True),
    ("ramp", 1, 4, 1, 700, 1300, 64, True),
    ("one row", 2, 4, 2, 193, 3001, 128, True),
    ("ramp", 1, 4, 2, 1300, 700, 128, True),  # rows that see no key
    ("low then late", 1, 4, 2, 999, 999, 128, True),
    ("low then late", 1, 4, 1, 640, 2000, 64, False),
]


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("launch", ["c2", "c3"])
@pytest.mark.parametrize("shape", SHAPES, ids=[" ".join(map(str, s)) for s in SHAPES])
def test_gpu_lazy_rows_whose_max_rises_late(shape, launch, form, monkeypatch):
    """Rows whose maximum rises past the threshold after the first block (the rescale
    runs) or by less per block (it is skipped, P up to 2^8 in fp16): o and lse within the
    accuracy rule on both launches; C3_N64 takes causal d128 only."""
    tool = _tool("variants_gluon_checks")
    from fa_bench.kernels import flash_attention
    from fa_bench.run.accuracy import _tensor_report

    pattern, b, hq, hk, sq, sk, d, causal = shape
    if form.startswith("sum") and not (launch == "c3" and causal and d == 128):
        pytest.skip("the sum check rides on 64-key launches only (C3_N64: causal d128)")
    want_bits = _switch(monkeypatch, form)
    every = {"fp16": frozenset({"softcap"})}
    monkeypatch.setattr(vh, "C3_KINDS", every if launch == "c3" else {})
    seen, bits = _spy(monkeypatch)
    g = torch.Generator(device="cuda").manual_seed(sq * 3 + sk)
    q, k, v = _crafted(pattern, b, hq, hk, sq, sk, d, g)
    kw = dict(causal=causal, softcap=50.0)
    o, lse = flash_attention(q, k, v, config=tool.GLUON, return_lse=True, **kw)
    ref = tool._reference([t.double() for t in (q, k, v)], None, torch.float64, kw)
    base = tool._reference([q, k, v], None, FP16, kw)
    res = tool._lse({"o": _tensor_report(o, o, ref.o, base.o, sk)}, lse, ref.lse, base.lse)
    assert all(r["passed"] for r in res.values()), res
    c3 = launch == "c3" and causal and d == 128
    want = vh.C3_N64.label() if c3 else "ws-m64-n128-s3" if d == 128 else "ws-m64-n128-s4"
    assert seen and set(seen) == {want}, seen
    assert bits and all(x & want_bits == want_bits for x in bits), bits


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("case", _CHECKS, ids=[f"lazy {c[0]}" for c in _CHECKS])
def test_gpu_lazy_fp16_softcap_checks(case, form, monkeypatch):
    """Every fp16 softcap check with SOFTCAP_LAZY_FP16 on (and LAZY_WARP), on the launch
    the dispatch picks (C3_N64 for causal d128 softcap alone), passes the accuracy rule."""
    _id, fn, args, kw = case
    if form.startswith("sum") and (kw.get("alibi") or "alibi" in _id):
        pytest.skip("the sum check leaves ALiBi on the running max")
    want = _switch(monkeypatch, form)
    seen, bits = _spy(monkeypatch)
    res = fn(*args, **kw)
    assert all(r["passed"] for r in res.values()), res
    assert seen and bits, (seen, bits)
    if form.startswith("sum"):  # on the 64-key launch only (C3_N64); the others: running max
        c3 = vh.C3_N64.label()
        assert all(bool(b & want) == (s == c3) for s, b in zip(seen, bits, strict=True)), (
            seen, bits,
        )  # fmt: skip
    else:
        assert all(b & want == want for b in bits), (seen, bits)


def test_gpu_lazy_off_by_default_runs_the_running_max():
    """The committed default carries no LAZY bit (the switch is off); the sum check (session
    10's default) rides on 64-key launches only."""
    from fa_bench.kernels.flash_validate import Variant

    assert not vh.SOFTCAP_LAZY_FP16 and not vh.SOFTCAP_LAZY_WARP and vh.SOFTCAP_SUM_FP16
    cap = Variant(window=None, softcap=50.0, slopes=None, varlen=None, tanh=1)
    assert not vh.variant_bits(cap, 0, True, FP16, 128**-0.5, 128) & (vh._LAZY | vh._SUMCHECK)
    assert vh.variant_bits(cap, 0, True, FP16, 128**-0.5, 64) & vh._SUMCHECK
