"""Issue 18, session 6: the Gluon backward's A/B tool (tools/gpu/gluon_bwd_ab.py) and
every candidate launch's correctness on the GPU (each role against the float64 reference
with fa_bench.run.accuracy's rule on every (batch, kv head) slice, causal both, GQA, odd
lengths, Sq ≠ Sk)."""

from __future__ import annotations

import pytest
import torch
from gluon_bwd_helpers import ROOT, compile_env, needs_cuda, tool, triton36_path

from fa_bench.kernels import flash_gluon
from fa_bench.kernels.flash_gluon_bwd import (
    GluonBwdConfig,
    _check_args,
    _heuristic,
    _session6,
    candidate_bwd_configs,
    gluon_bwd_config,
)

# the shared helpers' loader, under the name s7's tests import from here
_tool = tool


def test_ab_table_ratios_errors_and_cut_children():
    tool = _tool("gluon_bwd_ab")
    rows = [
        dict(kind="start", head_dim=128, n=4096, causal=True),
        dict(kind="bench", impl="ws", head_dim=128, n=4096, causal=True, ms=2.0, tflops=440.0),
        dict(kind="bench", impl="ws-sdq", head_dim=128, n=4096, causal=True, error="Hang"),
        dict(kind="bench", impl="cudnn", head_dim=128, n=4096, causal=True, ms=1.8, tflops=550.0),
        dict(kind="bench", impl="ws", head_dim=64, n=16384, causal=False, ms=3.0, tflops=300.0),
    ]
    children = [dict(child="d128", status="killed: no progress for 40 s", seconds=41)]
    roles = {"128": ["ws", "ws-sdq"], "64": ["ws"]}
    text = tool.markdown(dict(env={}, children=children, rows=rows, roles=roles))
    assert "| 4k | yes | 440.0 (2.0) [0.800] | Hang | – | – | 550.0 (1.8) [1.000] |" in text
    assert "| 16k | no | 300.0 (3.0) | – |" in text  # no cuDNN figure: no ratio
    assert "child d128: killed" in text
    assert text.index("head_dim 128") < text.index("| 4k | yes") < text.index("head_dim 64")


# --- early_dq_all (DQ_MODE 4) --------------------------------------------------------------


def test_early_dq_all_is_its_own_dq_mode_and_role():
    cfg = candidate_bwd_configs(128)["ws-early2"]
    base = _session6(128, False)
    assert cfg.dq_mode == 4 and cfg.early_dq_all and not cfg.early_dq
    assert cfg.label() == "gluon-bwd-m64-n128-s2-rot-early2"
    assert (cfg.block_m, cfg.stages, cfg.rotate) == (base.block_m, base.stages, base.rotate)
    assert cfg.smem_bytes(128) <= flash_gluon.SMEM_BYTES
    assert "ws-early2" not in candidate_bwd_configs(64)  # one dQ chunk there


@pytest.mark.parametrize("other", [dict(early_dq=True), dict(shared_dq=True)])
def test_early_dq_all_excludes_the_other_dq_schedules(other):
    with pytest.raises(ValueError, match=r"early_dq_all=True.*one dQ schedule"):
        GluonBwdConfig(early_dq_all=True, **other)
    with pytest.raises(ValueError, match="early_dq_all='yes'"):
        GluonBwdConfig(early_dq_all="yes")


def test_early_dq_all_needs_two_chunks():
    cfg = GluonBwdConfig(block_m=128, early_dq_all=True)
    with pytest.raises(ValueError, match=r"early_dq_all.*head_dim=64"):
        _check_args(cfg, False, 0.1, 64)
    assert _check_args(GluonBwdConfig(early_dq_all=True), True, 0.1, 128).dq_mode == 4


@pytest.mark.parametrize("head_dim", [64, 128])
def test_dq_first_is_fa3s_order_at_both_head_dims(head_dim):
    cfg = candidate_bwd_configs(head_dim)["ws-dqfirst"]
    base = _session6(head_dim, False)
    assert cfg.dq_mode == 5 and cfg.dq_first == 2 and not cfg.early_dq
    assert cfg.label() == base.label().removesuffix("-early") + "-dqfirst"
    assert (cfg.block_m, cfg.stages, cfg.rotate) == (base.block_m, base.stages, base.rotate)
    assert _check_args(cfg, True, 0.1, head_dim) is cfg


def test_dq_first_one_chunk_at_head_dim_128():
    cfg = candidate_bwd_configs(128)["ws-dqfirst1"]
    assert cfg.dq_mode == 6 and cfg.dq_first == 1
    assert cfg.label() == "gluon-bwd-m64-n128-s2-rot-dqfirst1"
    assert "ws-dqfirst1" not in candidate_bwd_configs(64)  # one chunk there: ws-dqfirst


def test_dq_first_excludes_the_other_dq_schedules():
    for other in ("early_dq", "early_dq_all", "shared_dq"):
        with pytest.raises(ValueError, match=r"dq_first=1\): one dQ schedule"):
            GluonBwdConfig(dq_first=1, **{other: True})
    for bad in (True, 3):
        with pytest.raises(ValueError, match=rf"dq_first={bad}: expected one of \(0, 1, 2\)"):
            GluonBwdConfig(dq_first=bad)


@pytest.mark.parametrize(("head_dim", "cols", "stages"), [(64, 32, 3), (128, 64, 3)])
def test_shared_dq_at_both_head_dims(head_dim, cols, stages):
    cfg = candidate_bwd_configs(head_dim)["ws-sdq"]
    assert cfg.shared_dq and cfg.dq_mode == 1 and cfg.dq_cols(head_dim) == cols
    assert cfg.stages == stages and cfg.smem_bytes(head_dim) <= flash_gluon.SMEM_BYTES
    assert _check_args(cfg, False, 0.1, head_dim) is cfg
    # the heuristic (session 14): one consumer adds all of a step's columns at a time
    assert gluon_bwd_config(head_dim).dq_cols(head_dim) == head_dim


# --- $FA_BENCH_GLUON_BWD_ROLE ---------------------------------------------------------------


def test_role_override_per_head_dim_and_causal(monkeypatch):
    monkeypatch.setenv("FA_BENCH_GLUON_BWD_ROLE", "128=ws-dqfirst")
    assert gluon_bwd_config(128).label() == "gluon-bwd-m64-n128-s2-rot-dqfirst"
    assert gluon_bwd_config(128, causal=True).label() == "gluon-bwd-m64-n128-s2-dqfirst"
    assert gluon_bwd_config(64) == _heuristic(64, False)  # not named: the heuristic
    monkeypatch.setenv("FA_BENCH_GLUON_BWD_ROLE", "ws-dqfirst")
    assert gluon_bwd_config(64, causal=True).dq_first and gluon_bwd_config(128).dq_first
    monkeypatch.setenv("FA_BENCH_GLUON_BWD_ROLE", "64=ws, 128=ws-early2")
    assert gluon_bwd_config(128).early_dq_all and gluon_bwd_config(64) == gluon_bwd_config(64)
    monkeypatch.delenv("FA_BENCH_GLUON_BWD_ROLE")
    assert gluon_bwd_config(128) == _heuristic(128, False)


@pytest.mark.parametrize(
    ("value", "match"),
    [("ws-nope", "'ws-nope' is not one of"), ("64=ws-early2", "'ws-early2' is not one of"),
     ("x=ws", "'x=ws' is not <head_dim>=<role>")],
)  # fmt: skip
def test_role_override_rejects_unknown_roles(monkeypatch, value, match):
    monkeypatch.setenv("FA_BENCH_GLUON_BWD_ROLE", value)
    with pytest.raises(ValueError, match=match):
        gluon_bwd_config(64)


def test_ab_agreement_catches_changed_gradients():
    tool = _tool("gluon_bwd_ab")
    base = (torch.ones(4, 8), torch.ones(4), torch.ones(4))
    assert tool.agreement(base, base) == dict(dq_rel=0.0, dkdv_same=True)
    off = (base[0] * 1.5, base[1], base[2].clone().fill_(2.0))
    assert tool.agreement(off, base) == dict(dq_rel=0.5, dkdv_same=False)


def test_ab_default_roles_exist():
    tool = _tool("gluon_bwd_ab")
    for d, names in tool.ROLES.items():
        assert set(names.split(",")) <= set(candidate_bwd_configs(d)), d
    for d, role in ROLES:  # the GPU tests' launches
        assert role in candidate_bwd_configs(d), (d, role)


# --- GPU ----------------------------------------------------------------------------------

# (batch, heads_q, heads_kv, seq_q, seq_k, bshd): GQA 4:1 at an odd length, Sq > Sk (rows
# without keys under causal), GQA 2:1 with Sq < Sk in a (B, S, H, D) layout
ROLE_SHAPES = [
    (1, 4, 1, 4097, 4097, False),
    (1, 2, 2, 1000, 300, False),
    (2, 4, 2, 128, 384, True),
]
# the launches session 6 added (the older roles: tools/gpu/gluon_bwd_check.py's plan)
ROLES = [(128, r) for r in ("ws-early2", "ws-dqfirst", "ws-dqfirst1", "ws-sdq")]
ROLES += [(64, r) for r in ("ws-dqfirst", "ws-sdq")]


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", ROLE_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize(("head_dim", "role"), ROLES, ids=lambda x: str(x))
def test_gpu_every_role_within_the_accuracy_rule(head_dim, role, shape, causal):
    check = _tool("gluon_bwd_check")
    res = check.check_one(shape, "bf16", head_dim, causal, against_det=False, role=role)
    assert res["ok"], res


# --- compiled for sm_90: ptxas keeps the heuristic's wgmmas asynchronous -------------------


@pytest.mark.slow  # ~30 s: four sm_90 compiles
def test_heuristic_wgmmas_not_serialized_and_the_check_catches_it():
    import subprocess
    import sys

    path = triton36_path()
    if path is None:
        pytest.skip("no triton 3.6 here: set GLUON_TRITON_PATH to one installed aside")
    env = compile_env(path)
    compiler = ROOT / "tools" / "gpu" / "gluon_bwd_compile.py"
    out = subprocess.run(
        [sys.executable, str(compiler), "--quick", "--roles", "ws-s6,ws-early2", "--dims", "128"],
        capture_output=True, text=True, env=env, timeout=900,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    lines = [x for x in out.stdout.splitlines() if x.startswith("ok ")]
    heuristic = [x for x in lines if "-rot-early " in x]  # session 6's ("ws-s6")
    early2 = [x for x in lines if "-rot-early2 " in x]
    assert len(heuristic) == 2 and len(early2) == 2  # causal both
    assert not any("SERIALIZED" in x for x in heuristic), heuristic
    assert all("SERIALIZED" in x for x in early2), early2  # call B: 16-18% slower
