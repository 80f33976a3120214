"""GPU tests (`-m gpu`, an sm_90 GPU with triton 3.6) of the persistent Gluon fp8 launch
(kernels/flash_gluon_fp8_persist.py): its output under the project's fp8 accuracy rule and
next to the non-persistent launch's on the same inputs (the same per-tile arithmetic: a
tile skipped, done twice, or whose O store was overwritten shows as a large difference),
causal both, GQA, MQA with rows that see no key, Sq ≠ Sk both ways, odd lengths, fewer
tiles than SMs and many more (the benchmark's 4k shape), and the causal order's (batch,
head) groups: one, several with a shorter last, one GQA group each. Skipped on a CPU.
"""

from __future__ import annotations

import math

import pytest
import torch
from test_flash_gluon_fp8_gpu import needs_sm90
from test_fp8_kernel import _case, _descales, _inputs

from fa_bench.kernels import flash_gluon_fp8, flash_gluon_fp8_table
from fa_bench.kernels.flash_fp8 import dequantize_fp8, fp8_v_layout
from fa_bench.run.accuracy import check_fp8_accuracy

# (batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, causal), L2 share in kv heads
# (None: the default; the groups it gives are in the comment)
CASES = [
    ((4, 8, 2, 1000, 1000, 128, True), 3),  # 256 tiles; groups of 12, 12, 8
    ((4, 8, 2, 1000, 1000, 128, False), None),
    ((1, 4, 1, 1504, 784, 128, True), None),  # MQA, rows with no key, 48 tiles < SMs
    ((2, 8, 2, 784, 1504, 128, True), 1),  # GQA 4:1, Sq < Sk; groups of 4 (one kv head)
    ((1, 2, 2, 300, 4097, 64, False), None),  # head_dim 64, a one-key tail
    ((2, 4, 4, 1000, 1000, 64, True), 2),  # head_dim 64; groups of 2, 2, 2, 2
]


def _forward(shape, cfg, quantised):
    (q8, _), (k8, _), (v8, _) = quantised
    return flash_gluon_fp8.fp8_gluon_forward(
        q8, k8, fp8_v_layout(v8), _descales(quantised), shape[6], 1 / math.sqrt(shape[5]), cfg
    )


def _both(shape, monkeypatch, kv_heads=None, role="ws-persist"):
    cands = flash_gluon_fp8.candidate_configs(shape[5])
    quantised = _inputs(*shape[:6], "cuda", seed=sum(shape[:5]))
    if kv_heads is not None:
        share = kv_heads * 2 * shape[4] * shape[5]
        monkeypatch.setattr(flash_gluon_fp8_table, "L2_SHARE", share)
    o, lse2 = _forward(shape, cands[role], quantised)
    o_ws, lse2_ws = _forward(shape, cands["ws"], quantised)
    return quantised, (o, lse2), (o_ws, lse2_ws)


def _agree(persist, plain):
    (o, lse2), (o_ws, lse2_ws) = persist, plain
    torch.testing.assert_close(o, o_ws, atol=2e-3, rtol=1e-2)
    torch.testing.assert_close(lse2, lse2_ws, atol=1e-4, rtol=0)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize(("shape", "kv_heads"), CASES, ids=lambda c: str(c).replace(" ", ""))
def test_gpu_persistent_meets_the_rule_and_matches_the_plain_launch(shape, kv_heads, monkeypatch):
    quantised, persist, plain = _both(shape, monkeypatch, kv_heads)
    deq = [dequantize_fp8(x, s) for x, s in quantised]
    report = check_fp8_accuracy(_case(shape), *deq, persist[0])
    assert report["passed"], report
    _agree(persist, plain)
    sq, sk = shape[3], shape[4]
    if shape[6] and sq > sk:  # rows that see no key
        assert (persist[0][:, :, : sq - sk] == 0).all()


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_persistent_at_the_benchmark_shape_matches_the_plain_launch(causal, monkeypatch):
    # 4 × 16 heads at 4k: 2048 tiles over 132 SMs; causal in groups of 24, 24, 16
    shape = (4, 16, 16, 4096, 4096, 128, causal)
    assert flash_gluon_fp8_table.persist_bh_group(64, 16, 16, 4096, 128) == 24
    _quantised, persist, plain = _both(shape, monkeypatch)
    _agree(persist, plain)


# the lazy rescale (a row's maximum moves only past LAZY_TAU, O rescaled only where one
# moved): P's scale differs from the plain launch's, so its e4m3 rounding does too; the
# rule, and the lse (exact whichever maximum a row kept) against the plain launch's
LAZY_SHAPES = [
    (2, 4, 4, 1000, 1000, 128, False),
    (1, 4, 1, 1504, 784, 128, True),  # MQA, rows with no key
    (1, 8, 2, 784, 1504, 128, True),  # GQA, Sq < Sk
    (1, 4, 4, 4096, 4096, 128, True),
    (1, 4, 4, 4096, 4096, 128, False),
    (1, 2, 2, 300, 4097, 64, False),
]


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("shape", LAZY_SHAPES, ids=lambda c: str(c).replace(" ", ""))
def test_gpu_lazy_rescale_meets_the_rule_and_keeps_the_lse(shape, monkeypatch):
    quantised, lazy, plain = _both(shape, monkeypatch, role="ws-lazy")
    deq = [dequantize_fp8(x, s) for x, s in quantised]
    report = check_fp8_accuracy(_case(shape), *deq, lazy[0])
    assert report["passed"], report
    torch.testing.assert_close(lazy[1], plain[1], atol=1e-4, rtol=0)
    if shape[6] and shape[3] > shape[4]:
        assert (lazy[0][:, :, : shape[3] - shape[4]] == 0).all()
