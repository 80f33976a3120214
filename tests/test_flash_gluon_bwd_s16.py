"""Issue 18, session 16: K ahead of V at a CTA's start (`GluonBwdConfig.kv_split`). The
producer loads K, the first Q block, then V, then the first dO block, K and V on
barriers of their own, so the consumers' first Sᵀ = K Qᵀ need not wait for V. On a CPU:
the role, its label and the launch's constexpr. On the GPU: the same gradients as the
launch without the split (dK and dV bit for bit: the same arithmetic in the same order;
dQ within the accuracy rule, its fp32 adds land in any order), causal and not, GQA,
lengths off the tiles, seq_k > seq_q, the (B, S, H, D) layout."""

from __future__ import annotations

import dataclasses
import importlib
import math

import pytest
import torch
from gluon_bwd_helpers import needs_cuda, tool

from fa_bench.kernels import flash_gluon_bwd_plan
from fa_bench.kernels.flash_gluon_bwd import GluonBwdConfig, candidate_bwd_configs

BASE = "ws-dss-sdq-s2-alt-perm-grp"
ROLE = f"{BASE}-kvs"


@pytest.mark.parametrize("head_dim", [64, 128])
def test_the_role_is_the_default_launch_with_the_split(head_dim):
    roles = candidate_bwd_configs(head_dim)
    cfg = roles[ROLE]
    assert cfg.kv_split and cfg.label() == roles[BASE].label() + "-kvs"
    assert dataclasses.replace(cfg, kv_split=False) == roles[BASE]
    assert not roles["ws"].kv_split  # the heuristic's launch is unchanged until measured
    with pytest.raises(ValueError, match=r"GluonBwdConfig.kv_split=1: expected a bool"):
        GluonBwdConfig(kv_split=1)


@pytest.mark.parametrize("split", [False, True])
def test_the_launch_passes_the_split(split):
    pytest.importorskip("triton.experimental.gluon")
    from test_flash_gluon_bwd_plan import _io

    cfg = dataclasses.replace(candidate_bwd_configs(128)[BASE], kv_split=split)
    (q, k, v, _, do, dk, dv, _, dq_ws), lse2, delta = _io((1, 2, 64, 128), heads_kv=2)
    _, _, _, kwargs = flash_gluon_bwd_plan.main_call(
        cfg, (q, k, v, do, dk, dv, dq_ws), lse2, delta, True, 0.1)  # fmt: skip
    assert kwargs["KV_SPLIT"] is split


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize(
    ("shape", "causal"),  # (batch, q heads, kv heads, seq_q, seq_k, B S H D layout)
    [((2, 6, 3, 1000, 1000, False), True), ((1, 4, 4, 2048, 2048, True), False),
     ((1, 4, 2, 300, 700, False), True)],
)  # fmt: skip
def test_gpu_the_split_gives_the_same_gradients(shape, causal, head_dim, dtype):
    from fa_bench.kernels.flash_config import heuristic_config
    from fa_bench.kernels.flash_gluon_bwd import gluon_backward

    check = tool("gluon_bwd_check")
    torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    q, k, v, do = check._inputs(shape, torch_dtype, head_dim)
    scale = 1.0 / math.sqrt(head_dim)
    fa = importlib.import_module("fa_bench.kernels.flash_attention")
    cfg = heuristic_config(head_dim, q.dtype, True, q.device, shape[3])
    o, lse2 = fa._forward(q, k, v, causal, scale, cfg)
    roles = candidate_bwd_configs(head_dim)
    out = {}
    for role in (BASE, ROLE):
        flash_gluon_bwd_plan.clear()
        out[role] = [t.clone() for t in gluon_backward(do, q, k, v, o, lse2, causal, scale,
                                                       roles[role])]  # fmt: skip
    flash_gluon_bwd_plan.clear()
    assert torch.equal(out[BASE][1], out[ROLE][1]) and torch.equal(out[BASE][2], out[ROLE][2])
    res = check.check_slices(shape, dtype, head_dim, causal, (q, k, v, o, do, out[ROLE]))
    assert res["passed"], res


def test_the_sass_comparison_names_how_far_two_kernels_agree():
    """tools/gpu/gluon_bwd_sass.py's verdicts, which session 16 relied on (no GPU) to say
    that the kb_major fold and kv_split left the default launch's code alone."""
    pytest.importorskip("triton.experimental.gluon._runtime")
    compare = tool("gluon_bwd_sass").compare
    a = "--:-:-:-:1\tIMAD R2, R3, R4;\n--:-:-:-:2\t@P0 BRA L1;\n--:-:-:-:1\tFADD R5, R2, R2;"
    assert compare(a, a) == ("same", [])
    renamed = a.replace("R2", "R9").replace("P0", "P3")
    assert compare(a, renamed) == ("registers", [])
    lines = a.splitlines()
    moved = "\n".join([lines[0], lines[2], lines[1]])
    verdict, where = compare(a, moved)
    assert verdict == "schedule" and where
    assert compare(a, a.replace("FADD", "FMUL"))[0] == "differs"
