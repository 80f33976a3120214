"""GPU tests (`-m gpu`, an sm_90 GPU with triton 3.6) of the Gluon fp8 forward
(kernels/flash_gluon_fp8.py): every candidate launch under the project's fp8 accuracy
rule (fa_bench.run.accuracy.check_fp8_accuracy) and the lse rule of test_fp8_kernel
(twice a bf16 baseline's error of the float64 lse), causal and not, GQA 4:1, MQA, odd
lengths (V's K-major rows padded for TMA), Sq ≠ Sk both ways with rows that see no key
(o = 0, lse −inf), length 1, 4k; the automatic dispatch taking it, and the `triton`
adapter's backend naming it. Skipped on a CPU.
"""

from __future__ import annotations

import math
import os

import pytest
import torch
from test_fp8_kernel import _case, _check_lse, _descales, _inputs

from fa_bench.kernels import flash_fp8, flash_gluon_fp8
from fa_bench.kernels.flash_config import FlashConfig
from fa_bench.kernels.flash_fp8 import dequantize_fp8, flash_attention_fp8, fp8_v_layout
from fa_bench.run.accuracy import check_fp8_accuracy

PAYS = {(128, False): 1024, (128, True): 1024}
needs_sm90 = pytest.mark.skipif(
    not torch.cuda.is_available()
    or os.environ.get("TRITON_INTERPRET") == "1"
    or torch.cuda.get_device_capability() != (9, 0),
    reason="needs an sm_90 GPU",
)

# (batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, causal)
SHAPES = [
    (2, 4, 4, 1000, 1000, 128, False),  # odd lengths, V padded
    (2, 4, 4, 1000, 1000, 128, True),
    (1, 8, 2, 784, 1504, 128, True),  # GQA 4:1, Sq < Sk
    (1, 4, 1, 1504, 784, 128, True),  # MQA, rows with no key
    (1, 2, 2, 1, 1, 128, False),  # one token
    (1, 2, 2, 300, 4097, 64, False),  # Sq < Sk, a tail of one key
    (1, 2, 2, 4096, 4096, 128, True),
    (1, 4, 2, 1000, 1000, 64, True),
]
# the launches the dispatch may take (the heuristic's and the candidates still in the
# running after call B); the exp2-emulating and smaller-tile ones measured slower and
# are checked by tools/gpu/fp8_gluon_check.py only
ROLES = ("ws", "ws-preg", "ws-ahead", "ws-persist", "ws-lazy", "ws-nopp", "ws-s3")
# every shape for the heuristic's launch, P in registers and QK ahead; for the others
# causal GQA with Sq < Sk, MQA with rows that see no key, head_dim 64 with a one-key tail
FULL = ("ws", "ws-preg", "ws-ahead")
CASES = [(role, shape) for role in ROLES for shape in SHAPES
         if role in FULL or shape in (SHAPES[2], SHAPES[3], SHAPES[5])]  # fmt: skip
# the persistent kernel with more tiles (256) than SMs: CTAs loop over several tiles
CASES += [("ws-persist", (4, 8, 2, 1000, 1000, 128, causal)) for causal in (False, True)]


def _run(shape, cfg, seed=0):
    b, hq, hkv, sq, sk, d, causal = shape
    quantised = _inputs(b, hq, hkv, sq, sk, d, "cuda", seed=seed)
    (q8, _), (k8, _), (v8, _) = quantised
    scale = 1 / math.sqrt(d)
    o, lse2 = flash_gluon_fp8.fp8_gluon_forward(
        q8, k8, fp8_v_layout(v8), _descales(quantised), causal, scale, cfg
    )
    return quantised, o, lse2


def _check(shape, quantised, o, lse2):
    sq, sk, causal = shape[3], shape[4], shape[6]
    deq = [dequantize_fp8(x, s) for x, s in quantised]
    report = check_fp8_accuracy(_case(shape), *deq, o)
    assert report["passed"], report
    lse = torch.where(torch.isinf(lse2), float("-inf"), lse2 * math.log(2))
    if sq * sk <= 1600 * 1600:
        _check_lse(lse, quantised, causal)
    if causal and sq > sk:  # rows that see no key
        assert (o[:, :, : sq - sk] == 0).all()


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize(("role", "shape"), CASES, ids=lambda c: str(c).replace(" ", ""))
def test_gpu_every_candidate_meets_the_fp8_rule(role, shape):
    cfg = flash_gluon_fp8.candidate_configs(shape[5])[role]
    quantised, o, lse2 = _run(shape, cfg, seed=sum(shape[:5]))
    assert o.dtype == torch.bfloat16 and o.shape == quantised[0][0].shape
    _check(shape, quantised, o, lse2)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_dispatch_takes_gluon_and_agrees_with_the_rule(causal, monkeypatch):
    monkeypatch.setattr(flash_gluon_fp8, "_PAYS_FROM_SEQ_K", PAYS)
    shape = (1, 8, 2, 1536, 1536, 128, causal)
    quantised = _inputs(*shape[:6], "cuda", seed=7)
    (q8, _), (k8, _), (v8, _) = quantised
    vt = fp8_v_layout(v8)
    assert flash_fp8.fp8_kernel_choice(q8, k8, vt, causal, None) is not None
    o, lse = flash_attention_fp8(q8, k8, vt, **_descales(quantised), causal=causal,
                                 return_lse=True)  # fmt: skip
    _check_lse(lse, quantised, causal)
    deq = [dequantize_fp8(x, s) for x, s in quantised]
    assert check_fp8_accuracy(_case(shape), *deq, o)["passed"]
    o_tl = flash_attention_fp8(q8, k8, vt, **_descales(quantised), causal=causal,
                               config=FlashConfig(forward="tl"))  # fmt: skip
    assert not torch.equal(o, o_tl)  # two kernels ran (different summation orders)
    assert check_fp8_accuracy(_case(shape), *deq, o_tl)["passed"]


@pytest.mark.gpu
@needs_sm90
def test_gpu_forced_gluon_pads_an_unaligned_v_and_the_rule_fails_a_wrong_output():
    shape = (1, 4, 4, 1000, 1000, 128, True)
    quantised = _inputs(*shape[:6], "cuda", seed=9)
    (q8, _), (k8, _), (v8, _) = quantised
    assert flash_fp8.fp8_kernel_choice(q8, k8, v8, True, None) is None  # auto: tl
    forced = FlashConfig(forward="gluon")
    o = flash_attention_fp8(q8, k8, v8, **_descales(quantised), causal=True, config=forced)
    deq = [dequantize_fp8(x, s) for x, s in quantised]
    assert check_fp8_accuracy(_case(shape), *deq, o)["passed"]
    assert not check_fp8_accuracy(_case(shape), *deq, o * 1.25)["passed"]


@pytest.mark.gpu
@needs_sm90
def test_gpu_adapter_backend_names_the_gluon_kernel(monkeypatch):
    from fa_bench.kernels import flash_fp8_impl

    monkeypatch.setattr(flash_gluon_fp8, "_PAYS_FROM_SEQ_K", PAYS)
    shape = (1, 4, 4, 4096, 4096, 128, False)
    quantised = _inputs(*shape[:6], "cuda", seed=11)
    (q8, _), (k8, _), (v8, _) = quantised
    prepared = flash_fp8_impl.build(
        _case(shape), q8, k8, fp8_v_layout(v8), {"fp8_descale": _descales(quantised)},
        FlashConfig(), "triton-fp8", "heuristic",
    )  # fmt: skip
    label = flash_gluon_fp8.fp8_gluon_config(128).label()
    assert prepared.backend.startswith(f"triton-fp8:gluon-{label} (heuristic)")
