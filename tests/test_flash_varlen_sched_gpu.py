"""The packed backward's heaviest-first table and the dK/dV kernel's DP_FIRST order
compiled on a GPU (bf16/fp16): gradients bit for bit those of the first grid order at
the variants suite's 16k-token packed batch, within the accuracy rule of the float64
reference with a window and softcap, and DP_FIRST within the rule too.

`-m gpu` on a CUDA machine (tools/gpu/variants_bwd.sh runs them); skipped on a CPU.
"""

from __future__ import annotations

import pytest
import torch
from packed_gpu import assert_within_rule, run_packed

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_scheduled_packed_backward_equals_the_first_grid_at_16k_tokens(monkeypatch, dtype):
    from fa_bench.kernels import flash_validate
    from fa_bench.variants import varlen_lengths

    lengths = varlen_lengths("uniform:256-3840", 8)  # the variants suite's packed batch
    _, scheduled = run_packed(lengths, 32, 8, 128, dtype, dict(causal=True))
    monkeypatch.setattr(flash_validate, "PACKED_SCHEDULE", False)
    _, first = run_packed(lengths, 32, 8, 128, dtype, dict(causal=True))
    for a, b in zip(scheduled, first, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize(
    "kw",
    [dict(causal=True), dict(causal=True, window=(300, -1), softcap=30.0)],
)
def test_scheduled_packed_backward_within_the_rule(kw):
    lengths = [1, 700, 33, 1024, 5, 400]
    inputs, ours = run_packed(lengths, 8, 2, 128, torch.bfloat16, kw)
    assert_within_rule(inputs, ours, kw)


def test_dkdv_dp_first_within_the_rule(monkeypatch):
    from fa_bench.kernels import flash_validate

    monkeypatch.setattr(flash_validate, "DKDV_DP_FIRST", "variants")  # the default
    kw = dict(causal=True, softcap=50.0)
    inputs, ours = run_packed([1500, 700, 2048], 8, 2, 128, torch.bfloat16, kw)
    assert_within_rule(inputs, ours, kw)
