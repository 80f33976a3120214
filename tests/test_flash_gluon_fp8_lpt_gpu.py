"""GPU tests (`-m gpu`, an sm_90 GPU with triton 3.6) of session 8's fp8 launches:
"ws-c3-lpt" (the persistent three-consumer launch with the host's tile plan,
kernels/flash_gluon_fp8_sched.py), "ws-c3x" (each consumer stops at its own last key
block, the one-compare causal mask) and "ws-c3-lptx" (both). Each under the project's fp8
accuracy rule and next to the launch it changes on the same inputs: the plan only moves
tiles between CTAs, so "ws-c3-lpt" must equal "ws-c3-persist" bit for bit (a tile skipped
or done twice, or an O tile overwritten, shows); the blocks own_end leaves out are all
masked for that consumer (P = 0 there; only alpha's rounding differs). Causal both, GQA
4:1, MQA with rows that see no key, Sq ≠ Sk both ways, odd lengths with idle consumers,
fewer rows than a CTA, head_dim 64, more tiles than SMs in (batch, head) groups, the
benchmark's 4k and 16k causal shapes. Skipped on a CPU."""

from __future__ import annotations

import pytest
import torch
from test_flash_gluon_fp8_c3_gpu import SHAPES
from test_flash_gluon_fp8_gpu import needs_sm90
from test_flash_gluon_fp8_persist_gpu import _forward
from test_fp8_kernel import _case, _inputs

from fa_bench.kernels import flash_gluon_fp8, flash_gluon_fp8_table
from fa_bench.kernels.flash_fp8 import dequantize_fp8
from fa_bench.run.accuracy import check_fp8_accuracy

# role -> the launch it changes
BASE = {"ws-c3-lpt": "ws-c3-persist", "ws-c3x": "ws-c3", "ws-c3-lptx": "ws-c3-persist"}


def _pair(shape, role, monkeypatch, kv_heads=None):
    if kv_heads is not None:  # the L2 share in kv heads: the causal order's groups
        share = kv_heads * 2 * shape[4] * shape[5]
        monkeypatch.setattr(flash_gluon_fp8_table, "L2_SHARE", share)
    cands = flash_gluon_fp8.candidate_configs(shape[5])
    quantised = _inputs(*shape[:6], "cuda", seed=sum(shape[:5]))
    new = _forward(shape, cands[role], quantised)
    base = _forward(shape, cands[BASE[role]], quantised)
    return quantised, new, base


def _same(role, new, base):
    (o, lse2), (o_b, lse2_b) = new, base
    if role == "ws-c3-lpt":
        assert torch.equal(o, o_b) and torch.equal(lse2, lse2_b)
    else:
        torch.testing.assert_close(o, o_b, atol=1e-3, rtol=1e-2)
        torch.testing.assert_close(lse2, lse2_b, atol=1e-5, rtol=0)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("role", sorted(BASE))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda c: str(c).replace(" ", ""))
def test_gpu_session8_launches_meet_the_rule_and_match_their_base(shape, role, monkeypatch):
    quantised, new, base = _pair(shape, role, monkeypatch)
    deq = [dequantize_fp8(x, s) for x, s in quantised]
    report = check_fp8_accuracy(_case(shape), *deq, new[0])
    assert report["passed"], report
    _same(role, new, base)
    sq, sk = shape[3], shape[4]
    if shape[6] and sq > sk:  # rows that see no key
        assert (new[0][:, :, : sq - sk] == 0).all()
        assert torch.isinf(new[1][:, :, : sq - sk]).all()


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("role", ["ws-c3-lpt", "ws-c3-lptx"])
@pytest.mark.parametrize("kv_heads", [3, None])
def test_gpu_planned_over_more_tiles_than_sms(role, kv_heads, monkeypatch):
    # 4 × 8 heads × 6 tiles of 192 rows = 192 tiles over 132 SMs; (batch, head) groups of
    # 12, 12, 8 (three kv heads' K/V in the L2 share) or all 32 at once
    shape = (4, 8, 2, 1000, 1000, 128, True)
    quantised, new, base = _pair(shape, role, monkeypatch, kv_heads)
    deq = [dequantize_fp8(x, s) for x, s in quantised]
    assert check_fp8_accuracy(_case(shape), *deq, new[0])["passed"]
    _same(role, new, base)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("role", sorted(BASE))
@pytest.mark.parametrize("seq", [4096, 16384])
def test_gpu_session8_launches_at_the_benchmark_shapes(role, seq, monkeypatch):
    # 4 × 16 heads at 4k (1408 tiles, groups of 24 heads), 1 × 16 at 16k (1376, of 6)
    shape = (4 if seq == 4096 else 1, 16, 16, seq, seq, 128, True)
    _quantised, new, base = _pair(shape, role, monkeypatch)
    assert torch.isfinite(new[0]).all()
    _same(role, new, base)
