"""Issue 18, session 14: the dQ staging tile's swizzle (`GluonBwdConfig.dq_swizzle`).
Nsight Compute put two excess shared-memory wavefronts on every 64-bit store of the fp32
dQ staging tile with the 128-byte swizzle; the 32-byte one stores without conflicts at
four times the reduce-add boxes. The configs, the descriptor's layout and, on the GPU,
the gradients of the 32-byte roles against the float64 reference under
fa_bench.run.accuracy's rule (causal both, GQA, odd lengths, Sq ≠ Sk), fp16 and the
deterministic backward's too."""

from __future__ import annotations

import pytest
import torch
from gluon_bwd_helpers import check_fp16_and_det, check_role, needs_cuda
from test_flash_gluon_bwd_s6 import ROLE_SHAPES

from fa_bench.kernels.flash_gluon_bwd import GluonBwdConfig, candidate_bwd_configs

# (head_dim, the 32-byte role, the role it is built on)
Z32_ROLES = [(128, "ws-dss-sdq-s2-z32", "ws-dss-sdq-s2"), (64, "ws-pss-early-z32", "ws-pss-early"),
             (128, "ws-dss-sdq-z32", "ws-dss-sdq")]  # fmt: skip


@pytest.mark.parametrize(("head_dim", "role", "base"), Z32_ROLES)
def test_z32_roles_change_only_the_swizzle(head_dim, role, base):
    cands = candidate_bwd_configs(head_dim)
    assert cands[role].dq_swizzle == 32 and cands[base].dq_swizzle == 128
    assert GluonBwdConfig(**{**cands[role].__dict__, "dq_swizzle": 128}) == cands[base]
    assert cands[role].label() != cands[base].label() and "-z32" in cands[role].label()
    assert cands[role].smem_bytes(head_dim) == cands[base].smem_bytes(head_dim)


@pytest.mark.parametrize("bad", [0, 16, 256, True, "32"])
def test_dq_swizzle_takes_tma_widths_only(bad):
    with pytest.raises(ValueError, match=r"dq_swizzle=.*expected one of \(32, 64, 128\)"):
        GluonBwdConfig(dq_swizzle=bad)


def test_the_dq_descriptor_carries_the_swizzle():
    pytest.importorskip("triton.experimental.gluon")
    from fa_bench.kernels.flash_gluon_bwd_desc import _box_layout

    block = (1, 1, 64, 64)
    assert _box_layout(block, torch.float32, 32).swizzle_byte_width == 32
    assert _box_layout(block, torch.float32, 64).swizzle_byte_width == 64
    assert _box_layout(block, torch.float32).swizzle_byte_width == 128  # the default
    assert _box_layout(block, torch.float32, 32).element_bitwidth == 32


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", ROLE_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize(("head_dim", "role"), [r[:2] for r in Z32_ROLES], ids=str)
def test_gpu_z32_roles_within_the_accuracy_rule(head_dim, role, shape, causal):
    check_role(head_dim, role, shape, causal)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("head_dim", "role"), [r[:2] for r in Z32_ROLES[:2]], ids=str)
def test_gpu_z32_fp16_and_against_the_deterministic_backward(head_dim, role, causal):
    check_fp16_and_det(head_dim, role, causal, ROLE_SHAPES[0])  # GQA 4:1 at 4097
