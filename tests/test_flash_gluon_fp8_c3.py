"""CPU tests of the three-consumer Gluon fp8 launch (Fp8GluonConfig(consumers=3), the
"ws-c3" / "ws-c3-nopp" candidates of kernels/flash_gluon_fp8.py): the config's checks,
its shared memory (three stages fit, four do not), its label, the grid it launches (one
CTA per 192 query rows, the kernel's CONSUMERS constexpr) against the two-consumer
launch's, and the launch table and FlashConfig fields taking or refusing it. The kernel
itself: `slow` compile test of tests/test_flash_gluon_fp8.py (every candidate), GPU tests
in tests/test_flash_gluon_fp8_c3_gpu.py."""

from __future__ import annotations

import dataclasses
import math
import re

import pytest
import torch

from fa_bench.kernels import flash_gluon_fp8, flash_gluon_fp8_kernels
from fa_bench.kernels.flash_config import FlashConfig
from fa_bench.kernels.flash_gluon_fp8 import (
    SMEM_BYTES,
    Fp8GluonConfig,
    candidate_configs,
    fp8_gluon_config,
    from_fields,
)
from fa_bench.kernels.flash_gluon_fp8_table import TABLE_ENV


@pytest.fixture(autouse=True)
def _no_overrides(monkeypatch):
    monkeypatch.delenv(flash_gluon_fp8.ROLE_ENV, raising=False)
    monkeypatch.delenv(TABLE_ENV, raising=False)
    flash_gluon_fp8._resolved.cache_clear()


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        (dict(consumers=4), "consumers=4"),
        (dict(consumers=1), "consumers=1"),
        (dict(consumers=True), "consumers=True"),
        (
            dict(consumers=3, consumer_regs=160, ahead=True, pingpong=False, p_smem=True),
            "ahead=True",
        ),
        (dict(consumers=3), "consumer_regs=240"),  # the 64K registers over four warpgroups
        (dict(o_in_p=1), "o_in_p=1"),
        (dict(o_in_p=True, p_smem=False), "o_in_p=True, persistent=False, p_smem=False"),
        (dict(o_in_p=True, p_smem=True, persistent=True), "persistent=True, p_smem=True"),
    ],
)
def test_config_refuses_what_three_consumers_cannot_run(fields, match):
    with pytest.raises(ValueError, match=re.escape(match)):
        Fp8GluonConfig(**fields)


def test_candidates_are_three_stages_deep_with_160_registers():
    cands = candidate_configs(128)
    c3, nopp = cands["ws-c3"], cands["ws-c3-nopp"]
    assert (c3.consumers, c3.consumer_regs, c3.stages, c3.pingpong, c3.p_smem) == (
        3, 160, 3, True, True,
    )  # fmt: skip
    assert nopp == dataclasses.replace(c3, pingpong=False)
    assert c3.label() == "fp8-ws-m64-n128-s3-psmem-c3"
    assert nopp.label() == "fp8-ws-m64-n128-s3-nopp-psmem-c3"
    # Q 3 × 8 KB + 3 × (K 16 KB + Vᵀ 16 KB) + O (bf16) 3 × 16 KB + P 3 × 2 × 8 KB = 216 KB
    assert c3.smem_bytes(128) == 216 * 1024 <= SMEM_BYTES
    assert dataclasses.replace(c3, stages=4).smem_bytes(128) > SMEM_BYTES
    # the two-consumer launch is unchanged
    assert cands["ws"].consumers == 2 and cands["ws"].label() == "fp8-ws-m64-n128-s4-psmem"
    assert candidate_configs(64)["ws-c3"].stages == 4  # d64's ring is half the size


def test_the_persistent_form_loops_over_192_row_tiles():
    persist = candidate_configs(128)["ws-c3-persist"]
    assert persist == dataclasses.replace(candidate_configs(128)["ws-c3"], persistent=True)
    assert persist.label() == "fp8-ws-m64-n128-s3-psmem-c3-persist"
    assert persist.smem_bytes(128) == 216 * 1024


def test_o_tiles_in_the_p_buffers_make_room_for_a_fourth_stage():
    oinp = candidate_configs(128)["ws-c3-oinp"]
    assert oinp == dataclasses.replace(candidate_configs(128)["ws-c3"], o_in_p=True, stages=4)
    assert oinp.label() == "fp8-ws-m64-n128-s4-psmem-c3-oinp"
    # Q 24 KB + 4 × 32 KB + P (= O) 48 KB = 200 KB
    assert oinp.smem_bytes(128) == 200 * 1024 <= SMEM_BYTES
    # at d64 the P buffers (16 KB per consumer) hold O (8 KB): no extra bytes
    assert (
        dataclasses.replace(oinp, stages=1).smem_bytes(64) == 3 * 64 * 64 + 2 * 128 * 64 + 48 * 1024
    )


class _FakeKernel:
    """Stands in for the @gluon.jit kernel: records the grid and constexprs of a launch."""

    def __init__(self):
        self.launches = []

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.launches.append((grid, kwargs))

        return launch


@pytest.mark.parametrize(("role", "seq_q", "ctas", "consumers"), [
    ("ws-c3", 4096, 22, 3),  # 4096 = 21⅓ × 192: the last CTA has one consumer's rows
    ("ws-c3-nopp", 100, 1, 3),
    ("ws-c3-oinp", 4097, 22, 3),
    ("ws", 4096, 32, 2),
])  # fmt: skip
def test_the_launch_covers_192_rows_per_cta(monkeypatch, role, seq_q, ctas, consumers):
    fake = _FakeKernel()
    monkeypatch.setattr(flash_gluon_fp8_kernels, "_fwd_fp8_ws", fake)
    fp8 = torch.float8_e4m3fn
    q = torch.zeros(2, 4, seq_q, 128, dtype=fp8)
    k = torch.zeros(2, 2, 256, 128, dtype=fp8)
    v = torch.zeros(2, 2, 128, 256, dtype=fp8).transpose(-1, -2)  # K-major
    one = torch.ones(1)
    descales = dict(q_descale=one, k_descale=one, v_descale=one)
    cfg = candidate_configs(128)[role]
    o, lse2 = flash_gluon_fp8.fp8_gluon_forward(q, k, v, descales, True, 1 / math.sqrt(128),
                                                cfg, checked=True)  # fmt: skip
    assert o.shape == q.shape and lse2.shape == (2, 4, seq_q)
    ((grid, consts),) = fake.launches
    assert grid == (ctas, 8)
    assert consts["CONSUMERS"] == consumers and consts["PINGPONG"] == cfg.pingpong
    assert consts["O_IN_P"] == cfg.o_in_p == role.endswith("oinp")
    assert consts["STAGES"] == cfg.stages and consts["CONSUMER_REGS"] == cfg.consumer_regs


def test_the_launch_table_and_the_override_take_it(monkeypatch):
    cands = candidate_configs(128)
    monkeypatch.setenv(TABLE_ENV, "128/0/0=ws-c3,128/0/8192=ws,128/1/0=ws-c3-nopp")
    assert fp8_gluon_config(128, False, 4096) == cands["ws-c3"]
    assert fp8_gluon_config(128, False, 16384) == cands["ws"]
    assert fp8_gluon_config(128, True, 4096) == cands["ws-c3-nopp"]
    monkeypatch.delenv(TABLE_ENV)
    monkeypatch.setenv(flash_gluon_fp8.ROLE_ENV, "ws,ws-c3")
    assert fp8_gluon_config(128, True) == cands["ws-c3"]


def test_fields_over_a_three_consumer_launch(monkeypatch):
    monkeypatch.setenv(flash_gluon_fp8.ROLE_ENV, "ws-c3")
    c3 = candidate_configs(128)["ws-c3"]
    assert from_fields(FlashConfig(gluon_pingpong=False), 128, False) == dataclasses.replace(
        c3, pingpong=False
    )
    assert from_fields(FlashConfig(gluon_stages=2), 128, False).stages == 2
    # four stages do not fit with three consumers: named, with the bytes
    with pytest.raises(ValueError, match=r"gluon_stages=4.*c3 needs 253952 bytes"):
        from_fields(FlashConfig(gluon_stages=4), 128, False)
    # its persistent form
    assert (
        from_fields(FlashConfig(gluon_persistent=True), 128, False)
        == candidate_configs(128)["ws-c3-persist"]
    )
    # the O tiles in the P buffers have none: the store of one tile's O would overlap the
    # next tile's P
    monkeypatch.setenv(flash_gluon_fp8.ROLE_ENV, "ws-c3-oinp")
    with pytest.raises(ValueError, match="o_in_p=True, persistent=True"):
        from_fields(FlashConfig(gluon_persistent=True), 128, False)


def test_o_in_the_p_buffers_needs_keys_per_step_at_least_head_dim():
    cfg = Fp8GluonConfig(block_n=64, p_smem=True, o_in_p=True, stages=2)
    q = torch.zeros(1, 1, 64, 128, dtype=torch.float8_e4m3fn)
    v = torch.zeros(1, 1, 128, 64, dtype=torch.float8_e4m3fn).transpose(-1, -2)
    with pytest.raises(ValueError, match="fp8-ws-m64-n64-s2-psmem-oinp at head_dim=128"):
        flash_gluon_fp8.fp8_gluon_forward(q, q, v, {}, False, 1.0, cfg, checked=True)


def test_the_persistent_kernel_runs_the_plain_kernels_helpers():
    # one key loop, one K/V producer loop, one epilogue (its DEFER flag) for both launches
    from fa_bench.kernels import flash_gluon_fp8_persist as persist

    for name in ("_tile", "_load_kv", "_epilogue"):
        assert getattr(persist, name) is getattr(flash_gluon_fp8_kernels, name)
    assert not hasattr(persist, "_epilogue_deferred")
