"""CPU tests of session 8's fp8 launch options (kernels/flash_gluon_fp8_sched.py, the
persistent launch's tile plan, Fp8GluonConfig.lpt; own_end and lean_mask of the
three-consumer key loop): the config's checks and labels, the plan (every tile once, each
CTA's in order, the busiest CTA's work against the round robin's at the benchmark's 4k
causal shape), the tile order against a brute-force count of the keys each row sees, and
the launch's arguments through a stand-in kernel. The kernels: the `slow` compile test of
tests/test_fp8_compile_strict.py, GPU tests in tests/test_flash_gluon_fp8_lpt_gpu.py."""

from __future__ import annotations

import math
import random
import re

import pytest
import torch

from fa_bench.kernels import (
    device_props,
    flash_gluon_fp8,
    flash_gluon_fp8_persist,
    flash_gluon_fp8_sched,
)
from fa_bench.kernels.flash_gluon_fp8 import Fp8GluonConfig, candidate_configs
from fa_bench.kernels.flash_gluon_fp8_sched import (
    busiest_share,
    kv_end,
    lpt_plan,
    tile_cost,
    tile_order,
)
from fa_bench.kernels.flash_gluon_fp8_table import persist_bh_group

# the benchmark's 4k causal shape: 4 × 16 heads, (n_bh, heads_q, seq_q, seq_k)
SHAPE_4K = (64, 16, 4096, 4096)


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        (dict(lpt=True), "lpt=True, persistent=False"),
        (dict(own_end=True), "own_end=True, lean_mask=False, consumers=2"),
        (dict(lean_mask=True, ahead=True, pingpong=False, p_smem=True), "ahead=True"),
        (dict(lpt=1, persistent=True), "lpt=1"),
        (dict(own_end="yes", consumers=3, consumer_regs=160), "own_end='yes'"),
    ],
)
def test_config_names_a_bad_field_and_value(fields, match):
    with pytest.raises(ValueError, match=re.escape(match)):
        Fp8GluonConfig(**fields)


def test_the_roles_labels_and_kernel_codes():
    cands = candidate_configs(128)
    c3 = cands["ws-c3"]
    assert cands["ws-c3-lpt"].label() == "fp8-ws-m64-n128-s3-psmem-c3-persist-lpt"
    assert cands["ws-c3x"].label() == "fp8-ws-m64-n128-s3-psmem-c3-own-lmask"
    assert cands["ws-c3-lptx"].label() == "fp8-ws-m64-n128-s3-psmem-c3-own-lmask-persist-lpt"
    # own_end and lean_mask travel in the SOFTMAX constexpr (bits 64 and 128)
    assert (c3.softmax_code(), cands["ws-c3x"].softmax_code()) == (0, 64 + 128)
    assert cands["ws-c3-lpt"].softmax_code() == 0
    assert Fp8GluonConfig(emu=4, lazy_rescale=True).softmax_code() == 4 + 16
    # the same shared memory as the launches they change
    assert {cands[r].smem_bytes(128) for r in ("ws-c3", "ws-c3x", "ws-c3-lpt")} == {
        c3.smem_bytes(128)
    }


def _brute_end(row0, rows, seq_q, seq_k, block_n, causal):
    n_blocks = -(-seq_k // block_n)
    if not causal:
        return n_blocks
    last = max(r + seq_k - seq_q for r in range(row0, row0 + rows))  # the last key seen
    return min(max(-(-(last + 1) // block_n), 0), n_blocks)


def test_kv_end_is_the_block_of_the_last_key_seen():
    rnd = random.Random(8)
    for _ in range(300):
        seq_q, seq_k = rnd.randint(1, 3000), rnd.randint(1, 3000)
        rows, block_n = rnd.choice((64, 192)), rnd.choice((64, 128))
        row0 = rnd.randrange(0, seq_q, rows) if seq_q > rows else 0
        for causal in (False, True):
            want = _brute_end(row0, rows, seq_q, seq_k, block_n, causal)
            assert kv_end(row0, rows, seq_q, seq_k, block_n, causal) == want


@pytest.mark.parametrize("causal", [False, True])
def test_the_order_covers_every_tile_once_heaviest_first_per_group(causal):
    shape = (12, 4, 1000, 1000)  # 6 tiles of 192 rows per (batch, head)
    order = tile_order(shape, 192, 5, causal)  # groups of 5, 5, 2
    assert sorted(order) == [(bh, m * 192) for bh in range(12) for m in range(6)]
    if causal:
        for first, size in ((0, 5), (30, 5), (60, 2)):
            group = order[first : first + 6 * size]
            assert {bh for bh, _ in group} == set(range(first // 6, first // 6 + size))
            assert [row0 for _, row0 in group] == sorted((r for _, r in group), reverse=True)
    else:  # (batch, head) major
        assert order[:6] == [(0, m * 192) for m in range(6)]


def _round_robin(n_tiles, ctas):
    ids = [list(range(p, n_tiles, ctas)) for p in range(ctas)]
    offsets = [0]
    for mine in ids:
        offsets.append(offsets[-1] + len(mine))
    return offsets + [t for mine in ids for t in mine]


def test_the_plan_hands_every_tile_out_once_in_order():
    shape = (10, 5, 1000, 1000)
    plan = lpt_plan(shape, 7, 3, 64, 128, 4, True)
    offsets, ids = plan[:8], plan[8:]
    assert offsets[0] == 0 and offsets[-1] == len(ids) == 60
    assert sorted(ids) == list(range(60))
    for p in range(7):
        mine = ids[offsets[p] : offsets[p + 1]]
        assert mine == sorted(mine)
    assert lpt_plan(shape, 7, 3, 64, 128, 4, True) == plan  # deterministic


@pytest.mark.parametrize("own_end", [False, True])
def test_the_plan_balances_the_4k_causal_benchmark_shape(own_end):
    group = persist_bh_group(64, 16, 16, 4096, 128)
    tiles = tile_order(SHAPE_4K, 192, group, True)
    costs = [tile_cost(row0, SHAPE_4K, 3, 64, 128, True, own_end) for _, row0 in tiles]
    assert (len(tiles), group) == (1408, 24)
    # the round robin leaves its busiest CTA 1.2 × the mean; the plan 1.02 ×
    assert busiest_share(_round_robin(len(tiles), 132), costs) > 1.18
    plan = lpt_plan(SHAPE_4K, 132, 3, 64, 128, group, True, own_end)
    assert busiest_share(plan, costs) < 1.04


def test_a_tiles_cost_counts_each_consumers_key_blocks():
    shape = (1, 1, 1000, 1000)
    # row0 0: 192 rows see 2 blocks; consumers' own ends 1, 1, 2 (rows 0-63, 64-127, ...)
    assert tile_cost(0, shape, 3, 64, 128, True) == 3 * 2 + flash_gluon_fp8_sched.TILE_COST
    own = 1 + 1 + 2 + 2 * flash_gluon_fp8_sched.IDLE_COST + flash_gluon_fp8_sched.TILE_COST
    assert tile_cost(0, shape, 3, 64, 128, True, own_end=True) == pytest.approx(own)
    # the last tile (row0 960): one consumer has rows, the others pass 8 blocks on
    idle = 2 * 8 * flash_gluon_fp8_sched.IDLE_COST
    assert tile_cost(960, shape, 3, 64, 128, False) == pytest.approx(8 + idle + 2)
    with pytest.raises(ValueError, match="ctas=0"):
        lpt_plan(shape, 0, 3, 64, 128, 1, True)


class _FakeKernel:
    """Stands in for the persistent @gluon.jit kernel: records each launch."""

    def __init__(self):
        self.launches = []

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.launches.append((grid, args, kwargs))

        return launch


@pytest.mark.parametrize("role", ["ws-c3-persist", "ws-c3-lpt", "ws-c3-lptx"])
def test_the_persistent_launch_passes_its_plan(monkeypatch, role):
    fake = _FakeKernel()
    monkeypatch.setattr(flash_gluon_fp8_persist, "_fwd_fp8_persistent", fake)

    monkeypatch.setattr(device_props, "sm_count", lambda device=None: 132)
    fp8 = torch.float8_e4m3fn
    q = torch.zeros(4, 16, 4096, 128, dtype=fp8)
    k = torch.zeros(4, 16, 4096, 128, dtype=fp8)
    v = torch.zeros(4, 16, 128, 4096, dtype=fp8).transpose(-1, -2)  # K-major
    one = torch.ones(1)
    descales = dict(q_descale=one, k_descale=one, v_descale=one)
    cfg = candidate_configs(128)[role]
    for _ in range(2):
        flash_gluon_fp8.fp8_gluon_forward(q, k, v, descales, True, 1 / math.sqrt(128), cfg,
                                          checked=True)  # fmt: skip
    (grid, args, consts), (_, args2, _) = fake.launches
    assert grid == (132,) and consts["LPT"] == cfg.lpt == role.startswith("ws-c3-lpt")
    assert consts["SOFTMAX"] == cfg.softmax_code() and consts["CONSUMERS"] == 3
    n_bh, group, plan = args[-3:]
    assert (n_bh, group) == (64, 24)
    if not cfg.lpt:
        assert plan is None  # a constexpr: the round robin's code is unchanged
        return
    assert plan.dtype == torch.int32
    assert plan.tolist() == lpt_plan(SHAPE_4K, 132, 3, 64, 128, 24, True, cfg.own_end)
    assert args2[-1] is plan  # built once per launch shape
