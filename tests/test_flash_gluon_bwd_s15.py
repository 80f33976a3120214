"""Issue 18, session 15: the causal Gluon backward's grid order (`GluonBwdConfig.head_groups`,
kernels/flash_gluon_bwd_order.py). A head's key blocks run together, heaviest first; the
grid's last wave then still holds the last heads' heaviest CTAs. Interleaving the key
blocks of a few heads puts light CTAs last. On a CPU: the mapping is a permutation of the
grid (ragged last group too) that runs each group's first key blocks first, the model's
choice (groups at 4k causal on 132 SMs, none at 16k, none past the L2 share, none in one
wave), the config's checks and the launch passing the choice. On the GPU: forced groups
(ragged, and every head) give dK and dV bit for bit those of the head-major order and dQ
within the accuracy rule."""

from __future__ import annotations

import dataclasses
import importlib
import math

import pytest
import torch
from gluon_bwd_helpers import needs_cuda, tool

from fa_bench.kernels import flash_gluon_bwd_plan
from fa_bench.kernels.flash_gluon_bwd import GluonBwdConfig, candidate_bwd_configs
from fa_bench.kernels.flash_gluon_bwd_order import causal_head_group, grid_position, makespan

ROLE = "ws-dss-sdq-s2-alt-perm-grp"
H200 = (132, 50 * 2**20)  # SMs, L2 bytes


GRIDS = [(8, 6, 1), (8, 6, 4), (8, 6, 5), (8, 6, 6), (1, 3, 2), (32, 64, 4)]


@pytest.mark.parametrize(("blocks", "heads", "group"), GRIDS)
def test_grid_position_is_a_permutation_of_the_grid(blocks, heads, group):
    seen = [grid_position(pid, blocks, heads, group) for pid in range(blocks * heads)]
    assert sorted(seen) == [(kb, h) for kb in range(blocks) for h in range(heads)]


def test_group_one_is_head_major_and_a_group_runs_first_blocks_first():
    assert [grid_position(p, 4, 3, 1) for p in range(12)] == [
        (kb, h) for h in range(3) for kb in range(4)
    ]
    # heads 0-3 interleaved, then what is left (4, 5): key block 0 of each head first
    order = [grid_position(p, 3, 6, 4) for p in range(18)]
    assert order[:8] == [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1), (1, 2), (1, 3)]
    assert order[12:] == [(0, 4), (0, 5), (1, 4), (1, 5), (2, 4), (2, 5)]


def test_makespan_of_equal_work_does_not_depend_on_the_order():
    times = {makespan([7] * 16, 12, g, 10) for g in (1, 2, 3, 4, 12)}
    assert len(times) == 1


def test_the_model_interleaves_heads_at_4k_causal_and_not_at_16k():
    """bf16 head_dim 128 (query blocks of 64, key blocks of 128) on the H200's 132 SMs:
    the standard suite's 4k causal (4 × 16 heads) and 16k causal (1 × 16)."""
    head_bytes = lambda n: n * 128 * 8  # noqa: E731
    g4 = causal_head_group(4096, 4096, 64, 128, 64, head_bytes(4096), *H200)
    assert g4 > 1
    work = [64 - 2 * kb for kb in range(32)]
    assert makespan(work, 64, g4, 132) < 0.97 * makespan(work, 64, 1, 132)
    assert causal_head_group(16384, 16384, 64, 128, 16, head_bytes(16384), *H200) == 1


@pytest.mark.parametrize(("heads", "l2", "sms"), [(64, 2**20, 132), (1, 2**30, 132),
                                                  (64, 2**30, 0), (2, 2**30, 132)])  # fmt: skip
def test_the_model_keeps_head_major_where_groups_cannot_help(heads, l2, sms):
    """A group's workspaces past L2's share, one head, no SM count (no CUDA device), and
    one wave (2 heads of 32 key blocks on 132 SMs)."""
    assert causal_head_group(4096, 4096, 64, 128, heads, 4096 * 128 * 8, sms, l2) == 1


def test_config_head_groups_checks_and_label():
    cfg = candidate_bwd_configs(128)[ROLE]
    assert cfg.head_groups and cfg.label().endswith("-grp")
    assert dataclasses.replace(cfg, head_groups=False) == candidate_bwd_configs(128)[ROLE[:-4]]
    with pytest.raises(ValueError, match="one grid order"):
        GluonBwdConfig(head_groups=True, kb_major=True)
    with pytest.raises(ValueError, match=r"GluonBwdConfig.head_groups=1: expected a bool"):
        GluonBwdConfig(head_groups=1)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("groups", [False, True])
def test_the_launch_passes_the_models_group_when_causal(monkeypatch, causal, groups):
    pytest.importorskip("triton.experimental.gluon")
    from test_flash_gluon_bwd_plan import _io

    asked = []
    monkeypatch.setattr(flash_gluon_bwd_plan, "_sms_l2", lambda: H200)

    def model(*args):
        asked.append(args)
        return 2

    monkeypatch.setattr(flash_gluon_bwd_plan, "causal_head_group", model)
    cfg = dataclasses.replace(candidate_bwd_configs(128)[ROLE], head_groups=groups)
    (q, k, v, _, do, dk, dv, _, dq_ws), lse2, delta = _io((2, 4, 64, 128), heads_kv=2)
    _, grid, args, _ = flash_gluon_bwd_plan.main_call(
        cfg, (q, k, v, do, dk, dv, dq_ws), lse2, delta, causal, 0.1)  # fmt: skip
    expect = 2 if causal and groups else 1
    # (group, key blocks, heads / group): no runtime argument, the kernel reads program ids
    # the scale ends the dense arguments (the variant's six unused values follow)
    assert grid == (expect, 1, 4 // expect) and args[-7] == 0.1
    # (seq_q, seq_k, block_m, block_n, batch · kv heads, a kv head's bytes, SMs, L2)
    assert asked == ([(64, 64, 64, 128, 4, 2 * 64 * 128 * 8, *H200)] if expect == 2 else [])


def test_a_group_that_does_not_divide_the_heads_is_refused(monkeypatch):
    """The grid has heads / group groups: the model offers only divisors; anything else
    would drop heads, so the launch refuses it."""
    pytest.importorskip("triton.experimental.gluon")
    from test_flash_gluon_bwd_plan import _io

    monkeypatch.setattr(flash_gluon_bwd_plan, "causal_head_group", lambda *a: 3)
    cfg = candidate_bwd_configs(128)[ROLE]
    (q, k, v, _, do, dk, dv, _, dq_ws), lse2, delta = _io((2, 4, 64, 128), heads_kv=2)
    with pytest.raises(ValueError, match="a group of 3 heads does not divide the 4 heads"):
        flash_gluon_bwd_plan.main_call(cfg, (q, k, v, do, dk, dv, dq_ws), lse2, delta, True, 0.1)


@pytest.mark.parametrize(("seq", "heads"), [(4096, 7), (2048, 11), (1536, 13), (4096, 12)])
def test_the_model_takes_only_groups_dividing_the_heads(seq, heads):
    """d128 causal on 132 SMs: before session 16 the model chose 4 of 7 heads at 4k, 4 of
    11 at 2k and 8 of 13 at 1.5k (a ragged last group, which the launch's grid cannot
    hold); now only divisors, and 12 heads still get a group."""
    group = causal_head_group(seq, seq, 64, 128, heads, seq * 128 * 8, *H200)
    assert heads % group == 0
    assert group > 1 or heads in (7, 11, 13)


@pytest.mark.parametrize("causal", [False, True])
def test_kb_major_is_one_group_of_every_head(causal):
    """Session 5's key-block-major order through the group mapping (no constexpr of its
    own since session 16): the (key blocks, heads) grid with head_group = all heads,
    which grid_position maps key block slowest."""
    pytest.importorskip("triton.experimental.gluon")
    from test_flash_gluon_bwd_plan import _io

    cfg = candidate_bwd_configs(128)["ws-kbmajor"]
    (q, k, v, _, do, dk, dv, _, dq_ws), lse2, delta = _io((2, 4, 300, 128), heads_kv=2)
    _, grid, _, kwargs = flash_gluon_bwd_plan.main_call(
        cfg, (q, k, v, do, dk, dv, dq_ws), lse2, delta, causal, 0.1)  # fmt: skip
    assert grid == (4, 3, 1) and "KB_MAJOR" not in kwargs
    order = [grid_position(pid, 3, 4, 4) for pid in range(12)]
    assert order == [(kb, h) for kb in range(3) for h in range(4)]


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("group", [2, 3, 6])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_gpu_forced_groups_give_the_head_major_gradients(monkeypatch, head_dim, group):
    """6 (batch · kv heads) heads of 8 key blocks, GQA 2:1: groups of 2 and 3 heads, and
    6, every head (the key-block-major order). dK and dV are each one CTA's: bit for bit
    the head-major order's; dQ's fp32 adds land in another order: the accuracy rule."""
    from fa_bench.kernels.flash_config import heuristic_config
    from fa_bench.kernels.flash_gluon_bwd import gluon_backward

    check = tool("gluon_bwd_check")
    shape = (2, 6, 3, 1000, 1000, False)
    q, k, v, do = check._inputs(shape, torch.bfloat16, head_dim)
    scale = 1.0 / math.sqrt(head_dim)
    fa = importlib.import_module("fa_bench.kernels.flash_attention")
    cfg = heuristic_config(head_dim, q.dtype, True, q.device, 1000)
    o, lse2 = fa._forward(q, k, v, True, scale, cfg)
    gcfg = candidate_bwd_configs(head_dim)[ROLE]
    out = {}
    for g in (1, group):
        monkeypatch.setattr(flash_gluon_bwd_plan, "causal_head_group", lambda *a, g=g: g)
        flash_gluon_bwd_plan.clear()
        out[g] = [t.clone() for t in gluon_backward(do, q, k, v, o, lse2, True, scale, gcfg)]
    flash_gluon_bwd_plan.clear()
    assert torch.equal(out[1][1], out[group][1]) and torch.equal(out[1][2], out[group][2])
    res = check.check_slices(shape, "bf16", head_dim, True, (q, k, v, o, do, out[group]))
    assert res["passed"], res
