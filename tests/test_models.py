"""FLOP and byte models against hand-computed values."""

from __future__ import annotations

import pytest

from fa_bench import models
from fa_bench.case import Case


def case(**kw: object) -> Case:
    base = dict(impl="naive", mode="fwd", dtype="bf16", batch=2, heads_q=4, heads_kv=4,
                seqlen_q=8, seqlen_k=8, head_dim=16, causal=False)  # fmt: skip
    base.update(kw)
    return Case(**base)


@pytest.mark.parametrize(
    ("sq", "sk", "causal", "pairs"),
    [
        (8, 8, False, 64),
        (8, 8, True, 36),  # 1 + 2 + ... + 8
        (1, 8, True, 8),  # a decoding query sees the whole cache
        (4, 8, True, 5 + 6 + 7 + 8),  # bottom-right: row i sees i + 5 keys
        (8, 4, True, 1 + 2 + 3 + 4),  # the first four rows see nothing
        (3, 1, True, 1),
        (1, 1, True, 1),
    ],
)
def test_attended_pairs(sq: int, sk: int, causal: bool, pairs: int) -> None:
    assert models.attended_pairs(sq, sk, causal) == pairs


def test_forward_flops_fa3_convention() -> None:
    # 2 * B * H * Sq * Lbar * (D + Dv) = 2 * 2 * 4 * 64 * 32
    assert models.forward_flops(case()) == 2 * 2 * 4 * 64 * 32 == 32768
    assert models.forward_flops(case(causal=True)) == 2 * 2 * 4 * 36 * 32


def test_mode_factors() -> None:
    fwd = models.case_flops(case())
    assert models.case_flops(case(mode="bwd")) == 2.5 * fwd
    assert models.case_flops(case(mode="fwd_bwd")) == 3.5 * fwd


def test_bytes_gqa_and_modes() -> None:
    c = case(heads_q=8, heads_kv=2, seqlen_q=16, seqlen_k=32, head_dim=64, dtype="fp16")
    q = 2 * 8 * 16 * 64 * 2  # batch, heads, seqlen, dim, bytes
    kv = 2 * 2 * 32 * 64 * 2
    lse = 2 * 8 * 16 * 4
    assert models.forward_bytes(c) == q + 2 * kv + q
    assert models.backward_bytes(c) == (q + 2 * kv + q + q + lse) + (q + 2 * kv)
    assert models.case_bytes(case(mode="fwd_bwd")) == models.forward_bytes(
        case()
    ) + models.backward_bytes(case())


def test_fp32_bytes_double() -> None:
    assert models.forward_bytes(case(dtype="fp32")) == 2 * models.forward_bytes(case())


def test_rates() -> None:
    assert models.tflops(2e12, 1000.0) == pytest.approx(2.0)
    assert models.gbps(4e9, 2.0) == pytest.approx(2000.0)
