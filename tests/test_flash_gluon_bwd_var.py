"""Issue 19's variants in the Gluon backward, on a CPU: which variants it takes, the kernel's
VAR bits and runtime values, the plan's key, the dispatch of flash_attention's backward,
and the registry's backend label. The kernel itself runs on the GPU
(tests/test_flash_gluon_bwd_var_gpu.py); its compile is `tools/gpu/gluon_bwd_compile.py
--var`."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from test_flash_gluon_bwd import runnable  # noqa: F401 (the fixture)

from fa_bench.kernels import flash_gluon, flash_gluon_bwd, flash_gluon_bwd_plan
from fa_bench.kernels.flash_config import FlashConfig
from fa_bench.kernels.flash_gluon_bwd_varhost import (
    dq_scale,
    k_scaled,
    stand_in,
    variant_args,
    variant_bits,
    variant_key,
    variant_reason,
)
from fa_bench.kernels.flash_validate import Variant, Varlen, make_variant

LOG2E = 1.4426950408889634


def _variant(window=None, softcap=0.0, slopes=None, tanh=1, varlen=None) -> Variant:
    return Variant(window=window, softcap=softcap, slopes=slopes, varlen=varlen, tanh=tanh)


def test_the_gluon_backward_takes_windows_softcap_and_alibi_not_packed_batches():
    slopes = torch.ones(2, 4)
    assert variant_reason(None, 128, True) is None
    for v in (_variant(window=(10, 0)), _variant(softcap=30.0), _variant(slopes=slopes),
              _variant(window=(5, 5), softcap=2.0, slopes=slopes)):  # fmt: skip
        assert variant_reason(v, 128, True) is None
    cu = torch.tensor([0, 3, 7], dtype=torch.int32)
    packed = _variant(varlen=Varlen(cu, cu, 4, 4))
    assert "packed" in variant_reason(packed, 128, True)
    # libdevice's tanh (FAST_TANH off) and the packed bf16x2 one: not the kernel's
    for tanh in (0, 2):
        assert f"tanh={tanh}" in variant_reason(_variant(softcap=30.0, tanh=tanh), 128, True)
    assert variant_reason(_variant(window=(3, 0), tanh=0), 128, True) is None  # no tanh


@pytest.mark.parametrize(
    ("head_dim", "causal", "kw", "takes"),
    [(64, True, dict(softcap=50.0), True), (64, False, dict(softcap=50.0), True),
     (64, True, dict(alibi=True), True), (64, False, dict(alibi=True), False),
     (64, True, dict(alibi=True, softcap=50.0), False),
     (64, True, dict(window=(9, 0), alibi=True), True),
     (64, True, dict(window=(9, 0), softcap=50.0), False), (64, True, dict(window=(9, 0)), True),
     (128, False, dict(alibi=True, softcap=50.0), True),
     (128, False, dict(window=(9, 9), alibi=True, softcap=50.0), False),
     (128, True, dict(window=(9, 0), alibi=True, softcap=50.0), True)],
)  # fmt: skip
def test_launches_that_spill_keep_the_two_kernel_backward(head_dim, causal, kw, takes):
    """Session 17 call 5 (bf16 d64 8k): ALiBi non-causal and ALiBi with the softcap, whose
    consumers spill 0.6-1.8 KB, ran 0.46-0.91x the two-kernel backward; the launches that
    spill as much keep it too (flash_gluon_bwd_varhost._SPILLS)."""
    slopes = torch.ones(1, 4) if kw.pop("alibi", False) else None
    reason = variant_reason(_variant(slopes=slopes, **kw), head_dim, causal)
    assert (reason is None) is takes, reason
    if not takes:
        assert f"head_dim={head_dim}" in reason and "spills" in reason


def test_the_kernel_bits_and_values():
    slopes = torch.arange(8, dtype=torch.float32).view(2, 4)
    assert variant_bits(None) == 0 and variant_args(None, 0.1) == (0, 0, 0.0, 0.0, None, 0)
    v = _variant(window=(100, 0), softcap=50.0, slopes=slopes)
    assert variant_bits(v, 0.125) == 15  # a softcap scales K (K_SCALED, 8)
    assert variant_bits(_variant(window=(1, 2))) == 1
    assert variant_bits(_variant(softcap=3.0)) == 2 | 8
    assert variant_bits(_variant(slopes=slopes)) == 4
    left, right, cap_in, cap_out, s, stride_b = variant_args(v, 0.125)
    assert (left, right, s, stride_b) == (100, 0, slopes, 4)
    assert cap_in == pytest.approx(0.125 / 50.0) and cap_out == pytest.approx(50.0 * LOG2E)
    # (H,) slopes reach the kernel as a (B, H) view with batch stride 0
    q = torch.empty(3, 4, 16, 64)
    one = make_variant(q, causal=True, window=(-1, -1), alibi_slopes=torch.ones(4),
                       softcap=0.0, batch=3, seq_q=16, seq_k=16)  # fmt: skip
    assert variant_args(one, 0.1)[5] == 0 and variant_bits(one) == 4


def test_k_is_scaled_for_a_softcap_where_fp16_keeps_it_normal():
    """K · scale / c in fp16 stays normal for |k| >= 2^-4 while scale / c >= 2^-10; bf16
    always. dQ's cast then multiplies by c (scale · dS K = c · dS K')."""
    cap = _variant(softcap=50.0)
    assert k_scaled(cap, 0.088, fp16=False) and k_scaled(cap, 0.088, fp16=True)
    assert k_scaled(cap, 0.04, fp16=False) and not k_scaled(cap, 0.04, fp16=True)
    assert not k_scaled(None, 0.1, False) and not k_scaled(_variant(window=(1, 0)), 0.1, False)
    assert dq_scale(cap, 0.088, False) == 50.0 and dq_scale(cap, 0.04, True) == 0.04
    assert dq_scale(None, 0.1, False) == 0.1
    assert variant_bits(cap, 0.04, fp16=True) == 2


def test_the_plan_key_holds_the_variant_and_the_stand_in_its_slopes():
    slopes = torch.ones(2, 4)
    a = _variant(window=(100, 0), slopes=slopes)
    assert variant_key(None) == ()
    keys = {variant_key(x) for x in (a, dataclasses.replace(a, window=(101, 0)),
                                     dataclasses.replace(a, softcap=1.0),
                                     dataclasses.replace(a, slopes=slopes.clone()))}  # fmt: skip
    assert len(keys) == 4  # bounds, softcap and the slopes' address each make a new key
    ptr = stand_in(a, lambda t: ("ptr", t.data_ptr()))
    assert ptr.slopes == ("ptr", slopes.data_ptr()) and ptr.window == a.window
    assert stand_in(None, str) is None and stand_in(_variant(window=(1, 1)), str).slopes is None


def test_main_call_passes_the_variant():
    pytest.importorskip("triton.experimental.gluon")
    from test_flash_gluon_bwd_plan import CFG, _io

    (q, k, v, _, do, dk, dv, _, dq_ws), lse2, delta = _io((2, 4, 64, 128), heads_kv=2)
    slopes = torch.rand(2, 4)
    var = _variant(window=(30, 0), softcap=20.0, slopes=slopes)
    tensors = (q, k, v, do, dk, dv, dq_ws)
    _, _, args, kw = flash_gluon_bwd_plan.main_call(CFG, tensors, lse2, delta, True, 0.1,
                                                    variant=var)  # fmt: skip
    assert kw["VAR"] == 15 and args[-6:-2] == (30, 0, 0.1 / 20.0, 20.0 * LOG2E)
    assert args[-2] is slopes and args[-1] == 4
    _, _, dense, kw = flash_gluon_bwd_plan.main_call(CFG, tensors, lse2, delta, True, 0.1)
    assert kw["VAR"] == 0 and len(dense) == len(args) and dense[9:-6] == args[9:-6]
    # dQ's cast: c where K was scaled by scale / c, else the scale
    post = flash_gluon_bwd_plan.steps(CFG, (q, k, v, None, do, dk, dv, q, dq_ws), lse2, delta,
                                      True, 0.1, variant=var)[1]()  # fmt: skip
    assert post[2][-1] == 20.0
    key = flash_gluon_bwd_plan.plan_key
    assert key(CFG, tensors, lse2, delta, True, 0.1, var) != key(CFG, tensors, lse2, delta,
                                                                 True, 0.1)  # fmt: skip


@pytest.mark.usefixtures("runnable")
def test_backward_choice_and_reason_follow_the_variant():
    q = torch.randn(1, 2, 64, 128, dtype=torch.float16)
    cfg = FlashConfig()
    assert flash_gluon_bwd.backward_choice(q, q, q, q, q, True, cfg, default=True,
                                           variant=_variant(window=(8, 0))) is not None  # fmt: skip
    cu = torch.tensor([0, 64], dtype=torch.int32)
    packed = _variant(varlen=Varlen(cu, cu, 64, 64))
    assert flash_gluon_bwd.backward_choice(q, q, q, q, q, True, cfg, default=True,
                                           variant=packed) is None  # fmt: skip
    with pytest.raises(ValueError, match="packed"):
        flash_gluon_bwd.backward_choice(q, q, q, q, q, True, FlashConfig(backward="gluon"),
                                        variant=packed)  # fmt: skip
    with pytest.raises(ValueError, match="packed"):
        flash_gluon_bwd.gluon_backward(q, q, q, q, q, torch.zeros(1, 2, 64), True, 0.1,
                                       variant=packed)  # fmt: skip


def _route(monkeypatch, deterministic, gluon_ok=True, backward="auto"):
    """Which backward flash_attention._backward runs for a softcap variant: "gluon" (with
    the variant it got), "two-kernel", or the ValueError's text."""
    import importlib

    fa = importlib.import_module("fa_bench.kernels.flash_attention")

    seen = []
    monkeypatch.setattr(flash_gluon, "gluon_reason",
                        lambda *a: None if gluon_ok else "not sm_90")  # fmt: skip
    monkeypatch.setattr(flash_gluon_bwd, "gluon_backward",
                        lambda *a, **kw: seen.append(("gluon", kw["variant"])))  # fmt: skip
    monkeypatch.setattr(fa, "_backward_deterministic",
                        lambda *a: seen.append(("two-kernel", a[-1])))  # fmt: skip
    q = torch.randn(1, 2, 64, 128, dtype=torch.float16)
    var = _variant(softcap=30.0)
    try:
        fa._backward(q, q, q, q, q, torch.zeros(1, 2, 64), True, 0.1,
                     FlashConfig(backward=backward), deterministic, var)  # fmt: skip
    except ValueError as e:
        return str(e)
    assert seen[0][1] is var
    return seen[0][0]


def test_flash_attention_routes_a_variant_backward(monkeypatch):
    assert _route(monkeypatch, None) == "gluon"
    assert _route(monkeypatch, False) == "gluon"
    assert _route(monkeypatch, True) == "two-kernel"
    assert _route(monkeypatch, None, gluon_ok=False) == "two-kernel"
    assert "not sm_90" in _route(monkeypatch, False, gluon_ok=False)
    assert "backward='tl'" in _route(monkeypatch, False, backward="tl")


@pytest.mark.usefixtures("runnable")
def test_the_backend_label_names_the_gluon_backward_of_a_variant():
    from fa_bench.case import Case
    from fa_bench.kernels import triton_impl
    from fa_bench.sweep.vocab import config_label

    q = torch.randn(1, 2, 64, 128, dtype=torch.float16)
    cfg = FlashConfig()
    tl_label = config_label(cfg, "bwd")
    gluon = flash_gluon_bwd.gluon_bwd_config(128, causal=True).label()
    softcap = Case("triton", "bwd", "fp16", 1, 2, 2, 64, 64, 128, True, softcap=30.0)
    got = triton_impl._backward_named(tl_label, softcap, cfg, q, q, q, None)
    assert got.endswith(gluon)
    assert triton_impl._backward_named(tl_label, softcap, cfg, q, q, q, True) == tl_label
