"""CPU tests of the persistent Gluon fp8 launch's host-side choices
(kernels/flash_gluon_fp8_table.py): the causal order's (batch, head) groups sized to the
L2 share, whole GQA groups, bad input refused."""

from __future__ import annotations

import pytest

from fa_bench.kernels import flash_gluon_fp8_table as table
from fa_bench.kernels.flash_gluon_fp8_table import persist_bh_group


def test_groups_fit_the_l2_share_at_the_benchmark_shapes():
    # 4 × 16 heads at 4k, head_dim 128: 1 MB of fp8 K/V per head, 24 in the 24 MB share
    assert persist_bh_group(64, 16, 16, 4096, 128) == 24
    # 16k: 4 MB per head
    assert persist_bh_group(16, 16, 16, 16384, 128) == 6
    # small K/V: every (batch, head) in one group (the bf16 kernel's order)
    assert persist_bh_group(32, 8, 2, 1000, 128) == 32


def test_groups_are_whole_gqa_groups_and_at_least_one(monkeypatch):
    monkeypatch.setattr(table, "L2_SHARE", 3 * 2 * 1000 * 128)
    # three kv heads' K/V fit: 3 × 4 query heads
    assert persist_bh_group(32, 8, 2, 1000, 128) == 12
    monkeypatch.setattr(table, "L2_SHARE", 1)
    # not even one kv head fits: one GQA group all the same
    assert persist_bh_group(32, 8, 2, 1000, 128) == 4
    assert persist_bh_group(3, 1, 1, 1 << 20, 256) == 1


@pytest.mark.parametrize(
    ("args", "name"),
    [
        ((0, 8, 2, 1000, 128), "n_bh=0"),
        ((32, 8, 2, -1, 128), "seq_k=-1"),
        ((32, 8, 2, 1000, True), "head_dim=True"),
        ((32, 8.0, 2, 1000, 128), "heads_q=8.0"),
    ],
)
def test_bad_arguments_are_named(args, name):
    with pytest.raises(ValueError, match=name):
        persist_bh_group(*args)


def test_heads_q_must_be_a_multiple_of_heads_kv():
    with pytest.raises(ValueError, match="heads_q=6 is not a multiple of heads_kv=4"):
        persist_bh_group(12, 6, 4, 1000, 128)
