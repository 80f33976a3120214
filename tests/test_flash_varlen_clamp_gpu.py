"""The packed dK/dV kernel's clamped loads (flash_validate.PACKED_CLAMP) compiled on a
GPU (bf16/fp16): at the variants suite's 16k-token packed batch, the clamped loads'
gradients (CLAMP 1) bit for bit those of the masked loads, the default (CLAMP 2, whole
row blocks unmasked) bit for bit on a second run; within the accuracy rule of the float64 reference
with lengths 1, whole blocks, ragged and a ragged last sequence, in tensors whose rows
past the packed tokens are NaN (a load past the tensor's end poisons the gradients).

`-m gpu` on a CUDA machine (tools/gpu/variants_bwd.sh PACKED=1 runs them); skipped on a
CPU. The interpreter's versions: tests/test_flash_varlen_clamp.py.
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
def test_clamped_loads_at_16k_tokens(monkeypatch, dtype):
    """CLAMP 1 bit for bit the masked loads; CLAMP 2 (the default) bit for bit itself."""
    from fa_bench.kernels import flash_validate
    from fa_bench.variants import varlen_lengths

    lengths = varlen_lengths("uniform:256-3840", 8)  # the variants suite's packed batch
    runs = {}
    for clamp in (1, 0, 2):
        monkeypatch.setattr(flash_validate, "PACKED_CLAMP", clamp)
        runs[clamp] = run_packed(lengths, 32, 8, 128, dtype, dict(causal=True), nan_pad=True)[1]
    again = run_packed(lengths, 32, 8, 128, dtype, dict(causal=True), nan_pad=True)[1]
    for a, b, c, d in zip(runs[1], runs[0], runs[2], again, strict=True):
        assert torch.equal(a, b) and torch.equal(c, d)


@pytest.mark.parametrize(
    "kw",
    [
        dict(causal=True),
        dict(causal=False),
        dict(causal=True, window=(300, -1), softcap=30.0),
    ],
)
def test_clamped_loads_within_the_rule(kw):
    # length 1, whole blocks (128, 1024), ragged, the last sequence ragged at the end
    lengths = [1, 700, 128, 33, 1024, 5, 401]
    inputs, ours = run_packed(lengths, 8, 2, 128, torch.bfloat16, kw, nan_pad=True)
    assert_within_rule(inputs, ours, kw)
