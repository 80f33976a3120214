"""Issue 19's variants in the Gluon forward (kernels/flash_gluon_var*.py,
kernels/flash_gluon_varhost.py) and their dispatch (kernels/flash_dispatch.py).

CPU: the VAR bits, what the kernel refuses and why, when "auto" takes it, the launch it
runs, the kernel arguments (units of sc, cap_mul, alibi_mul; packed strides), the
dispatch for variant calls (auto / forced / tl, CPU tensors). `slow`: every VAR
combination compiled for sm_90 with triton 3.6 (tools/gluon_compile.py --variants, where
one is available: the installed one or $GLUON_TRITON_PATH), and the GPU script's checks
run through the `tl` kernel in the interpreter (its own plumbing: (B, H) slopes, packed
references, the lse check). GPU (`-m gpu`, sm_90): every check of
tools/gpu/variants_gluon.py (each variant and combination, GQA, Sq ≠ Sk, rows without
keys, packed sequences of length 1, bf16/fp16, d64/d128, gradients of our `tl` backward
on the Gluon forward's output) against the float64 reference under the accuracy rule.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import itertools
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from gluon_bwd_helpers import triton36_path

from fa_bench.kernels import flash_dispatch, flash_gluon
from fa_bench.kernels import flash_gluon_varhost as vh
from fa_bench.kernels.flash_config import FlashConfig
from fa_bench.kernels.flash_gluon import GluonConfig, gluon_config
from fa_bench.kernels.flash_validate import Variant, Varlen, make_variant

ROOT = Path(__file__).resolve().parent.parent
LOG2E = 1.4426950408889634


def _qkv(shape=(1, 2, 4096, 128), dtype=torch.float16):
    return tuple(torch.randn(shape, dtype=dtype) for _ in range(3))


def _variant(**kw) -> Variant:
    q = torch.zeros((2, 4, 8, 64), dtype=torch.bfloat16)
    args = dict(causal=False, window=(-1, -1), alibi_slopes=None, softcap=0.0)
    args.update(kw)
    variant = make_variant(q, batch=2, seq_q=8, seq_k=8, **args)
    assert variant is not None
    return variant


def _packed(max_q=3000, max_k=3000) -> Variant:
    cu = torch.tensor([0, 5, 9], dtype=torch.int32)
    return Variant(varlen=Varlen(cu, cu, max_q, max_k))


# --- the variant's form -----------------------------------------------------------------


def test_variant_bits_name_each_variant_and_match_the_kernel_constants():
    assert vh.variant_bits(_variant(window=(4, -1))) == 1
    assert vh.variant_bits(_variant(softcap=50.0)) == 2
    assert vh.variant_bits(_variant(alibi_slopes=torch.ones(4))) == 4
    assert vh.variant_bits(_packed()) == 8
    both = _variant(causal=True, window=(4, -1), softcap=5.0, alibi_slopes=torch.ones(2, 4))
    assert vh.variant_bits(both) == 7
    kernel = pytest.importorskip("fa_bench.kernels.flash_gluon_var")  # needs triton's Gluon
    names = ("WINDOW", "SOFTCAP", "ALIBI", "VARLEN", "TANH_F16X2")
    got = [int(getattr(kernel, n).value) for n in names]
    assert got == [vh._WINDOW, vh._SOFTCAP, vh._ALIBI, vh._VARLEN, vh._TANH_F16X2]


def test_the_development_switches_mark_softcap_launches_only(monkeypatch):
    monkeypatch.setattr(vh, "TANH_F16X2", True)
    assert vh.variant_bits(_variant(softcap=50.0)) == 2 | 16
    assert vh.variant_bits(_variant(window=(4, -1))) == 1  # no softcap: no tanh at all
    # the softmax code above the variant bits: the config's (exp2 split + 16 for tree
    # reductions), or SOFTCAP_EMU's split for a softcap (the tree kept)
    assert vh.variant_bits(_variant(window=(4, -1)), softmax=4) == 1 | 4 << 6
    cfg = dataclasses.replace(gluon_config(128, causal=True), exp2_emu=8, tree_reduce=True)
    assert vh.variant_bits(_variant(window=(4, -1)), cfg.softmax_code()) == 1 | 24 << 6
    monkeypatch.setattr(vh, "SOFTCAP_EMU", 2)
    assert vh.variant_bits(_variant(softcap=50.0), softmax=4) == 2 | 16 | 2 << 6
    assert vh.variant_bits(_variant(softcap=50.0), softmax=24) == 2 | 16 | 18 << 6
    assert vh.variant_bits(_variant(window=(4, -1))) == 1
    monkeypatch.setattr(vh, "SOFTCAP_EMU", 0)
    monkeypatch.setattr(vh, "QSCALE", True)  # Q scaled once per tile: softcap launches
    assert vh.variant_bits(_variant(softcap=50.0)) == 2 | 16 | 32
    assert vh.variant_bits(_variant(window=(4, -1))) == 1
    monkeypatch.setattr(vh, "QSCALE", False)
    monkeypatch.setattr(vh, "TREE", True)  # tree reductions for every variant launch
    assert vh.variant_bits(_variant(window=(4, -1))) == 1 | 16 << 6
    assert vh.variant_bits(_variant(softcap=50.0), softmax=2) == 2 | 16 | 18 << 6


def test_the_gpu_script_runs_each_development_mode_with_its_switches(monkeypatch):
    tool = _tool("variants_gluon_checks")
    seen = []
    cases = [("a", None, (), dict(softcap=5.0)), ("b", None, (), dict(window=(1, 1)))]
    monkeypatch.setattr(tool, "_cases", lambda d: cases)
    cases = tool._dev_cases(("bf16",), ["tanh f16x2", "emu 2"])
    assert [c[0] for c in cases] == ["a [tanh f16x2]", "a [emu 2]"]
    for _name, _fn, args, kw in cases:
        tool._run_check(lambda **k: seen.append((vh.TANH_F16X2, vh.SOFTCAP_EMU)), args, kw)
    assert seen == [(True, 0), (False, 2)]
    assert (vh.TANH_F16X2, vh.SOFTCAP_EMU, vh.QSCALE) == (False, 0, False)  # back off
    qs = tool._dev_cases(("bf16",), ["qscale"])[0]
    tool._run_check(lambda **k: seen.append(vh.QSCALE), qs[2], qs[3])
    assert seen[-1] is True and vh.QSCALE is False


def test_only_a_softcap_without_the_fast_tanh_is_refused(monkeypatch):
    assert vh.variant_reason(_variant(window=(3, 2), alibi_slopes=torch.ones(4))) is None
    assert vh.variant_reason(_variant(softcap=50.0)) is None  # tanh.approx.f32 (bf16)
    from fa_bench.kernels import flash_validate

    monkeypatch.setattr(flash_validate, "FAST_TANH", False)
    reason = vh.variant_reason(_variant(softcap=50.0))
    assert reason and "tanh mode 0" in reason and "tanh.approx.f32" in reason
    monkeypatch.setattr(flash_validate, "FAST_TANH", True)
    monkeypatch.setattr(flash_validate, "PACKED_TANH", True)
    assert "tanh mode 2" in vh.variant_reason(_variant(softcap=50.0))
    assert vh.variant_reason(_variant(window=(3, 2))) is None  # no softcap: no tanh


def test_auto_prefers_it_by_the_dense_rule_on_the_longest_keys():
    k = torch.zeros((1, 2, 4096, 128))
    assert vh.variant_preferred(k, 128, _variant(window=(4, -1)))
    assert not vh.variant_preferred(k[:, :, :512], 128, _variant(window=(4, -1)))
    assert vh.variant_preferred(k, 64, _variant(softcap=5.0))  # d64: from 4k
    assert not vh.variant_preferred(k[:, :, :2048], 64, _variant(softcap=5.0))
    assert not vh.variant_preferred(k, 256, _variant(softcap=5.0))  # d256: not measured
    # a packed batch: its longest sequence, not the token total
    assert not vh.variant_preferred(k, 128, _packed(max_k=600))
    assert vh.variant_preferred(k[:, :, :8], 128, _packed(max_k=3000))


def test_the_launch_is_the_non_persistent_ws_kernel():
    ws = gluon_config(128, causal=True)
    assert ws.variant == "ws" and not ws.persistent
    assert vh.variant_config(ws, 128) == ws
    # persistent (two Q buffers, a 2-deep ring): one Q buffer, the deepest ring again
    persist = dataclasses.replace(ws, persistent=True, q_buffers=2, stages=2)
    assert vh.variant_config(persist, 128) == ws
    pipelined = gluon_config(64, causal=True)
    assert pipelined.variant == "pipelined"
    got = vh.variant_config(pipelined, 64)
    assert got == GluonConfig(block_n=128, stages=4)  # the deepest ring that fits at d64
    # three consumers (d64 non-causal's dense heuristic since session 5's call C): the
    # variants keep the two-consumer launch they were built and measured with
    c3 = GluonConfig(block_n=64, stages=4, consumers=3, pingpong=False, consumer_regs=160)
    assert vh.variant_config(c3, 64) == got
    assert vh.variant_config(gluon_config(64), 64) == got


def test_kernel_args_fold_the_constants():
    o = torch.zeros((1, 4, 9, 64)).transpose(1, 2).contiguous().transpose(1, 2)
    scale = 0.125
    sc, args = vh._kernel_args(_variant(window=(7, 3)), scale, o)
    assert sc == pytest.approx(scale * LOG2E)
    assert (args["win_left"], args["win_right"]) == (7, 3)
    assert args["cap_mul"] is None and args["slopes_ptr"] is None and args["cu_q"] is None
    sc, args = vh._kernel_args(_variant(softcap=50.0, alibi_slopes=torch.ones(4)), scale, o)
    # s = tanh(q·k · scale / c): scores c · log2(e) · s; ALiBi m · log2(e) / sc in s units
    assert sc == pytest.approx(50.0 * LOG2E)
    assert args["cap_mul"] == pytest.approx(scale / 50.0)
    assert args["alibi_mul"] == pytest.approx(LOG2E / sc)
    assert args["stride_slope_b"] == 0  # (H,) slopes: a (B, H) view with batch stride 0
    assert args["win_left"] is None
    sc, args = vh._kernel_args(_variant(alibi_slopes=torch.ones(2, 4)), scale, o)
    assert args["alibi_mul"] == pytest.approx(1.0 / scale)  # log2(e) / (scale · log2(e))
    assert args["stride_slope_b"] == 4
    _, args = vh._kernel_args(_packed(), scale, o)
    assert args["o_ptr"] is o and (args["stride_os"], args["stride_oh"]) == (4 * 64, 64)


def test_the_forward_refuses_a_variant_it_cannot_run(monkeypatch):
    from fa_bench.kernels import flash_validate

    q, k, v = _qkv()
    monkeypatch.setattr(flash_validate, "FAST_TANH", False)
    with pytest.raises(ValueError, match=r"variant_forward cannot run.*(CUDA|INTERPRET)"):
        vh.variant_forward(q, k, v, False, 0.1, gluon_config(128), _variant(window=(4, 4)))
    monkeypatch.setattr(vh, "gluon_reason", lambda *a: None)
    with pytest.raises(ValueError, match="tanh mode 0"):
        vh.variant_forward(q, k, v, False, 0.1, gluon_config(128), _variant(softcap=5.0))
    persist = dataclasses.replace(gluon_config(128), persistent=True)
    with pytest.raises(ValueError, match="non-persistent 'ws' kernel"):
        vh.variant_forward(q, k, v, False, 0.1, persist, _variant(window=(4, 4)))


# --- the dispatch -----------------------------------------------------------------------


def test_auto_takes_the_gluon_kernel_for_a_variant_where_it_would_for_dense(monkeypatch):
    q, k, v = _qkv()
    monkeypatch.setattr(flash_gluon, "gluon_reason", lambda *a: None)
    window = _variant(causal=True, window=(4, -1))
    for causal in (False, True):
        got = flash_dispatch.gluon_choice(q, k, v, causal, FlashConfig(), window)
        assert got == vh.variant_config(gluon_config(128, causal), 128)
        assert got.variant == "ws" and not got.persistent
    # too short for the rule: the `tl` kernel
    short = tuple(t[:, :, :512] for t in (q, k, v))
    assert flash_dispatch.gluon_choice(*short, False, FlashConfig(), window) is None
    # forced: the Gluon kernel however short
    assert flash_dispatch.gluon_choice(*short, False, FlashConfig(forward="gluon"), window)
    assert flash_dispatch.gluon_choice(q, k, v, False, FlashConfig(forward="tl"), window) is None
    # a forced pipelined / persistent launch: the variants run the ws kernel's form
    cfg = FlashConfig(forward="gluon", gluon_persistent=True)
    assert flash_dispatch.gluon_choice(q, k, v, False, cfg, window).persistent is False


def test_a_variant_the_kernel_cannot_run_goes_to_tl_or_is_refused_with_the_reason(monkeypatch):
    from fa_bench.kernels import flash_validate

    q, k, v = _qkv()
    monkeypatch.setattr(flash_gluon, "gluon_reason", lambda *a: None)
    monkeypatch.setattr(flash_validate, "FAST_TANH", False)
    capped = _variant(softcap=5.0)
    assert flash_dispatch.gluon_choice(q, k, v, False, FlashConfig(), capped) is None
    with pytest.raises(ValueError, match=r"forward='gluon'.*tanh mode 0"):
        flash_dispatch.gluon_choice(q, k, v, False, FlashConfig(forward="gluon"), capped)


def test_cpu_tensors_run_variants_in_tl_and_a_forced_gluon_says_why():
    q, k, v = _qkv(shape=(1, 2, 64, 64))
    window = _variant(window=(4, 4))
    assert flash_dispatch.gluon_choice(q, k, v, False, FlashConfig(), window) is None
    with pytest.raises(ValueError, match=r"forward='gluon'.*(CUDA|INTERPRET)"):
        flash_dispatch.gluon_choice(q, k, v, False, FlashConfig(forward="gluon"), window)


# --- compiled for sm_90 on a CPU --------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(1800)  # 150-200 compiles: over 15 minutes on two busy cores
def test_every_variant_combination_compiles_for_sm90():
    path = triton36_path()
    if path is None:
        pytest.skip("no triton 3.6 here: set GLUON_TRITON_PATH to one installed aside")
    out = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "gluon_compile.py"), "--quick", "--variants"],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=path),
        timeout=1800,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    # every VAR combination (tools/gluon_compile.VAR_BITS, which grows with the variants'
    # launches) x 3 head dims x causal both: 108 in session 5, 156 in 6, 192 in 9
    found = re.search(r"(\d+) combinations, (\d+) failed", out.stdout)
    assert found, out.stdout[-3000:]
    assert int(found[1]) >= 108 and int(found[1]) % 6 == 0 and found[2] == "0", found[0]


# --- the GPU script's checks ------------------------------------------------------------


def _tool(name: str = "variants_gluon"):
    """A fresh instance of tools/gpu/<name>.py (its globals are this test's to set)."""
    path = ROOT / "tools" / "gpu" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.parametrize(
    "kind, args, kw",
    [
        ("dense", (1, 3, 1, 40, 70), dict(causal=True, window=(8, -1), alibi="bh")),
        ("dense", (2, 2, 2, 50, 30), dict(causal=True, window=(6, -1), softcap=5.0)),
        ("dense", (1, 2, 1, 32, 128), dict(causal=True, window=(8, -1), nan_keys=64)),
        ("packed", ([1, 37, 1, 20], [1, 37, 1, 20], 2, 1), dict(causal=True, alibi="bh")),
        ("packed", ([3, 1, 20], [9, 1, 12], 2, 2), dict(causal=True, window=(4, 2))),
    ],
)
def test_the_gpu_checks_pass_a_right_forward_and_catch_a_wrong_one(kind, args, kw):
    """The script's checks through our `tl` kernel in the interpreter (fp32): they pass
    it, including the empty rows' lse; and a forward that drops the ALiBi / window fails."""
    tool = _tool("variants_gluon_checks")
    tool.DEVICE, tool.CHECKED = "cpu", FlashConfig(forward="tl", block_m=16, block_n=16)
    check = tool._dense_check if kind == "dense" else tool._varlen_check
    res = check(torch.float32, 16, *args, **kw)
    assert all(r["passed"] for r in res.values()), res
    assert math.isfinite(res["o"]["max_abs_err"])
    # the same check of a forward that drops the ALiBi (or the window) fails
    drop = {"alibi_slopes": None} if "alibi" in kw else {"window": (-1, -1)}

    def dropping(fn):
        return lambda *a, **k: fn(*a, **dict(k, **drop))

    tool.flash_attention = dropping(tool.flash_attention)
    tool.flash_attention_varlen = dropping(tool.flash_attention_varlen)
    res = check(torch.float32, 16, *args, **kw)
    assert not all(r["passed"] for r in res.values())


def test_the_gpu_report_counts_the_development_checks_apart():
    tool = _tool()
    checks = [
        {"check": "bf16 d128 softcap 50", "passed": True, "detail": {}},
        {"check": "bf16 d128 softcap 50 [tanh f16x2]", "passed": False, "error": "E: x"},
        {"check": "bf16 d128 softcap 50 [emu 2]", "passed": True, "detail": {}},
        {"check": "bf16 d128 packed causal [1, 300]", "passed": True, "detail": {}},
    ]
    rows = [{"variant": "softcap 50 causal", "shape": "8 x 8192", "gluon": 500.0,
             "tl": 400.0, "dense gluon": 550.0, "flex": "error X"}]  # fmt: skip
    text = tool.report(checks, rows)
    assert "## Correctness: 2 / 2 passed" in text  # a name ending in "]" is no mode
    assert "Development modes (not the default): 1 / 2 passed" in text
    assert "- FAIL bf16 d128 softcap 50 [tanh f16x2]: E: x" in text
    assert (
        "| softcap 50 causal | 8 x 8192 | 500.0 | 400.0 | 550.0 | error X | 0.909 | 1.250 |  |"
        in text
    )


needs_gluon_gpu = pytest.mark.skipif(
    not torch.cuda.is_available()
    or os.environ.get("TRITON_INTERPRET") == "1"
    or torch.cuda.get_device_capability() != (9, 0),
    reason="needs an sm_90 GPU",
)


def _case_names() -> list[str]:
    return [name for name, *_ in _tool("variants_gluon_checks")._cases()]


@pytest.mark.gpu
@needs_gluon_gpu
@pytest.mark.parametrize("name", _case_names())
def test_gpu_variant_against_the_float64_reference(name):
    tool = _tool("variants_gluon_checks")
    _, fn, args, kw = next(c for c in tool._cases() if c[0] == name)
    res = fn(*args, **kw)
    assert all(r["passed"] for r in res.values()), res


# --- the backend label ------------------------------------------------------------------


def test_the_backend_label_names_the_kernel_a_variant_case_runs(monkeypatch):
    """triton_impl._forward_named asks the dispatch with the case's own Variant (window,
    ALiBi slopes, softcap; a packed case's documents), so a variant case's backend says
    "gluon-..." where the Gluon kernel runs it."""
    from fa_bench.case import Case
    from fa_bench.kernels import triton_impl
    from fa_bench.variants import varlen_lengths

    seen = []

    def choice(q, k, v, causal, cfg, variant=None):
        seen.append(variant)
        return gluon_config(128, causal=True)

    monkeypatch.setattr(flash_dispatch, "gluon_choice", choice)
    cfg = FlashConfig(block_m=128, block_n=64, num_warps=4, num_stages=3)
    tl_label = "bm128-bn64-w4-s3"
    case = Case("triton", "fwd", "bf16", 2, 4, 2, 64, 96, 128, True, window_left=16, alibi=True,
                softcap=30.0)  # fmt: skip
    q = torch.zeros((2, 4, 64, 128), dtype=torch.bfloat16)
    k = torch.zeros((2, 2, 96, 128), dtype=torch.bfloat16)
    label = triton_impl._forward_named(tl_label, case, cfg, q, k, k)
    assert label == f"gluon-{gluon_config(128, causal=True).label()}"
    variant = seen[-1]
    assert variant.window == (16, 0) and variant.softcap == 30.0
    assert tuple(variant.slopes.shape) == (2, 4) and variant.varlen is None
    lens = varlen_lengths("uniform:8-64", 3)
    packed = Case("triton", "fwd_bwd", "bf16", 3, 4, 2, max(lens), max(lens), 128, True,
                  varlen="uniform:8-64")  # fmt: skip
    q = torch.zeros((1, 4, sum(lens), 128), dtype=torch.bfloat16)
    triton_impl._forward_named(tl_label, packed, cfg, q, q[:, :2], q[:, :2])
    vl = seen[-1].varlen
    assert (vl.batch, vl.max_q, vl.max_k) == (3, max(lens), max(lens))
    assert vl.cu_q.tolist() == [0, *itertools.accumulate(lens)]
    # the tl kernel: the label as it was; bwd: the forward is not what is timed
    monkeypatch.setattr(flash_dispatch, "gluon_choice", lambda *a, **kw: None)
    assert triton_impl._forward_named(tl_label, case, cfg, q, k, k) == tl_label
    bwd = dataclasses.replace(case, mode="bwd")
    assert triton_impl._forward_named(tl_label, bwd, cfg, q, k, k) == tl_label


@pytest.mark.gpu
@needs_gluon_gpu
def test_gpu_auto_runs_a_variant_in_the_gluon_kernel():
    """On the H200 a variant call at d128 from 1k keys takes the Gluon kernel under
    "auto": the same bits as the forced launch, not the `tl` kernel's."""
    from fa_bench.kernels import flash_attention

    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (
        torch.randn((1, 4, 2048, 128), generator=g, device="cuda").bfloat16() for _ in range(3)
    )
    kw = dict(causal=True, window=(256, -1), softcap=30.0)
    variant = make_variant(q, causal=True, window=(256, -1), alibi_slopes=None, softcap=30.0,
                           batch=1, seq_q=2048, seq_k=2048)  # fmt: skip
    assert flash_dispatch.gluon_choice(q, k, v, True, FlashConfig(), variant) is not None
    auto = flash_attention(q, k, v, **kw)
    forced = flash_attention(q, k, v, config=FlashConfig(forward="gluon"), **kw)
    tl = flash_attention(q, k, v, config=FlashConfig(forward="tl"), **kw)
    assert torch.equal(auto, forced)
    assert not torch.equal(auto, tl)  # two kernels: not the same rounding everywhere


def test_the_call_d_summary_pairs_each_variant_with_its_control():
    summary = _tool("variants_gluon_summary")
    base = dict(impl="triton", mode="fwd", dtype="bf16", heads_q=32, head_dim=128,
                status="ok", backend="triton:gluon-ws", accuracy={"passed": True})  # fmt: skip
    win = "triton/fwd/bf16/b2-hq32-hkv8-sq32768-sk32768-d128/causal"
    eq = "triton/fwd/bf16/b8-hq32-hkv8-sq2048-sk2048-d128/causal"
    cases = [
        dict(base, id=win, tflops=600.0, seqlen_q=32768, varlen=""),
        dict(base, id=f"{win}/win4096.0", tflops=540.0, seqlen_q=32768, varlen=""),
        dict(base, id=eq, tflops=500.0, seqlen_q=2048, varlen=""),
        dict(
            base,
            id="triton/fwd/bf16/b8-hq32-hkv8-sq3433-sk3433-d128/causal/var-u256.3840",
            tflops=440.0,
            seqlen_q=3433,
            varlen="uniform:256-3840",
        ),
    ]
    table = summary.rows({"cases": cases})
    assert [(r["variant"], round(r["ratio"], 3), r["met"]) for r in table] == [
        ("window 4k causal", 0.9, True),
        ("packed (vs equal lengths)", 0.88, False),
    ]
    text = summary.markdown(table, {"speed": [{"variant": "w", "gluon": 540.0, "flex": 450.0}]})
    assert "| window 4k causal | 540.0 | 600.0 | 0.900 | >= 0.85 | yes |" in text
    assert "- w: ours / flex 1.200" in text
