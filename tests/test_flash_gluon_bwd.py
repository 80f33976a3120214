"""The warp-specialised Gluon backward for sm_90 (issue 18): kernels/flash_gluon_bwd.py,
its kernel (flash_gluon_bwd_kernels.py) and its dispatch (`FlashConfig.backward`).

CPU: `GluonBwdConfig`'s checks, the heuristic fitting shared memory, why it cannot run
(`gluon_bwd_reason`), `gluon_backward`'s argument errors, the lse2/delta rows' padding,
the dispatch (`backward_choice`; `flash_attention(deterministic=False)` keeps the `tl`
one-pass backward by default and where the Gluon kernel cannot run). Gluon kernels do
not run in the interpreter; `slow`: compile every combination for sm_90 with
tools/gpu/gluon_bwd_compile.py where a triton 3.6 is available (the installed one, or
one at $GLUON_TRITON_PATH, e.g. /tmp/tri36). GPU (`-m gpu`, an H200): dq/dk/dv against
the float64 reference under the project's accuracy rule (bf16/fp16, head_dim 64/128,
causal both, GQA, odd lengths, Sq ≠ Sk both ways, a (B, S, H, D) layout), the gradients
against the deterministic backward's within the rule, dK/dV reproducible, the dispatch
taking the kernel on sm_90 and falling back for head_dim 256 and fp32.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest
import torch
from gluon_bwd_helpers import INTERPRETED, ROOT, compile_env, needs_cuda, tool, triton36_path

from fa_bench.kernels import flash_gluon, flash_gluon_bwd
from fa_bench.kernels.flash_config import FlashConfig
from fa_bench.kernels.flash_gluon_bwd import (
    BWD_HEAD_DIMS,
    GluonBwdConfig,
    _session6,
    backward_choice,
    candidate_bwd_configs,
    gluon_backward,
    gluon_bwd_config,
    gluon_bwd_reason,
    tma_rows,
)


def _t(shape=(1, 2, 64, 128), dtype=torch.float16):
    return torch.randn(shape, dtype=dtype)


@pytest.fixture
def runnable(monkeypatch):
    """Pretend the Gluon forward's conditions hold (sm_90, triton 3.6, CUDA tensors), so the
    backward's own checks are reached on a CPU."""
    monkeypatch.setattr(flash_gluon, "gluon_reason", lambda q, k, v, causal: None)


# --- config -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [("block_m", 32), ("keys", 32), ("stages", 0), ("stages", True), ("consumer_regs", 250),
     ("producer_regs", 16), ("consumer_regs", 264)],
)  # fmt: skip
def test_config_rejects_bad_fields_naming_them(field, value):
    with pytest.raises(ValueError, match=rf"GluonBwdConfig\.{field}={value!r}"):
        GluonBwdConfig(**{field: value})


@pytest.mark.parametrize("head_dim", BWD_HEAD_DIMS)
def test_heuristic_and_candidates_fit_shared_memory(head_dim):
    for role, cfg in candidate_bwd_configs(head_dim).items():
        assert cfg.smem_bytes(head_dim) <= flash_gluon.SMEM_BYTES, role
    cfg = gluon_bwd_config(head_dim)
    # the deepest ring that fits (one more stage would not): since session 14 the
    # alternating dQ's staging tile of all columns per consumer leaves no room for a third
    deeper = dataclasses.replace(cfg, stages=cfg.stages + 1) if cfg.stages < 4 else None
    fits = deeper is not None and deeper.smem_bytes(head_dim) <= flash_gluon.SMEM_BYTES
    assert not fits, cfg
    assert (cfg.block_n, cfg.block_m) == (128, 128 if head_dim == 64 else 64)


def test_heuristic_stages_and_labels():
    assert gluon_bwd_config(128).stages == 2 and gluon_bwd_config(64).stages == 2
    # session 6's launch (the heuristic's since session 7: tests/test_flash_gluon_bwd_s7.py):
    # dQ's first chunk early, and non-causal the rotated query order (call C)
    assert _session6(128, False).label() == "gluon-bwd-m64-n128-s2-rot-early"
    assert _session6(128, True).label() == "gluon-bwd-m64-n128-s2-early"
    assert _session6(64, False).label() == "gluon-bwd-m128-n128-s2"  # plain at 64 (call D)
    assert candidate_bwd_configs(128)["ws-plain"].label() == "gluon-bwd-m64-n128-s2"
    assert candidate_bwd_configs(64)["ws-m64"].label() == "gluon-bwd-m64-n128-s4"
    assert candidate_bwd_configs(64)["ws-m64"].smem_bytes(64) <= flash_gluon.SMEM_BYTES
    # FA3's shared dQ halves the staging tiles: a third ring stage fits at head_dim 128
    sdq = candidate_bwd_configs(128)["ws-sdq"]
    assert sdq.shared_dq and sdq.stages == 3 and sdq.label() == "gluon-bwd-m64-n128-s3-sdq"
    # (at head_dim 64 too since session 6, 32-column halves: tests/test_flash_gluon_bwd_s6.py)
    assert candidate_bwd_configs(64)["ws-sdq"].label() == "gluon-bwd-m128-n128-s3-sdq"
    m128 = _session6(64, False)  # FA3's 128-row query blocks at head_dim 64
    assert (m128.block_m, m128.stages) == (128, 2)
    kbm = candidate_bwd_configs(128)["ws-kbmajor"]
    assert kbm.kb_major and kbm.label() == "gluon-bwd-m64-n128-s2-rot-kbmajor-early"
    assert candidate_bwd_configs(64)["ws-pp"].label() == "gluon-bwd-m128-n128-s2-pp"
    with pytest.raises(ValueError, match=r"GluonBwdConfig\.shared_dq=1: expected a bool"):
        GluonBwdConfig(shared_dq=1)
    with pytest.raises(ValueError, match=r"GluonBwdConfig\.rotate=None: expected a bool"):
        GluonBwdConfig(rotate=None)
    assert candidate_bwd_configs(128)["ws-rot"].label() == "gluon-bwd-m64-n128-s2-rot"
    early = candidate_bwd_configs(128)["ws-early"]  # the early chunk alone
    plain = candidate_bwd_configs(64)["ws-plain"]
    assert (early.label(), early.dq_mode, sdq.dq_mode, m128.dq_mode, plain.dq_mode) == (
        "gluon-bwd-m64-n128-s2-early",
        3,
        1,
        0,
        0,
    )
    with pytest.raises(ValueError, match="one dQ schedule"):
        GluonBwdConfig(shared_dq=True, early_dq=True)


# --- why it cannot run --------------------------------------------------------------------


def test_reason_is_the_forward_conditions_first(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    q = _t(dtype=torch.float32)
    assert "q.dtype=torch.float32" in gluon_bwd_reason(q, q, q, q, q, False)
    q = _t()
    assert "CUDA" in gluon_bwd_reason(q, q, q, q, q, True)


def test_reason_head_dim_and_o_do(runnable):
    q = _t()
    assert gluon_bwd_reason(q, q, q, q, q, False) is None
    wide = _t((1, 2, 64, 256))
    assert "head_dim=256" in gluon_bwd_reason(wide, wide, wide, wide, wide, False)
    assert "do (1, 2, 32, 128)" in gluon_bwd_reason(q, q, q, q, _t((1, 2, 32, 128)), False)
    assert "o.dtype=torch.float32" in gluon_bwd_reason(q, q, q, q.float(), q, False)
    assert "last stride" in gluon_bwd_reason(q, q, q, q, _t((1, 2, 128, 64)).transpose(2, 3), False)
    ones = _t((1, 1, 1, 128)).expand(1, 2, 64, 128)
    assert "zero stride (broadcast" in gluon_bwd_reason(q, q, q, q, ones, False)


def test_reason_interpreter(monkeypatch):
    q = _t()
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert "interpreter" in gluon_bwd_reason(q, q, q, q, q, False)


# --- gluon_backward's arguments -----------------------------------------------------------


def test_backward_refuses_what_it_cannot_run(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    q = _t()
    lse2 = torch.zeros(1, 2, 64)
    with pytest.raises(ValueError, match=r"gluon_backward cannot run these inputs: .*CUDA"):
        gluon_backward(q, q, q, q, q, lse2, False, 0.1)


def test_backward_argument_errors(runnable):
    q = _t()
    lse2 = torch.zeros(1, 2, 64)
    with pytest.raises(ValueError, match=r"lse2 \(1, 2, 63\) torch.float32: expected \(1, 2, 64\)"):
        gluon_backward(q, q, q, q, q, lse2[..., :63], False, 0.1)
    with pytest.raises(ValueError, match=r"lse2 .* torch.float16"):
        gluon_backward(q, q, q, q, q, lse2.half(), False, 0.1)
    with pytest.raises(TypeError, match="causal=1: expected a bool"):
        gluon_backward(q, q, q, q, q, lse2, 1, 0.1)
    with pytest.raises(ValueError, match="scale=0: expected a positive float"):
        gluon_backward(q, q, q, q, q, lse2, False, 0)
    with pytest.raises(TypeError, match=r"config=.*expected a GluonBwdConfig"):
        gluon_backward(q, q, q, q, q, lse2, False, 0.1, config=flash_gluon.GluonConfig())
    deep = GluonBwdConfig(stages=4)
    with pytest.raises(ValueError, match="gluon-bwd-m64-n128-s4 at head_dim=128 needs"):
        gluon_backward(q, q, q, q, q, lse2, False, 0.1, config=deep)
    # (shared_dq at head_dim 64, refused here until session 6, now splits dQ's 64 columns
    # into two 32-column halves: tests/test_flash_gluon_bwd_s6.py)


def test_tma_rows_pads_to_16_byte_rows():
    t = torch.randn(2, 3, 1001)
    rows = tma_rows(t)
    assert rows.shape == (6, 1004) and rows.stride() == (1004, 1)
    assert torch.equal(rows[:, :1001], t.reshape(6, 1001))
    assert not rows[:, 1001:].any()  # rows past seq_q read 0 (their Q and dO are 0 too)
    even = torch.randn(2, 3, 1000)
    assert tma_rows(even).data_ptr() == even.data_ptr()  # no copy when aligned
    strided = torch.randn(2, 3, 1008)[..., :1000]  # 16-byte row strides: still a view
    assert tma_rows(strided).stride() == (1008, 1)
    odd = torch.randn(2, 3, 1001)[..., :1000]  # 4004-byte row strides: copied
    assert tma_rows(odd).stride() == (1000, 1) and torch.equal(tma_rows(odd), odd.reshape(6, -1))


# --- the dispatch -------------------------------------------------------------------------


def test_flash_config_backward_field():
    assert FlashConfig().backward == "tl"  # the default is unchanged until measured
    with pytest.raises(ValueError, match="backward must be one of tl, gluon, auto, got 'fast'"):
        FlashConfig(backward="fast")


def test_backward_choice_by_field(runnable):
    q = _t()
    assert backward_choice(q, q, q, q, q, True, FlashConfig()) is None
    assert backward_choice(q, q, q, q, q, True, FlashConfig(backward="auto")) == gluon_bwd_config(
        128, True
    )
    assert backward_choice(q, q, q, q, q, False, FlashConfig(backward="gluon")).stages == 2
    wide = _t((1, 2, 64, 256))
    assert (
        backward_choice(wide, wide, wide, wide, wide, False, FlashConfig(backward="auto")) is None
    )
    with pytest.raises(ValueError, match=r"FlashConfig\(backward='gluon'\) cannot .*head_dim=256"):
        backward_choice(wide, wide, wide, wide, wide, False, FlashConfig(backward="gluon"))


def test_backward_choice_off_sm90(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    q = _t()
    assert backward_choice(q, q, q, q, q, False, FlashConfig(backward="auto")) is None
    with pytest.raises(ValueError, match=r"backward='gluon'.*CUDA"):
        backward_choice(q, q, q, q, q, False, FlashConfig(backward="gluon"))


def test_backend_label_names_the_gluon_backward(runnable):
    """The registry's backend string says which backward ran (triton_impl._backward_named)."""
    from fa_bench.case import Case
    from fa_bench.kernels import triton_impl
    from fa_bench.sweep.vocab import config_label

    q = _t()
    case = Case("triton-onepass", "fwd_bwd", "fp16", 1, 2, 2, 64, 64, 128, True)
    gluon = gluon_bwd_config(128, causal=True).label()  # causal: no rotation
    assert "-rot" not in gluon
    for backward, det, want in (("auto", False, gluon), ("tl", False, None),
                                ("auto", True, None), ("gluon", False, gluon)):  # fmt: skip
        cfg = FlashConfig(backward=backward)
        tl_label = config_label(cfg, "fwd_bwd")
        got = triton_impl._backward_named(tl_label, case, cfg, q, q, q, det)
        assert got == (tl_label if want is None else tl_label.split("/")[0] + "/" + want)


def test_triton_onepass_takes_the_gluon_backward_where_it_runs(monkeypatch):
    """The registry's triton-onepass asks for FlashConfig(backward="auto"), triton for the
    default's choice (backward_choice's `default`); triton-deterministic keeps the
    two-kernel backward (never asks), and so does triton under a sweep's config."""
    import fa_bench.kernels.triton_impl  # noqa: F401  (registers the names)
    from fa_bench.case import Case
    from fa_bench.registry import get

    seen = []

    def choice(*a, default=False, variant=None):
        seen.append((a[-1].backward, default))

    monkeypatch.setattr(flash_gluon_bwd, "backward_choice", choice)
    q = _t((1, 2, 32, 64), torch.float32)
    for impl in ("triton-onepass", "triton", "triton-deterministic"):
        case = Case(impl, "fwd_bwd", "fp32", 1, 2, 2, 32, 32, 64, False)
        get(impl).prepare(case, q, q, q)
    case = Case("triton", "fwd_bwd", "fp32", 1, 2, 2, 32, 32, 64, False)
    get("triton").prepare(case, q, q, q, {"config": {"bwd_block_m": 32}})
    assert seen == [("auto", False), ("tl", True)]


@pytest.mark.skipif(not INTERPRETED, reason="the CPU interpreter's dispatch")
def test_flash_attention_dispatch_in_the_interpreter():
    """deterministic=False: "auto" runs the `tl` one-pass kernel here (the same gradients
    as "tl"), "gluon" names why it cannot run."""
    from fa_bench.kernels.flash_attention import flash_attention

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 16, 16, generator=g).requires_grad_() for _ in range(3))
    grads = {}
    for backward in ("tl", "auto"):
        cfg = FlashConfig(block_m=16, block_n=16, bwd_block_m=16, bwd_block_n=16,
                          backward=backward)  # fmt: skip
        o = flash_attention(q, k, v, causal=True, config=cfg, deterministic=False)
        grads[backward] = torch.autograd.grad(o.sum(), (q, k, v))
    for a, b in zip(grads["tl"], grads["auto"], strict=True):
        assert torch.equal(a, b)
    cfg = FlashConfig(block_m=16, block_n=16, bwd_block_m=16, bwd_block_n=16, backward="gluon")
    o = flash_attention(q, k, v, config=cfg, deterministic=False)
    with pytest.raises(ValueError, match=r"backward='gluon'.*torch.float32"):
        o.sum().backward()


# --- the GPU check's plumbing (tools/gpu/gluon_bwd_check.py), on a CPU ---------------------


def _check_tool():
    return tool("gluon_bwd_check")


@pytest.mark.slow  # ~3 s: the accuracy module's imports and float64 references
def test_check_slices_passes_exact_grads_and_catches_a_wrong_slice():
    from fa_bench.run.accuracy import reference_attention

    tool = _check_tool()
    shape = (2, 4, 2, 40, 56, False)
    g = torch.Generator().manual_seed(0)
    q, do = (torch.randn(2, 4, 40, 64, generator=g) for _ in range(2))
    k, v = (torch.randn(2, 2, 56, 64, generator=g) for _ in range(2))
    ref = reference_attention(*(t.double() for t in (q, k, v)), causal=True, do=do.double())
    grads = tuple(t.float() for t in (ref.dq, ref.dk, ref.dv))
    tensors = (q, k, v, ref.o.float(), do, grads)
    res = tool.check_slices(shape, "bf16", 64, True, tensors, grads)
    assert res["passed"] and res["det_match"]
    wrong = (grads[0], grads[1].clone(), grads[2])
    wrong[1][1, 1, 3, 0] += 1.0  # batch 1, kv head 1: not the accuracy rule's own slice
    res = tool.check_slices(shape, "bf16", 64, True, (*tensors[:5], wrong), grads)
    assert not res["passed"] and not res["det_match"] and res["dk_vs_det"] == pytest.approx(1.0)


def test_check_report_names_failures_hangs_and_ratios():
    tool = _check_tool()
    rows = [
        dict(kind="start", role="ws", dtype="bf16"),
        dict(kind="check", ok=False, error="boom"),
        dict(kind="check", skipped=True),
        dict(kind="start", which="gluon", head_dim=128, n=4096, causal=True),
        dict(kind="bench", impl="gluon", head_dim=128, n=4096, causal=True, ms=2.0, tflops=550.0),
        dict(kind="bench", impl="cudnn", head_dim=128, n=4096, causal=True, ms=2.2, tflops=500.0),
        dict(kind="bench", impl="two-kernel", head_dim=128, n=4096, causal=True, error="OOM"),
    ]
    killed = dict(child="bench-gluon", status="killed: no progress for 30 s", seconds=31)
    children = [dict(child="check", status="ok", seconds=50), killed]
    text = tool.markdown(dict(env={}, children=children, rows=rows))
    assert "Checks: 0 of 1 passed (1 not run: time budget)" in text
    assert "FAILED" in text and "boom" in text
    assert 'bench-gluon hung in: {"kind": "start", "which": "gluon"' in text
    assert "| 128 | 4k | yes | 550.0 (2.0) |" in text and "| 1.100 | – |" in text and "OOM" in text


# --- compiled for sm_90 -------------------------------------------------------------------


@pytest.mark.slow
def test_every_combination_compiles_for_sm90():
    path = triton36_path()
    if path is None:
        pytest.skip("no triton 3.6 here: set GLUON_TRITON_PATH to one installed aside")
    env = compile_env(path)
    out = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "gpu" / "gluon_bwd_compile.py"), "--quick"],
        capture_output=True,
        text=True,
        env=env,
        timeout=1200,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "0 failed" in out.stdout


# --- GPU ----------------------------------------------------------------------------------

GLUON = FlashConfig(backward="gluon")
# (batch, heads_q, heads_kv, seq_q, seq_k, head_dim): GQA 4:1 and 2:1, odd lengths, Sq ≠ Sk
# both ways (rows without keys under causal), length 1, several key blocks
GPU_SHAPES = [
    (2, 4, 1, 300, 1000, 128),
    (1, 8, 2, 1000, 333, 128),
    (2, 2, 2, 1, 1, 128),
    (1, 4, 4, 2048, 2048, 128),
    (2, 4, 2, 517, 517, 64),
    (1, 4, 1, 4097, 4097, 64),
]


def _accuracy(shape, dtype, causal, config=GLUON):
    from test_flash_attention import make
    from test_flash_backward import assert_backward_within_pytorch_error

    q, k, v = make(*shape, dtype, device="cuda", bshd=shape[3] % 2 == 1)
    return assert_backward_within_pytorch_error(q, k, v, causal, False, config=config)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_gluon_backward_accuracy(dtype, shape, causal):
    _accuracy(shape, dtype, causal)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_gpu_gluon_matches_deterministic(head_dim, causal):
    """Both within the rule of float64, and their difference within the rule's allowance."""
    from test_flash_attention import _FLOOR, make, output_grad, reference
    from test_flash_backward import assert_backward_within_pytorch_error

    from fa_bench.kernels.flash_attention import flash_attention

    dtype = torch.bfloat16
    q, k, v = make(2, 8, 2, 1500, 1500, head_dim, dtype, device="cuda")
    gluon = assert_backward_within_pytorch_error(q, k, v, causal, False, config=GLUON)
    two_kernel = assert_backward_within_pytorch_error(q, k, v, causal, True)
    do = output_grad(flash_attention(q, k, v, causal=causal))
    exact = reference(q, k, v, causal, do=do)
    plain = reference(q, k, v, causal, dtype=dtype, do=do)
    for name, a, b, t, r in zip(
        ("dq", "dk", "dv"), gluon, two_kernel, (plain.dq, plain.dk, plain.dv),
        (exact.dq, exact.dk, exact.dv), strict=True,
    ):  # fmt: skip
        torch_err = (t.double() - r).abs().max().item()
        floor = _FLOOR[dtype] * max(r.abs().max().item(), 1.0)
        diff = (a.double() - b.double()).abs().max().item()
        assert diff <= 2 * torch_err + floor, (name, diff, torch_err)


@pytest.mark.gpu
@needs_cuda
def test_gpu_gluon_dk_dv_reproducible_and_dispatched(monkeypatch):
    """dK and dV are owned by one CTA each: bitwise equal on repeated calls; "auto" on the
    H200 runs the Gluon kernel (counted)."""
    from test_flash_attention import make, output_grad

    from fa_bench.kernels.flash_attention import flash_attention

    calls = []
    real = flash_gluon_bwd.gluon_backward
    monkeypatch.setattr(
        flash_gluon_bwd, "gluon_backward", lambda *a, **kw: calls.append(1) or real(*a, **kw)
    )
    q, k, v = make(1, 4, 2, 1000, 1000, 128, torch.bfloat16, device="cuda")
    runs = []
    for _ in range(2):
        o = flash_attention(q, k, v, causal=True, deterministic=False,
                            config=FlashConfig(backward="auto"))  # fmt: skip
        runs.append(torch.autograd.grad(o, (q, k, v), output_grad(o)))
    assert len(calls) == 2
    assert torch.equal(runs[0][1], runs[1][1]) and torch.equal(runs[0][2], runs[1][2])


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize(("dtype", "head_dim"), [(torch.bfloat16, 256), (torch.float32, 128)])
def test_gpu_auto_falls_back_where_gluon_cannot_run(monkeypatch, dtype, head_dim):
    import dataclasses

    from fa_bench.kernels.flash_config import heuristic_config

    monkeypatch.setattr(
        flash_gluon_bwd, "gluon_backward", lambda *a, **kw: pytest.fail("not Gluon")
    )
    # the heuristic's forward tiles: FlashConfig()'s (128 x 64, 3 stages) need 256 KiB of
    # shared memory at head_dim 256, past the H200's 227 KiB (session 10's GPU run)
    tiles = heuristic_config(head_dim, dtype, True, torch.device("cuda"), 333)
    config = dataclasses.replace(tiles, backward="auto")
    _accuracy((1, 4, 2, 333, 333, head_dim), dtype, True, config)


@pytest.mark.gpu
@needs_cuda
def test_gpu_the_default_backward_is_gluon_where_it_runs(monkeypatch):
    """flash_attention's default (`deterministic=None`) on the H200: the Gluon kernel at
    bf16 head_dim 128 (counted) and under a softcap (issue 19's window, softcap and ALiBi
    run there since session 17), the two-kernel backward at head_dim 256, fp32 and for a
    packed batch; every one within the accuracy rule."""
    from test_flash_attention import make
    from test_flash_backward import assert_backward_within_pytorch_error

    calls = []
    real = flash_gluon_bwd.gluon_backward
    monkeypatch.setattr(
        flash_gluon_bwd, "gluon_backward", lambda *a, **kw: calls.append(1) or real(*a, **kw)
    )
    for dtype, head_dim, expect in ((torch.bfloat16, 128, 1), (torch.bfloat16, 256, 0),
                                    (torch.float32, 128, 0)):  # fmt: skip
        calls.clear()
        q, k, v = make(1, 4, 2, 517, 517, head_dim, dtype, device="cuda")
        assert_backward_within_pytorch_error(q, k, v, True, None)
        assert len(calls) == expect, (dtype, head_dim)
    from fa_bench.kernels import flash_attention_varlen
    from fa_bench.kernels.flash_attention import flash_attention

    calls.clear()
    q, k, v = make(1, 4, 2, 517, 517, 128, torch.bfloat16, device="cuda")
    o = flash_attention(q, k, v, causal=True, softcap=20.0)
    o.sum().backward()
    assert calls == [1] and q.grad is not None
    calls.clear()
    qp, kp, vp = (t.detach()[0].transpose(0, 1).contiguous().requires_grad_() for t in (q, k, v))
    cu = torch.tensor([0, 200, 517], dtype=torch.int32, device="cuda")
    o = flash_attention_varlen(qp, kp, vp, cu, cu, 317, 317, causal=True)
    o.sum().backward()
    assert not calls and qp.grad is not None
