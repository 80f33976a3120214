"""Issue 18, session 13: the shared dQ in FlashAttention-4's sm90 order
(`GluonBwdConfig.sdq_first`, DQ_MODE 7: the dQ matmul issued before dK's, staged and
reduce-added while dK's runs): the configs and, on the GPU, the gradients against the
float64 reference with fa_bench.run.accuracy's rule on every (batch, kv head) slice
(causal both, GQA, odd lengths, Sq ≠ Sk), fp16 too, and against the deterministic
backward."""

from __future__ import annotations

import dataclasses

import pytest
from gluon_bwd_helpers import check_fp16_and_det, check_role, needs_cuda
from test_flash_gluon_bwd_s6 import ROLE_SHAPES

from fa_bench.kernels import flash_gluon
from fa_bench.kernels.flash_gluon_bwd import (
    GluonBwdConfig,
    _check_args,
    candidate_bwd_configs,
)

ROLES = ["ws-dss-sdqf-s2", "ws-dss-sdqf"]


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("role", ROLES)
def test_the_fa4_order_is_the_shared_dq_s_launch_with_mode_7(head_dim, role):
    cfg = candidate_bwd_configs(head_dim)[role]
    sdq = candidate_bwd_configs(head_dim)["ws-dss-sdq" + role.removeprefix("ws-dss-sdqf")]
    assert dataclasses.replace(cfg, sdq_first=False) == sdq
    assert (cfg.dq_mode, sdq.dq_mode) == (7, 1)
    assert "-sdq-first" in cfg.label()
    assert cfg.smem_bytes(head_dim) == sdq.smem_bytes(head_dim) <= flash_gluon.SMEM_BYTES
    assert _check_args(cfg, True, 0.1, head_dim) is cfg


@pytest.mark.parametrize("kw", [dict(), dict(shared_dq=True), dict(shared_dq=True, ops_smem=3)])
def test_the_fa4_order_needs_the_shared_dq_on_shared_memory_operands(kw):
    with pytest.raises(ValueError, match=r"sdq_first=True|ops_smem=3"):
        GluonBwdConfig(sdq_first=True, **kw)
    with pytest.raises(ValueError, match="sdq_first"):
        GluonBwdConfig(sdq_first=1, shared_dq=True, ops_smem=1)  # not a bool
    assert GluonBwdConfig(sdq_first=True, shared_dq=True, ops_smem=2).dq_mode == 7


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", ROLE_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("head_dim", [128, 64])
@pytest.mark.parametrize("role", ROLES)
def test_gpu_the_fa4_order_within_the_accuracy_rule(role, head_dim, shape, causal):
    check_role(head_dim, role, shape, causal)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_the_fa4_order_fp16_and_against_the_deterministic_backward(causal):
    check_fp16_and_det(128, "ws-dss-sdqf-s2", causal, ROLE_SHAPES[0])  # GQA 4:1 at 4097
