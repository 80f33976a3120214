"""GPU tests (`-m gpu`, an sm_90 GPU with triton 3.6) of the three-consumer Gluon fp8
launch ("ws-c3": ping-pong round robin; "ws-c3-nopp"; "ws-c3-oinp": the O tiles in
the P buffers, four stages; "ws-c3-persist": one CTA per SM over 192-row tiles): its
output under the project's fp8 accuracy rule and next to the two-consumer launch's on the
same inputs (the same per-row arithmetic over the same key blocks: a consumer's rows
computed twice, skipped, or mixed with another's show as a large difference), causal
both, GQA 4:1, MQA with rows that see no key, Sq ≠ Sk both ways, odd lengths (a CTA whose
second and third consumers have no rows), fewer rows than one CTA, head_dim 64, the
benchmark's 4k shape (22 CTAs of 192 rows per head), and the persistent form over more
tiles than SMs with the causal order's (batch, head) groups. Skipped on a CPU.
"""

from __future__ import annotations

import pytest
from test_flash_gluon_fp8_gpu import needs_sm90
from test_flash_gluon_fp8_persist_gpu import _agree, _both
from test_fp8_kernel import _case

from fa_bench.kernels.flash_fp8 import dequantize_fp8
from fa_bench.run.accuracy import check_fp8_accuracy

# (batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, causal)
SHAPES = [
    (2, 4, 4, 1000, 1000, 128, False),  # 1000 = 5 × 192 + 40: one consumer in the last CTA
    (2, 4, 4, 1000, 1000, 128, True),
    (1, 8, 2, 784, 1504, 128, True),  # GQA 4:1, Sq < Sk
    (1, 4, 1, 1504, 784, 128, True),  # MQA, rows with no key
    (1, 4, 1, 1504, 784, 128, False),  # Sq > Sk
    (1, 2, 2, 100, 333, 128, True),  # fewer rows than one CTA: two idle consumers
    (1, 2, 2, 300, 4097, 64, False),  # head_dim 64, a one-key tail
    (2, 4, 4, 1000, 1000, 64, True),
]
ROLES = ("ws-c3", "ws-c3-nopp", "ws-c3-oinp", "ws-c3-persist")


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda c: str(c).replace(" ", ""))
def test_gpu_three_consumers_meet_the_rule_and_match_two(shape, role, monkeypatch):
    quantised, c3, plain = _both(shape, monkeypatch, role=role)
    deq = [dequantize_fp8(x, s) for x, s in quantised]
    report = check_fp8_accuracy(_case(shape), *deq, c3[0])
    assert report["passed"], report
    _agree(c3, plain)
    sq, sk = shape[3], shape[4]
    if shape[6] and sq > sk:  # rows that see no key
        assert (c3[0][:, :, : sq - sk] == 0).all()


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("role", ("ws-c3", "ws-c3-oinp", "ws-c3-persist"))
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_three_consumers_at_the_benchmark_shape_match_two(causal, role, monkeypatch):
    # 4 × 16 heads at 4k: 22 CTAs of 192 rows per head, the last with one consumer's rows
    shape = (4, 16, 16, 4096, 4096, 128, causal)
    _quantised, c3, plain = _both(shape, monkeypatch, role=role)
    _agree(c3, plain)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize(("causal", "kv_heads"), [(False, None), (True, 3), (True, None)])
def test_gpu_three_consumers_persistent_over_more_tiles_than_sms(causal, kv_heads, monkeypatch):
    # 4 × 8 heads × 6 tiles of 192 rows = 192 tiles over 132 SMs; causal in (batch, head)
    # groups of 12, 12, 8 (three kv heads' K/V in the L2 share) or all at once
    shape = (4, 8, 2, 1000, 1000, 128, causal)
    quantised, c3, plain = _both(shape, monkeypatch, kv_heads, role="ws-c3-persist")
    deq = [dequantize_fp8(x, s) for x, s in quantised]
    assert check_fp8_accuracy(_case(shape), *deq, c3[0])["passed"]
    _agree(c3, plain)
