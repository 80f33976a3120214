"""Issue 18, session 12: FA3's shared dQ (`GluonBwdConfig.shared_dq`, DQ_MODE 1: each
consumer adds half of dQ's columns over both consumers' keys, half the reduce-adds) on
the shared-memory operands of session 7 (`ops_smem` 1 and 2): the configs and, on the
GPU, the gradients against the float64 reference with fa_bench.run.accuracy's rule on
every (batch, kv head) slice (causal both, GQA, odd lengths, Sq ≠ Sk), fp16 too, and the
deterministic backward's."""

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
    gluon_bwd_config,
)

# (head_dim, role, ops_smem)
SDQ_ROLES = [(128, "ws-dss-sdq-s2", 1), (128, "ws-dss-sdq", 1), (128, "ws-pss-sdq", 2),
             (64, "ws-dss-sdq", 1), (64, "ws-pss-sdq", 2)]  # fmt: skip


@pytest.mark.parametrize(("head_dim", "role", "ops"), SDQ_ROLES)
def test_shared_dq_roles_keep_the_tiles_and_fit(head_dim, role, ops):
    cfg = candidate_bwd_configs(head_dim)[role]
    base = gluon_bwd_config(head_dim)
    assert (cfg.ops_smem, cfg.dq_mode, cfg.shared_dq) == (ops, 1, True)
    assert (cfg.block_m, cfg.keys) == (base.block_m, base.keys)
    assert cfg.dq_cols(head_dim) == head_dim // 2
    assert cfg.stages >= base.stages  # half the staging memory: the ring may deepen
    assert cfg.smem_bytes(head_dim) <= flash_gluon.SMEM_BYTES
    label = cfg.label()
    assert "-sdq" in label and f"-{('', 'dss', 'pss')[ops]}" in label
    assert _check_args(cfg, True, 0.1, head_dim) is cfg


def test_shared_dq_takes_no_summed_shares_nor_dq_first():
    with pytest.raises(ValueError, match="ops_smem=3, shared_dq=True"):
        GluonBwdConfig(shared_dq=True, ops_smem=3)
    with pytest.raises(ValueError, match="one dQ schedule"):
        GluonBwdConfig(shared_dq=True, ops_smem=2, dq_first=1)
    assert GluonBwdConfig(shared_dq=True, ops_smem=2).dq_mode == 1


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", ROLE_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize(("head_dim", "role"), [r[:2] for r in SDQ_ROLES], ids=str)
def test_gpu_shared_dq_roles_within_the_accuracy_rule(head_dim, role, shape, causal):
    check_role(head_dim, role, shape, causal)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("head_dim", "role"), [(128, "ws-dss-sdq-s2"), (64, "ws-dss-sdq")])
def test_gpu_shared_dq_fp16_and_against_the_deterministic_backward(head_dim, role, causal):
    check_fp16_and_det(head_dim, role, causal, ROLE_SHAPES[0])  # GQA 4:1 at 4097


def test_the_heuristic_builds_on_the_shared_dq_role_without_rotation_when_causal():
    """Session 12's role at 128, with session 14's dQ schedule (the consumers' turns)
    and staging order in place of the shared dQ."""
    cfg = gluon_bwd_config(128)
    assert (cfg.alt_dq, cfg.ops_smem, cfg.stages, cfg.rotate) == (True, 1, 2, True)
    assert not gluon_bwd_config(128, causal=True).rotate
    s12 = candidate_bwd_configs(128)["ws-dss-sdq-s2"]
    assert cfg == dataclasses.replace(s12, shared_dq=False, alt_dq=True, dq_perm=True)


def test_candidates_are_built_once_per_role_and_handed_out_as_copies(monkeypatch):
    """The heuristic runs on every backward call: its launches are built once (building
    them all took ~0.6 ms of host time a call at head_dim 64), keyed by the role it takes."""
    from fa_bench.kernels import flash_gluon_bwd as fb

    calls: list[int] = []
    real = fb._candidates
    monkeypatch.setattr(fb, "_candidates", lambda d: calls.append(d) or real(d))
    monkeypatch.setattr(fb, "_CANDIDATES", {})
    monkeypatch.setattr(fb, "_HEURISTIC", {})
    monkeypatch.delenv(fb.ROLE_ENV, raising=False)
    for _ in range(3):
        assert fb.gluon_bwd_config(64, True).label() == "gluon-bwd-m128-n128-s2-dss-alt-perm-grp"
        fb.candidate_bwd_configs(64)
    assert calls == [64]
    fb.candidate_bwd_configs(64).clear()  # a copy: the cache keeps its launches
    assert "ws-pss-early" in fb.candidate_bwd_configs(64)
    monkeypatch.setattr(fb, "_ROLES", {64: "ws-pss", 128: "ws-dss-sdq-s2"})
    cfg = fb.gluon_bwd_config(64)
    assert (cfg.ops_smem, cfg.early_dq) == (2, False) and calls == [64, 64]
