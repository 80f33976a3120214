"""The fp8 (e4m3) forward kernel, fa_bench.kernels.flash_fp8.flash_attention_fp8.

GPU (`-m gpu`, the compiled kernel on sm_89+): the output under the project's fp8
accuracy rule (fa_bench.run.accuracy.check_fp8_accuracy) and the lse against float64,
causal and not, GQA, odd lengths, rows with no key, head_dim 64/96/128, 16k tokens.

CPU (the Triton interpreter): the interpreter's fp8 dots are exact but its fp32 → e4m3
rounding is wrong (a carry into the exponent is lost: 125.2 → 64; subnormals flush to 0),
so P's quantisation cannot be checked there. What does not depend on it is: the lse
(QKᵀ in fp8 with the descales folded in, masks, GQA, tails: lse sums the fp32 P) and an
output whose P is exact in e4m3 (q = 0: every visible key gets P = 256, so o is the mean
of the visible values: the PV matmul, the K-major V, the V descale, causal, tails).
"""

from __future__ import annotations

import math
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

pytest.importorskip("triton")

from fa_bench.case import Case
from fa_bench.kernels import flash_fp8
from fa_bench.kernels.flash_config import FlashConfig
from fa_bench.kernels.flash_fp8 import (
    dequantize_fp8,
    flash_attention_fp8,
    fp8_v_layout,
    quantize_fp8,
)
from fa_bench.run.accuracy import check_fp8_accuracy

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
cpu_only = pytest.mark.skipif(not INTERPRETED, reason="needs TRITON_INTERPRET=1 (CPU runs)")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available() or INTERPRETED, reason="needs CUDA")
# Small tiles for the interpreter: several blocks per sequence and tails.
SMALL = FlashConfig(block_m=32, block_n=32)


def _inputs(b, hq, hkv, sq, sk, d, device, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    q = torch.randn(b, hq, sq, d, generator=g).to(device, torch.bfloat16)
    k = torch.randn(b, hkv, sk, d, generator=g).to(device, torch.bfloat16)
    v = torch.randn(b, hkv, sk, d, generator=g).to(device, torch.bfloat16)
    return [quantize_fp8(t) for t in (q, k, v)]


def _descales(quantised) -> dict:
    return dict(
        zip(("q_descale", "k_descale", "v_descale"), (d for _, d in quantised), strict=True)
    )


def _visible(sq: int, sk: int, causal: bool) -> torch.Tensor:
    """(sq, sk) bool: bottom-right causal, query i sees keys j <= i + sk - sq."""
    if not causal:
        return torch.ones(sq, sk, dtype=torch.bool)
    return torch.ones(sq, sk, dtype=torch.bool).tril(sk - sq)


def _lse(quantised, causal: bool, dtype: torch.dtype) -> torch.Tensor:
    """The natural-log lse of the dequantised inputs' scaled scores, the scores computed
    in `dtype` (float64: the reference; bf16: plain PyTorch in bf16, the baseline)."""
    (q8, qd), (k8, kd), _ = quantised
    q, k = dequantize_fp8(q8, qd, dtype), dequantize_fp8(k8, kd, dtype)
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    s = (q @ k.transpose(-1, -2)).double().cpu() / math.sqrt(q.shape[-1])
    s = s.masked_fill(~_visible(q.shape[2], k.shape[2], causal), float("-inf"))
    return torch.logsumexp(s, dim=-1)


def _check_lse(lse: torch.Tensor, quantised, causal: bool) -> None:
    """The accuracy rule for the lse: rows with no key -inf exactly, the others within
    twice the bf16 baseline's error of the float64 reference (+ an fp32 sum allowance)."""
    ref = _lse(quantised, causal, torch.float64)
    base = _lse(quantised, causal, torch.bfloat16)
    lse = lse.double().cpu()
    empty = torch.isinf(ref)
    assert torch.equal(torch.isinf(lse), empty)  # rows with no key: -inf, as the reference
    if empty.all():
        return
    err = (lse - ref)[~empty].abs().max().item()
    base_err = (base - ref)[~empty].abs().max().item()
    sums = 2 * torch.finfo(torch.float32).eps * math.sqrt(ref.shape[-1]) * ref[~empty].abs().max()
    assert err <= 2 * base_err + sums.item(), (err, base_err)


SHAPES_CPU = [
    # (batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, causal)
    (1, 2, 1, 45, 77, 64, True),  # GQA, Sq < Sk, tails
    (2, 2, 2, 70, 33, 40, True),  # rows with no key (Sq > Sk), head_dim padded to 64
    (1, 3, 3, 64, 64, 32, False),  # even tiles, the smallest head_dim
]


@cpu_only
@pytest.mark.parametrize("shape", SHAPES_CPU, ids=lambda s: "-".join(map(str, s)))
def test_interpreter_lse_against_float64(shape):
    b, hq, hkv, sq, sk, d, causal = shape
    quantised = _inputs(b, hq, hkv, sq, sk, d, "cpu")
    (q8, _), (k8, _), (v8, _) = quantised
    o, lse = flash_attention_fp8(
        q8, k8, v8, **_descales(quantised), causal=causal, config=SMALL, return_lse=True
    )
    assert o.dtype == torch.bfloat16 and o.shape == q8.shape
    _check_lse(lse, quantised, causal)
    empty = torch.isinf(lse)
    if empty.any():
        assert o[empty].abs().max() == 0


@cpu_only
@pytest.mark.parametrize("causal", [False, True])
def test_interpreter_uniform_p_gives_the_mean_of_visible_values(causal):
    # q = 0: every visible key scores 0, P = 2^8 exactly in e4m3, o = mean of visible v.
    b, hq, hkv, sq, sk, d = 1, 4, 2, 50, 83, 64
    quantised = _inputs(b, hq, hkv, sq, sk, d, "cpu", seed=1)
    (q8, _), (k8, _), (v8, vd) = quantised
    q0 = torch.zeros_like(q8)
    o = flash_attention_fp8(q0, k8, v8, **_descales(quantised), causal=causal, config=SMALL)
    seen = _visible(sq, sk, causal).double()
    v = dequantize_fp8(v8, vd, torch.float64).repeat_interleave(hq // hkv, dim=1)
    ref = (seen / seen.sum(1, keepdim=True)) @ v
    # bf16 output: half an ulp at the output's magnitude (|o| < 2: 2^-8) plus fp32 sums
    assert (o.double() - ref).abs().max() <= 2**-8 + 1e-5


@cpu_only
def test_interpreter_v_in_either_layout_gives_one_result():
    quantised = _inputs(1, 2, 2, 40, 40, 32, "cpu", seed=2)
    (q8, _), (k8, _), (v8, _) = quantised
    kw = dict(**_descales(quantised), causal=True, config=SMALL)
    kmajor = fp8_v_layout(v8)
    assert kmajor.stride(-2) == 1 and torch.equal(kmajor.float(), v8.float())
    assert torch.equal(
        flash_attention_fp8(q8, k8, v8, **kw), flash_attention_fp8(q8, k8, kmajor, **kw)
    )


def _bad_call(**change):
    """flash_attention_fp8 on small CPU inputs with one argument replaced."""
    quantised = _inputs(1, 4, 2, 8, 8, 32, "cpu")
    (q8, _), (k8, _), (v8, _) = quantised
    kw = dict(q=q8, k=k8, v=v8, **_descales(quantised), causal=False)
    kw.update(change)
    q, k, v = kw.pop("q"), kw.pop("k"), kw.pop("v")
    return flash_attention_fp8(q, k, v, **kw)


F8 = torch.float8_e4m3fn


@cpu_only  # CPU tensors: on a GPU machine (no interpreter) the device check comes first
@pytest.mark.parametrize(
    "change, error, message",
    [
        (dict(q=torch.zeros(1, 4, 8, 32, dtype=torch.bfloat16)), TypeError,
         r"q must be torch.float8_e4m3fn, got torch.bfloat16"),
        (dict(v="v"), TypeError, r"v must be a torch.Tensor, got str"),
        (dict(k_descale=0.5), TypeError, r"k_descale must be a torch.Tensor, got float"),
        (dict(q_descale=torch.ones(2)), ValueError,
         r"q_descale must be an fp32 tensor of one element .*got torch.float32 of shape \(2,\)"),
        (dict(v_descale=torch.ones(1, dtype=torch.float16)), ValueError,
         r"v_descale must be an fp32 tensor of one element .*got torch.float16"),
        (dict(q=torch.zeros(1, 4, 8, 16, dtype=F8), k=torch.zeros(1, 2, 8, 16, dtype=F8),
              v=torch.zeros(1, 2, 8, 16, dtype=F8)), ValueError,
         r"head_dim must be a multiple of 8 and <= 256 \(padded to >= 32\), got 16"),
        (dict(q=torch.zeros(1, 4, 8, 36, dtype=F8), k=torch.zeros(1, 2, 8, 36, dtype=F8),
              v=torch.zeros(1, 2, 8, 36, dtype=F8)), ValueError, r"got 36"),
        (dict(q=torch.zeros(1, 3, 8, 32, dtype=F8)), ValueError,
         r"heads_q \(3\) must be a multiple of heads_kv \(2\)"),
        (dict(v=torch.zeros(1, 2, 9, 32, dtype=F8)), ValueError, r"k and v must have one shape"),
        (dict(q=torch.zeros(4, 8, 32, dtype=F8)), ValueError, r"must be 4-D"),
        (dict(k=torch.zeros(1, 2, 8, 32, dtype=F8).requires_grad_()), ValueError,
         r"k requires grad: flash_attention_fp8 is forward only"),
        (dict(scale=-1.0), ValueError, r"scale must be a positive number, got -1.0"),
        (dict(config={"block_m": 32}), TypeError, r"config must be a FlashConfig, got dict"),
        (dict(config=FlashConfig(use_tma=True, warp_specialize=True)), ValueError,
         r"config.warp_specialize=True: the fp8 kernel has no warp-specialised path"),
    ],
)  # fmt: skip
def test_bad_arguments_name_the_argument_and_value(change, error, message):
    with pytest.raises(error, match=message):
        _bad_call(**change)


def test_a_cpu_tensor_needs_the_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="CPU tensors need the Triton interpreter"):
        _bad_call()


# ------------------------------------------------------------------------------------------
# GPU: the compiled kernel under the accuracy rule
# ------------------------------------------------------------------------------------------

SHAPES_GPU = [
    (2, 4, 4, 1024, 1024, 128, False),
    (2, 4, 4, 1024, 1024, 128, True),
    (1, 8, 2, 777, 1500, 128, True),  # GQA 4:1, Sq < Sk, odd lengths
    (1, 8, 2, 777, 1500, 128, False),
    (1, 4, 1, 1500, 777, 64, True),  # MQA, rows with no key (Sq > Sk)
    (2, 4, 4, 333, 333, 64, False),
    (1, 2, 2, 1, 1, 64, False),  # one token
    (1, 4, 4, 300, 517, 96, True),  # head_dim padded to 128
    (1, 16, 16, 16384, 16384, 128, True),  # long
]


def _case(shape) -> Case:
    b, hq, hkv, sq, sk, d, causal = shape
    return Case(impl="triton", mode="fwd", dtype="fp8_e4m3", batch=b, heads_q=hq, heads_kv=hkv,
                seqlen_q=sq, seqlen_k=sk, head_dim=d, causal=causal)  # fmt: skip


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("shape", SHAPES_GPU, ids=lambda s: "-".join(map(str, s)))
def test_gpu_fp8_forward_meets_the_accuracy_rule(shape):
    b, hq, hkv, sq, sk, d, causal = shape
    quantised = _inputs(b, hq, hkv, sq, sk, d, "cuda")
    (q8, _), (k8, _), (v8, _) = quantised
    o, lse = flash_attention_fp8(
        q8, k8, fp8_v_layout(v8), **_descales(quantised), causal=causal, return_lse=True
    )
    deq = [dequantize_fp8(x, s) for x, s in quantised]
    report = check_fp8_accuracy(_case(shape), *deq, o)
    assert report["passed"], report
    if sq * sk <= 1500 * 1500:
        _check_lse(lse, quantised, causal)


@pytest.mark.gpu
@needs_cuda
def test_gpu_fp8_v_in_the_ordinary_layout_is_copied_and_agrees():
    quantised = _inputs(1, 4, 4, 1000, 1000, 128, "cuda", seed=3)
    (q8, _), (k8, _), (v8, _) = quantised
    kw = dict(**_descales(quantised), causal=True)
    assert v8.stride(-1) == 1
    assert torch.equal(flash_attention_fp8(q8, k8, v8, **kw),
                       flash_attention_fp8(q8, k8, fp8_v_layout(v8), **kw))  # fmt: skip


@pytest.mark.gpu
@needs_cuda
def test_gpu_the_rule_fails_a_wrong_fp8_output():
    shape = (1, 4, 4, 1024, 1024, 128, True)
    quantised = _inputs(*shape[:6], "cuda", seed=4)
    (q8, _), (k8, _), (v8, _) = quantised
    o = flash_attention_fp8(q8, k8, v8, **_descales(quantised), causal=True)
    deq = [dequantize_fp8(x, s) for x, s in quantised]
    # an output 25% too large (a V descale applied wrongly) must fail
    assert not check_fp8_accuracy(_case(shape), *deq, o * 1.25)["passed"]


# Launches other than the default (128 × 64, 4 warps at head_dim 128): the bf16 tiles,
# and the descriptor (TMA) path; the interpreter always takes the pointer path.
# forward="tl": these are the `tl` kernel's launches (the dispatch would take the Gluon fp8
# kernel for these shapes on sm_90; tests/test_flash_gluon_fp8_gpu.py tests that one).
_TL = dict(block_m=128, num_stages=3, forward="tl")
LAUNCHES = {
    "128x128-w8": FlashConfig(block_n=128, num_warps=8, **_TL),
    "tma": FlashConfig(block_n=128, num_warps=8, use_tma=True, **_TL),
    "tma-64": FlashConfig(block_n=64, num_warps=4, use_tma=True, **_TL),
}


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("launch", sorted(LAUNCHES))
@pytest.mark.parametrize(
    "shape",
    [
        (2, 4, 4, 1024, 1024, 128, False),
        (2, 4, 4, 1024, 1024, 128, True),
        (1, 8, 2, 784, 1504, 128, True),
        (1, 4, 1, 1504, 784, 64, True),
        (1, 4, 4, 1008, 1008, 128, False),
    ],
    ids=lambda s: "-".join(map(str, s)),
)
def test_gpu_other_launches_and_the_descriptor_path(launch, shape):
    # lengths multiples of 16 (V's K-major rows are seqlen_k bytes: TMA needs 16-byte
    # strides); 1008 is not a multiple of the 64/128-key tiles (a masked tail)
    b, hq, hkv, sq, sk, d, causal = shape
    quantised = _inputs(b, hq, hkv, sq, sk, d, "cuda", seed=5)
    (q8, _), (k8, _), (v8, _) = quantised
    vt = fp8_v_layout(v8)
    assert flash_fp8._tma_ok(q8, k8, vt, torch.empty_like(q8, dtype=torch.bfloat16))
    o = flash_attention_fp8(
        q8, k8, vt, **_descales(quantised), causal=causal, config=LAUNCHES[launch]
    )
    deq = [dequantize_fp8(x, s) for x, s in quantised]
    report = check_fp8_accuracy(_case(shape), *deq, o)
    assert report["passed"], report


# Compiled for sm_90 on any machine (no GPU: the stages up to PTX run on the CPU), in a
# subprocess without TRITON_INTERPRET; pointers and strides divisible by 16 and V K-major
# (stride_vs == 1), as a launch from flash_attention_fp8 specialises them.
_COMPILE_SM90 = r"""
import re, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from fa_bench.kernels import flash_kernels_fp8 as m

fn = m._fwd_fp8_kernel
for hd, causal, tma, bn, warps in [(128, False, False, 64, 4), (128, True, False, 128, 8),
                                  (64, True, False, 64, 4), (128, True, True, 64, 4)]:
    consts = dict(HEAD_DIM=hd, HEAD_DIM_PAD=hd, BLOCK_M=128, BLOCK_N=bn, CAUSAL=causal,
                  EVEN_Q=False, USE_TMA=tma, stride_vs=1)
    sig = {}
    for name in fn.arg_names:
        if name in consts:
            sig[name] = "constexpr"
        elif name.startswith("stride_") or name in ("heads_q", "group", "seq_q", "seq_k"):
            sig[name] = "i32"
        elif name == "sm_scale_log2":
            sig[name] = "fp32"
        else:
            sig[name] = {"Q": "*fp8e4nv", "K": "*fp8e4nv", "V": "*fp8e4nv",
                         "Out": "*bf16"}.get(name, "*fp32")
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(fn.arg_names)
             if name not in consts and not name.endswith("DESCALE")
             and (sig[name][0] == "*" or name.startswith("stride_"))}
    kernel = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs),
                            target=GPUTarget("cuda", 90, 32),
                            options={"num_warps": warps, "num_stages": 3})
    ptx, ttgir = kernel.asm["ptx"], kernel.asm["ttgir"]
    print(hd, causal, tma,
          "fp8-wgmma=%d" % len(re.findall(r"wgmma\.mma_async\S*e4m3", ptx)),
          "async=%d" % ttgir.count("async_copy_global_to_local"),
          "tma=%d" % ptx.count("cp.async.bulk.tensor"),
          "spills=%d" % len(re.findall(r"\b(ld|st)\.local", ptx)))
"""


@pytest.mark.slow
def test_compiles_for_sm90_with_fp8_wgmma_pipelined_without_spills():
    # the default tiles at head_dim 128 and 64, the bf16 ones, and the descriptor path
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", _COMPILE_SM90], env=env, capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert len(lines) == 4, done.stdout
    for line in lines:
        assert "fp8-wgmma=0" not in line and line.endswith("spills=0"), line
    assert all("async=0 " not in line for line in lines[:3]), done.stdout  # pointer path
    assert "tma=0" not in lines[3], done.stdout  # the descriptor path: TMA loads


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("seqlen_k", [1, 8, 100])
def test_gpu_descriptor_config_falls_back_where_v_strides_do_not_allow_it(seqlen_k):
    # V K-major has rows of seqlen_k bytes: not a multiple of 16 here, so the pointer path
    shape = (1, 4, 2, 37, seqlen_k, 64, True)
    quantised = _inputs(*shape[:6], "cuda", seed=6)
    (q8, _), (k8, _), (v8, _) = quantised
    vt = fp8_v_layout(v8)
    assert not flash_fp8._tma_ok(q8, k8, vt, torch.empty_like(q8, dtype=torch.bfloat16))
    o = flash_attention_fp8(q8, k8, vt, **_descales(quantised), causal=True,
                            config=LAUNCHES["tma"])  # fmt: skip
    deq = [dequantize_fp8(x, s) for x, s in quantised]
    report = check_fp8_accuracy(_case(shape), *deq, o)
    assert report["passed"], report


def test_default_launch_is_the_bf16_heuristic_with_the_measured_head_dim_128_tiles(monkeypatch):
    from types import SimpleNamespace

    from fa_bench.kernels.flash_config import heuristic_config

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    cuda = torch.device("cuda")

    def default(d: int, n: int, causal: bool) -> FlashConfig:
        q = SimpleNamespace(shape=(1, 16, n, d), device=cuda)
        return flash_fp8.default_fp8_config(q, n, causal)

    d128 = default(128, 4096, False)
    assert (d128.block_m, d128.block_n, d128.num_warps, d128.num_stages) == (128, 64, 4, 3)
    assert not d128.use_tma
    for d, n, causal in [(64, 4096, False), (128, 1024, True), (256, 4096, False)]:
        assert default(d, n, causal) == heuristic_config(d, torch.bfloat16, causal, cuda, n)
