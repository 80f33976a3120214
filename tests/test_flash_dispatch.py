"""Which forward kernel `flash_attention` runs (kernels/flash_dispatch.py, issue 21): the
Gluon kernel where it can run and measured faster, the `tl` kernel otherwise, and
`FlashConfig.forward` forcing either; the `triton` adapter names the kernel that ran.
CPU tests fake the Gluon side's answers; the GPU test (sm_90) checks the real dispatch.
"""

from __future__ import annotations

import os

import pytest
import torch

from fa_bench.case import Case
from fa_bench.kernels import flash_dispatch, flash_gluon, triton_impl
from fa_bench.kernels.flash_config import FlashConfig
from fa_bench.kernels.flash_gluon import GluonConfig, gluon_config
from fa_bench.kernels.flash_validate import Variant


def _qkv(shape=(1, 2, 64, 64), device="cpu", dtype=torch.float16):
    return tuple(torch.randn(shape, device=device, dtype=dtype) for _ in range(3))


def test_forward_field_is_validated_with_its_choices():
    with pytest.raises(ValueError, match=r"forward must be one of auto, tl, gluon, got 'fast'"):
        FlashConfig(forward="fast")
    assert FlashConfig().forward == "auto"


def test_tl_forced_and_cpu_auto_run_the_tl_kernel():
    q, k, v = _qkv()
    assert flash_dispatch.gluon_choice(q, k, v, False, FlashConfig(forward="tl")) is None
    assert flash_dispatch.gluon_choice(q, k, v, True, FlashConfig()) is None  # CPU tensors


def test_gluon_forced_where_it_cannot_run_says_why():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=r"forward='gluon'.*(CUDA|INTERPRET)"):
        flash_dispatch.gluon_choice(q, k, v, False, FlashConfig(forward="gluon"))
    # a variant (issue 19) forced onto the Gluon kernel: the same reason
    window = Variant(window=(4, 4))
    with pytest.raises(ValueError, match=r"forward='gluon'.*(CUDA|INTERPRET)"):
        flash_dispatch.gluon_choice(q, k, v, False, FlashConfig(forward="gluon"), window)


def test_auto_takes_gluon_where_preferred_and_for_a_variant_by_the_same_rule(monkeypatch):
    q, k, v = _qkv(shape=(1, 2, 4096, 128))
    monkeypatch.setattr(flash_gluon, "gluon_preferred", lambda *a: True)
    monkeypatch.setattr(flash_gluon, "gluon_reason", lambda *a: None)
    for causal in (False, True):
        got = flash_dispatch.gluon_choice(q, k, v, causal, FlashConfig())
        assert got == gluon_config(128, causal)
    # a variant runs the non-persistent "ws" kernel (tests/test_flash_gluon_var.py)
    got = flash_dispatch.gluon_choice(q, k, v, False, FlashConfig(), Variant(window=(4, 4)))
    assert got is not None and got.variant == "ws" and not got.persistent
    monkeypatch.setattr(flash_gluon, "gluon_preferred", lambda *a: False)
    assert flash_dispatch.gluon_choice(q, k, v, False, FlashConfig()) is None
    assert flash_dispatch.gluon_choice(q, k, v, False, FlashConfig(forward="gluon")) is not None


def _case(mode: str, **kw) -> Case:
    return Case("triton", mode, "fp16", 1, 2, 2, 64, 64, 64, False, **kw)


@pytest.mark.parametrize("mode", ["fwd", "fwd_bwd", "bwd"])
def test_the_backend_names_the_forward_kernel_that_runs(monkeypatch, mode):
    chosen = GluonConfig(block_n=128, stages=3)
    monkeypatch.setattr(flash_dispatch, "gluon_choice", lambda *a, **kw: chosen)
    cfg = FlashConfig(block_m=128, block_n=64, num_warps=4, num_stages=3)
    q, k, v = _qkv()
    label = triton_impl._forward_named(
        "bm128-bn64-w4-s3/bwd-bm64-bn128-w8-s2", _case(mode), cfg, q, k, v
    )
    if mode == "bwd":  # the backward's label: the forward is not what is timed
        assert label == "bm128-bn64-w4-s3/bwd-bm64-bn128-w8-s2"
    else:
        assert label == f"gluon-{chosen.label()}/bwd-bm64-bn128-w8-s2"
    monkeypatch.setattr(flash_dispatch, "gluon_choice", lambda *a, **kw: None)
    plain = triton_impl._forward_named("bm128-bn64-w4-s3", _case(mode), cfg, q, k, v)
    assert plain == "bm128-bn64-w4-s3"


def test_a_forward_sweep_times_the_tl_kernel():
    fields = {"block_m": 64, "block_n": 32, "num_warps": 4, "num_stages": 2}
    cfg, source = triton_impl.case_config(_case("fwd"), torch.device("cpu"), fields)
    assert (cfg.forward, cfg.block_m, cfg.block_n, source) == ("tl", 64, 32, "sweep")
    bwd = {"bwd_block_m": 32, "bwd_block_n": 64, "bwd_num_warps": 4, "bwd_num_stages": 2}
    assert triton_impl.case_config(_case("bwd"), torch.device("cpu"), bwd)[0].forward == "auto"


needs_sm90 = pytest.mark.skipif(
    not torch.cuda.is_available()
    or os.environ.get("TRITON_INTERPRET") == "1"
    or torch.cuda.get_device_capability() != (9, 0),
    reason="needs an sm_90 GPU",
)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("head_dim, seq", [(128, 4096), (64, 4096), (64, 1024)])
def test_gpu_auto_dispatch_runs_gluon_where_preferred_and_agrees_with_tl(
    monkeypatch, head_dim, seq
):
    from fa_bench.kernels.flash_attention import flash_attention
    from fa_bench.run.accuracy import check_accuracy

    case = Case("triton", "fwd", "bf16", 1, 4, 4, seq, seq, head_dim, True)
    q, k, v = _qkv(shape=(1, 4, seq, head_dim), device="cuda", dtype=torch.bfloat16)
    calls = []
    real = flash_gluon.gluon_forward
    monkeypatch.setattr(flash_gluon, "gluon_forward",
                        lambda *a, **kw: calls.append(a) or real(*a, **kw))  # fmt: skip
    o = flash_attention(q, k, v, causal=True)
    assert len(calls) == int(flash_gluon.gluon_preferred(q, k, v, True))
    assert check_accuracy(case, q, k, v, o)["passed"]
    o_tl = flash_attention(q, k, v, causal=True, config=FlashConfig(forward="tl"))
    assert len(calls) <= 1  # "tl" never reaches the Gluon kernel
    assert check_accuracy(case, q, k, v, o_tl)["passed"]
    o_gl = flash_attention(q, k, v, causal=True, config=FlashConfig(forward="gluon"))
    assert check_accuracy(case, q, k, v, o_gl)["passed"]
