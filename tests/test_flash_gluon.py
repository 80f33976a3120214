"""The Gluon forward for sm_90 (issue 21): kernels/flash_gluon.py and its kernels.

CPU: why it cannot run (`gluon_reason`, the triton version rule), `GluonConfig`'s checks,
the heuristic and the configs a sweep covers fitting shared memory, `gluon_forward`'s
errors. Gluon kernels do not run in the interpreter; `slow`: compile every combination
for sm_90 with tools/gluon_compile.py where a triton 3.6 is available (the installed one,
or one at $GLUON_TRITON_PATH, e.g. /tmp/tri36). GPU (`-m gpu`, an H200): the forward
against the float64 reference under the project's accuracy rule (fa_bench.run.accuracy),
rows with no key, our `tl` backward consuming its (o, lse2), every config variant.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from gluon_bwd_helpers import triton36_path

from fa_bench.kernels.flash_gluon import (
    HEAD_DIMS,
    SMEM_BYTES,
    GluonConfig,
    candidate_configs,
    gluon_config,
    gluon_forward,
    gluon_preferred,
    gluon_reason,
    version_reason,
)

ROOT = Path(__file__).resolve().parent.parent


def _qkv(dtype=torch.float16, shape=(1, 2, 64, 64), kv_heads=None, device="cpu"):
    b, h, s, d = shape
    kv = (b, kv_heads or h, s, d)
    return (
        torch.randn(shape, dtype=dtype, device=device),
        torch.randn(kv, dtype=dtype, device=device),
        torch.randn(kv, dtype=dtype, device=device),
    )


# --- why it cannot run --------------------------------------------------------------------


def test_reason_names_the_dtype_and_shape_problems():
    q, k, v = _qkv(torch.float32)
    assert "q.dtype=torch.float32" in gluon_reason(q, k, v, False)
    q, k, v = _qkv()
    assert "not a tensor" in gluon_reason(q.tolist(), k, v, False)
    assert "k has shape (2, 64, 64)" in gluon_reason(q, k[0], v, causal=True)


def test_reason_names_strides_and_alignment():
    q, k, v = _qkv()
    assert "last stride must be 1" in gluon_reason(q, k.transpose(2, 3), v, False)
    wide = torch.randn(1, 2, 64, 65, dtype=torch.float16)[..., 1:]  # 130-byte rows
    assert "16-byte aligned" in gluon_reason(q, k, wide, False)


def test_reason_interpreter_then_device(monkeypatch):
    q, k, v = _qkv()
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert "interpreter" in gluon_reason(q, k, v, False)
    monkeypatch.delenv("TRITON_INTERPRET")
    assert "CUDA" in gluon_reason(q, k, v, False)


def test_preferred_only_where_it_runs_and_measured_faster(monkeypatch):
    import fa_bench.kernels.flash_gluon as fg

    q, k, v = _qkv()
    assert not gluon_preferred(q, k, v, False)  # it cannot run here at all
    monkeypatch.setattr(fg, "gluon_reason", lambda *a: None)
    for head_dim, seq_k, expected in [(128, 1024, True), (128, 512, False), (64, 4096, True),
                                      (64, 2048, False), (256, 16384, False)]:  # fmt: skip
        q, k, v = _qkv(shape=(1, 1, 16, head_dim))
        k = torch.empty(1, 1, seq_k, head_dim, dtype=torch.float16)
        assert gluon_preferred(q, k, k, True) is expected, (head_dim, seq_k)


def test_version_rule():
    assert version_reason("3.6.0") is None
    assert version_reason("3.6.1") is None
    for other in ("3.5.1", "3.9.0", "3.10.0"):
        reason = version_reason(other)
        assert reason and other in reason and "3.6" in reason


def test_forward_refuses_what_it_cannot_run():
    q, k, v = _qkv(torch.float32)
    with pytest.raises(ValueError, match=r"gluon_forward cannot run.*float32"):
        gluon_forward(q, k, v, False, 0.125)


# --- config --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        (dict(variant="tl"), r"variant='tl'"),
        (dict(block_n=96), r"block_n=96"),
        (dict(stages=0), r"stages=0"),
        (dict(stages=True), r"stages=True"),
        (dict(num_warps=2), r"num_warps=2"),
        (dict(block_m=128), r"variant='ws', block_m=128"),
        (dict(variant="pipelined", block_m=64, num_warps=8), r"block_m must be 16 \* num_warps"),
        (dict(pingpong=1), r"pingpong=1"),
        (dict(persistent="yes"), r"persistent='yes'"),
        (
            dict(variant="pipelined", block_m=128, num_warps=8, persistent=True),
            r"only 'ws' is persistent",
        ),
        (dict(producer_regs=20), r"producer_regs=20"),
        (dict(consumers=4), r"consumers=4"),
        (dict(q_buffers=3, persistent=True), r"q_buffers=3"),
        (dict(q_buffers=2), r"only the persistent kernel"),
        (dict(consumers=3), r"three consumers run without ping-pong"),
        (dict(consumers=3, pingpong=False), r"consumer 0 would get only 8 registers"),
        (dict(consumer_regs=260), r"consumer_regs=260"),
        (dict(consumer_regs=236), r"consumer_regs=236"),
    ],
)
def test_config_validation(fields, match):
    with pytest.raises(ValueError, match=match):
        GluonConfig(**fields)


def test_config_shared_memory_and_label():
    ws = GluonConfig(block_n=128, stages=2)
    assert ws.rows_per_cta == 128
    assert ws.smem_bytes(128) == (128 + 4 * 128) * 128 * 2
    assert ws.label() == "ws-m64-n128-s2"
    assert GluonConfig(pingpong=False).label().endswith("-nopp")
    assert GluonConfig(persistent=True).label() == "ws-m64-n128-s2-persist"
    q2 = GluonConfig(persistent=True, q_buffers=2)
    assert q2.smem_bytes(128) == (2 * 128 + 4 * 128) * 128 * 2
    assert q2.label() == "ws-m64-n128-s2-q2-persist"
    three = GluonConfig(consumers=3, pingpong=False, consumer_regs=160)
    assert three.rows_per_cta == 192 and three.label() == "ws-m64-n128-s2-c3-nopp"


def test_register_split_follows_triton_warp_group_allocation():
    # 12 warps: 65536 / 384 = 170 -> 168 each to start; 24 + 240 requested, 240 left
    assert GluonConfig().registers() == (240, 240, 24)
    # 16 warps: 128 each to start; 24 + 2 x 160 requested, 168 left for consumer 0
    assert GluonConfig(consumers=3, pingpong=False, consumer_regs=160).registers() == (168, 160, 24)
    pipe = GluonConfig(variant="pipelined", block_m=128, num_warps=8)
    assert pipe.rows_per_cta == 128
    assert pipe.label() == "pipelined-m128-n128-s2-w8"


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_heuristic_takes_the_deepest_ring_that_fits(head_dim):
    cfg = gluon_config(head_dim, causal=True) if head_dim > 64 else gluon_config(head_dim)
    # d64 non-causal: three consumers (no ping-pong) since session 5's call C
    assert cfg.variant == "ws" and cfg.pingpong == (head_dim > 64)
    assert cfg.smem_bytes(head_dim) <= SMEM_BYTES
    deeper = dataclasses.replace(cfg, stages=cfg.stages + 1) if cfg.stages < 4 else None
    assert deeper is None or deeper.smem_bytes(head_dim) > SMEM_BYTES
    assert {64: 4, 128: 3, 256: 2}[head_dim] == cfg.stages


def test_heuristic_takes_the_pipelined_kernel_for_causal_d64():
    assert gluon_config(64, causal=True).variant == "pipelined"
    assert gluon_config(256, causal=True) == gluon_config(256)


def test_heuristic_takes_the_persistent_two_q_kernel_for_non_causal_d128():
    cfg = gluon_config(128)
    assert cfg.persistent and cfg.q_buffers == 2 and cfg.variant == "ws"
    assert cfg.smem_bytes(128) <= SMEM_BYTES and cfg.stages == 2
    assert not gluon_config(128, causal=True).persistent
    assert not gluon_config(64).persistent and not gluon_config(256).persistent


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_candidate_configs_fit_and_differ(head_dim):
    configs = candidate_configs(head_dim)
    # "ws": the two-consumer launch (the heuristic's, but at d64: three consumers there)
    two = gluon_config(head_dim, True) if head_dim > 64 else GluonConfig(stages=4)
    assert configs["ws"] == two
    assert not configs["ws-nopp"].pingpong and configs["ws-persist"].persistent
    assert configs["pipelined"].variant == "pipelined"
    assert len(set(configs.values())) == len(configs)
    assert all(c.smem_bytes(head_dim) <= SMEM_BYTES for c in configs.values())
    labels = [c.label() for c in configs.values()]
    assert len(set(labels)) == len(labels)


def test_forward_refuses_a_config_past_shared_memory(monkeypatch):
    import fa_bench.kernels.flash_gluon as fg

    monkeypatch.setattr(fg, "gluon_reason", lambda *a: None)
    q, k, v = _qkv(shape=(1, 1, 64, 256))
    with pytest.raises(ValueError, match=r"ws-m64-n128-s4 at head_dim=256 needs \d+ bytes"):
        gluon_forward(q, k, v, False, 0.1, GluonConfig(stages=4))
    with pytest.raises(TypeError, match=r"config=.*expected a GluonConfig"):
        gluon_forward(q, k, v, False, 0.1, config={"stages": 2})
    with pytest.raises(ValueError, match=r"scale=-1.0"):
        gluon_forward(q, k, v, False, -1.0)


# --- compiled for sm_90 on a CPU --------------------------------------------------------


@pytest.mark.slow
def test_every_combination_compiles_for_sm90():
    path = triton36_path()
    if path is None:
        pytest.skip("no triton 3.6 here: set GLUON_TRITON_PATH to one installed aside")
    env = dict(os.environ, PYTHONPATH=path)
    out = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "gluon_compile.py"), "--quick"],
        capture_output=True,
        text=True,
        env=env,
        timeout=1200,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "0 failed" in out.stdout


# --- GPU --------------------------------------------------------------------------------

needs_gluon_gpu = pytest.mark.skipif(
    not torch.cuda.is_available()
    or os.environ.get("TRITON_INTERPRET") == "1"
    or torch.cuda.get_device_capability() != (9, 0),
    reason="needs an sm_90 GPU",
)


# (batch, heads_q, heads_kv, seq_q, seq_k, (B, S, H, D) layout)
GPU_SHAPES = [
    (2, 2, 2, 1000, 1000, False),
    (1, 4, 1, 4097, 4097, False),
    (1, 2, 2, 300, 1000, False),
    (1, 2, 2, 1000, 300, False),
    (1, 2, 2, 1, 1, False),
    (2, 4, 2, 128, 384, True),
]


def check_tool():
    """tools/gpu/gluon_check.py as a module: its check_one is what the GPU run applies."""
    path = ROOT / "tools" / "gpu" / "gluon_check.py"
    spec = importlib.util.spec_from_file_location("gluon_check", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --- the check itself, on a CPU: the `tl` forward stands in for the Gluon one ------------


def _cpu_check(monkeypatch, forward, shape, causal, backward=False):
    import fa_bench.kernels.flash_gluon as fg
    from fa_bench.kernels.flash_config import heuristic_config

    tool = check_tool()
    fa = importlib.import_module("fa_bench.kernels.flash_attention")

    def inputs(shape, dtype, head_dim, seed=0):
        b, hq, hk, sq, sk, _ = shape
        gen = torch.Generator().manual_seed(seed)
        return tuple(torch.randn(b, h, s, head_dim, dtype=dtype, generator=gen)
                     for h, s in ((hq, sq), (hk, sk), (hk, sk)))  # fmt: skip

    def stand_in(q, k, v, causal, scale, cfg=None):
        config = heuristic_config(q.shape[3], q.dtype, causal, q.device, q.shape[2])
        return forward(*fa._forward(q, k, v, causal, scale, config))

    monkeypatch.setattr(tool, "_inputs", inputs)
    monkeypatch.setattr(fg, "gluon_forward", stand_in)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    return tool.check_one(None, shape, "fp16", 16, causal, backward)


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="interpreter (CPU) run")
@pytest.mark.parametrize("causal", [False, True])
def test_check_passes_a_right_forward_and_catches_wrong_ones(monkeypatch, causal):
    shape = (2, 4, 2, 40, 24, False)  # Sq > Sk: causal rows with no key
    row = _cpu_check(monkeypatch, lambda o, lse2: (o, lse2), shape, causal)
    assert row["passed"] and row["no_key_rows_ok"] and row["layout_ok"], row

    def wrong_batch(o, lse2):  # only the second batch is off: a slice check would miss it
        o = o.clone()
        o[1, 3] *= 1.05
        return o, lse2

    row = _cpu_check(monkeypatch, wrong_batch, shape, causal)
    assert not row["passed"] and not row["fwd_passed"]
    if causal:

        def finite_empty_rows(o, lse2):
            lse2 = lse2.clone()
            lse2[:, :, :16] = 0.0
            return o, lse2

        row = _cpu_check(monkeypatch, finite_empty_rows, shape, causal)
        assert not row["passed"] and not row["no_key_rows_ok"]


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="interpreter (CPU) run")
def test_check_runs_our_backward_on_the_forward_output(monkeypatch):
    shape = (1, 2, 1, 40, 24, False)
    row = _cpu_check(monkeypatch, lambda o, lse2: (o, lse2), shape, True, backward=True)
    assert row["passed"] and row["bwd_passed"], row

    def wrong_lse(o, lse2):  # the backward recomputes P from lse2: a wrong one shows there
        return o, lse2 + 0.25

    row = _cpu_check(monkeypatch, wrong_lse, shape, True, backward=True)
    assert row["fwd_passed"] and not row["bwd_passed"], row


@pytest.mark.gpu
@needs_gluon_gpu
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("shape", GPU_SHAPES)
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_forward_accuracy(dtype, head_dim, shape, causal):
    row = check_tool().check_one(None, shape, dtype, head_dim, causal, backward=False)
    assert row["passed"], row


@pytest.mark.gpu
@needs_gluon_gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", [(2, 4, 2, 777, 777, True), (1, 2, 2, 1000, 300, False)])
def test_gpu_backward_consumes_the_gluon_forward(shape, causal):
    row = check_tool().check_one(None, shape, "bf16", 128, causal, backward=True)
    assert row["passed"], row


@pytest.mark.gpu
@needs_gluon_gpu
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_every_candidate_config(head_dim, causal):
    for role, cfg in candidate_configs(head_dim).items():
        row = check_tool().check_one(cfg, (2, 4, 2, 1500, 1500, False), "bf16", head_dim, causal,
                                     backward=False)  # fmt: skip
        assert row["passed"], (role, row)
