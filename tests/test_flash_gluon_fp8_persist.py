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


# the dispatch table (ROLE_TABLE): the heuristic's role per (head_dim, causal, seqlen_q range)
RANGES = {(128, False): ((0, "ws"), (2048, "ws-persist")), (128, True): ((0, "ws-lazy"),)}


def test_table_picks_the_role_of_the_range_holding_seq_q(monkeypatch):
    from fa_bench.kernels import flash_gluon_fp8

    monkeypatch.delenv(flash_gluon_fp8.ROLE_ENV, raising=False)
    monkeypatch.setattr(table, "ROLE_TABLE", RANGES)
    cands = flash_gluon_fp8.candidate_configs(128)
    assert [table.table_range(128, False, n) for n in (None, 1, 2047, 2048, 16384)] == [
        0,
        0,
        0,
        1,
        1,
    ]
    assert table.range_start(128, False, 1) == 2048
    assert flash_gluon_fp8.fp8_gluon_config(128, False, 1024) == cands["ws"]
    assert flash_gluon_fp8.fp8_gluon_config(128, False, 4096) == cands["ws-persist"]
    assert flash_gluon_fp8.fp8_gluon_config(128, False) == cands["ws"]  # no seq_q: the first
    assert flash_gluon_fp8.fp8_gluon_config(128, True, 4096) == cands["ws-lazy"]
    # a (head_dim, causal) the table lacks: the plain launch
    assert (
        flash_gluon_fp8.fp8_gluon_config(64, True, 4096)
        == flash_gluon_fp8.candidate_configs(64)["ws"]
    )
    # the override still wins
    monkeypatch.setenv(flash_gluon_fp8.ROLE_ENV, "ws-s3")
    assert flash_gluon_fp8.fp8_gluon_config(128, False, 4096) == cands["ws-s3"]


def test_every_table_role_is_a_candidate():
    from fa_bench.kernels import flash_gluon_fp8

    for (head_dim, _causal), ranges in table.ROLE_TABLE.items():
        starts = [start for start, _ in ranges]
        assert starts[0] == 0 and starts == sorted(set(starts))
        assert {role for _, role in ranges} <= set(flash_gluon_fp8.candidate_configs(head_dim))


def test_the_dispatch_resolves_once_per_range_and_names_the_persistent_launch(monkeypatch):
    import torch

    from fa_bench.kernels import flash_fp8, flash_gluon_fp8
    from fa_bench.kernels.flash_config import FlashConfig

    monkeypatch.delenv(flash_gluon_fp8.ROLE_ENV, raising=False)
    monkeypatch.setattr(table, "ROLE_TABLE", RANGES)
    monkeypatch.setattr(flash_gluon_fp8, "fp8_gluon_reason", lambda *a, **k: None)
    monkeypatch.setattr(flash_gluon_fp8, "_PAYS_FROM_SEQ_K", {(128, False): 1024})
    flash_gluon_fp8._resolved.cache_clear()

    def inputs(sq):
        q, k, v = (torch.zeros(1, 2, n, 128).to(torch.float8_e4m3fn) for n in (sq, 1024, 1024))
        return q, k, flash_fp8.fp8_v_layout(v)

    cfg = FlashConfig()
    short = flash_gluon_fp8.fp8_gluon_choice(*inputs(1000), False, cfg)
    long = flash_gluon_fp8.fp8_gluon_choice(*inputs(4096), False, cfg)
    assert not short.persistent and long.persistent
    assert long.label().endswith("-persist")
    assert flash_gluon_fp8.fp8_gluon_choice(*inputs(8192), False, cfg) is long
    assert flash_gluon_fp8._resolved.cache_info().hits == 1
    # a FlashConfig field still lays over the table's launch
    forced = flash_gluon_fp8.fp8_gluon_choice(
        *inputs(4096), False, FlashConfig(gluon_persistent=False)
    )
    assert not forced.persistent


def test_the_table_takes_the_persistent_launches_with_the_tile_plan_for_causal(monkeypatch):
    # the H200's session 9 call 2 (three consumers, causal): ws-c3-persist / ws-c3-lpt /
    # ws-c3-lptx 719.7 / 770.0 / 785.7 at 4k, 820.2 / 891.6 / 901.9 at 16k; non-causal
    # (session 7 call 2) 929.3 / 971.6 persistent against 910.9 / 947.4
    from fa_bench.kernels import flash_gluon_fp8

    monkeypatch.delenv(flash_gluon_fp8.ROLE_ENV, raising=False)
    monkeypatch.delenv(table.TABLE_ENV, raising=False)
    assert table.table_role(128, True, 4096) == table.table_role(128, True, 16384)
    assert table.table_role(128, True, 4096) == "ws-c3-lptx"
    assert table.table_role(128, False, 4096) == table.table_role(128, False, 16384)
    assert table.table_role(128, False, 4096) == "ws-c3-persist"
    for n in (4096, 16384):
        cfg = flash_gluon_fp8.fp8_gluon_config(128, True, n)
        assert cfg.persistent and cfg.lpt and cfg.own_end and cfg.lean_mask


def test_the_table_override_replaces_one_causality_s_ranges(monkeypatch):
    from fa_bench.kernels import flash_gluon_fp8

    monkeypatch.delenv(flash_gluon_fp8.ROLE_ENV, raising=False)
    monkeypatch.setenv(table.TABLE_ENV, "128/0/0=ws-lazy, 128/0/8192=ws-nopp")
    assert table.table_role(128, False, 4096) == "ws-lazy"
    assert table.table_role(128, False, 16384) == "ws-nopp"
    assert table.table_role(128, True, 4096) == "ws-c3-lptx"  # not overridden
    cands = flash_gluon_fp8.candidate_configs(128)
    assert flash_gluon_fp8.fp8_gluon_config(128, False, 16384) == cands["ws-nopp"]


def test_the_dispatch_notices_a_changed_table_override(monkeypatch):
    import torch

    from fa_bench.kernels import flash_fp8, flash_gluon_fp8
    from fa_bench.kernels.flash_config import FlashConfig

    monkeypatch.delenv(flash_gluon_fp8.ROLE_ENV, raising=False)
    monkeypatch.setattr(flash_gluon_fp8, "fp8_gluon_reason", lambda *a, **k: None)
    monkeypatch.setattr(flash_gluon_fp8, "_PAYS_FROM_SEQ_K", {(128, False): 1024})
    q, k, v = (torch.zeros(1, 2, 1024, 128).to(torch.float8_e4m3fn) for _ in range(3))
    v = flash_fp8.fp8_v_layout(v)
    monkeypatch.setenv(table.TABLE_ENV, "128/0/0=ws-lazy")
    assert flash_gluon_fp8.fp8_gluon_choice(q, k, v, False, FlashConfig()).lazy_rescale
    monkeypatch.setenv(table.TABLE_ENV, "128/0/0=ws-persist")
    assert flash_gluon_fp8.fp8_gluon_choice(q, k, v, False, FlashConfig()).persistent


@pytest.mark.parametrize(
    "text",
    [
        "128/0=ws",
        "128/2/0=ws",
        "128/01/0=ws",
        "x/0/0=ws",
        "128/0/0=",
        "128/0/64=ws",
        "128/0/0=ws,128/0/0=ws-lazy",
    ],
)
def test_a_bad_table_override_is_named(text, monkeypatch):
    monkeypatch.setenv(table.TABLE_ENV, text)
    with pytest.raises(ValueError, match=r"FA_BENCH_FP8_GLUON_TABLE"):
        table.table_role(128, False, 4096)


def test_an_unknown_role_in_the_override_is_named(monkeypatch):
    from fa_bench.kernels import flash_gluon_fp8

    monkeypatch.delenv(flash_gluon_fp8.ROLE_ENV, raising=False)
    monkeypatch.setenv(table.TABLE_ENV, "128/1/0=ws-nope")
    with pytest.raises(ValueError, match="'ws-nope' is not one of"):
        flash_gluon_fp8.fp8_gluon_config(128, True, 4096)
