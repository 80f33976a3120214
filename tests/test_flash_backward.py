"""The two backwards of our Triton FlashAttention against a float64 reference: the `tl`
one-pass backward (`deterministic=False`, kernels/flash_kernels_bwd1.py: dQ summed by fp32
atomics) and the two-kernel one (`deterministic=True`, kernels/flash_kernels_bwd.py); the
default's choice between the Gluon one-pass backward and the two-kernel one.

CPU tests run the kernels in the Triton interpreter, fp32 only (bf16 dots are wrong there),
on tiny shapes: a few in the fast tier, the full grid (GQA 4:1 and 4:2, Sq ≠ Sk both ways,
lengths that are not multiples of the tiles, length 1, head_dim 16/40/64, several tile
configs) under `slow`. GPU tests (`-m gpu`) run both backwards at bf16/fp16/fp32 under the
project's accuracy rule (test_flash_attention.py: error <= 2 × plain PyTorch's error in the
same dtype + the dtype's rounding floor), plus the TMA reduce-add path of the one-pass dQ.

`triton.jit` reads TRITON_INTERPRET when a kernel is defined, so the flag is set here,
before the kernel module is first imported, on machines without CUDA.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

pytest.importorskip("triton")

from test_flash_attention import _FLOOR, make, output_grad, reference

from fa_bench.kernels.flash_attention import flash_attention
from fa_bench.kernels.flash_config import FlashConfig, default_config

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
cpu_only = pytest.mark.skipif(not INTERPRETED, reason="needs TRITON_INTERPRET=1 (CPU runs)")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available() or INTERPRETED, reason="needs CUDA")

# Backward tiles (held keys × streamed query rows) small enough for several blocks per
# sequence on tiny shapes; the forward's tiles do not matter here.
CONFIGS = {
    "k32q16": FlashConfig(block_m=32, block_n=16, bwd_block_m=16, bwd_block_n=32),
    "k16q32": FlashConfig(block_m=32, block_n=16, bwd_block_m=32, bwd_block_n=16),
    "k64q64": FlashConfig(block_m=64, block_n=64, bwd_block_m=64, bwd_block_n=64),
}
FP32_TOL = 2e-5  # the CPU tests' fp32 tolerance (test_flash_attention.CPU_DTYPES)


def grads(q, k, v, causal, config=None, deterministic=False):
    """(dO, (dq, dk, dv)) for the one dO every comparison uses. `deterministic=False` here
    (not the library's default) because most of this file tests the one-pass backward."""
    o = flash_attention(q, k, v, causal=causal, config=config, deterministic=deterministic)
    do = output_grad(o)
    return do, torch.autograd.grad(o, (q, k, v), do)


def check_cpu(shape, causal, config, deterministic=False):
    """One fp32 shape in the interpreter: dq, dk, dv against float64."""
    q, k, v = make(*shape, torch.float32)
    do, ours = grads(q, k, v, causal, config, deterministic)
    ref = reference(q, k, v, causal, do=do)
    for name, a, r in zip(("dq", "dk", "dv"), ours, (ref.dq, ref.dk, ref.dv), strict=True):
        torch.testing.assert_close(a.double(), r, atol=FP32_TOL, rtol=FP32_TOL, msg=name)
    return ours


# ---------------------------------------------------------------------------------------
# CPU: the interpreter

# (b, hq, hk, sq, sk, d): the fast tier's shapes, one per property
FAST_SHAPES = [
    (1, 4, 1, 33, 70, 40),  # GQA 4:1, Sq < Sk, padded head_dim, ragged tails
    (1, 4, 2, 70, 33, 64),  # GQA 4:2, Sq > Sk (causal: rows without keys)
    (2, 2, 1, 1, 1, 16),  # length 1
]


@cpu_only
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", FAST_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_one_pass_matches_float64(shape, causal):
    check_cpu(shape, causal, CONFIGS["k32q16"])


@cpu_only
def test_one_pass_matches_deterministic():
    """deterministic=False's gradients and the default's (True): both within the rule of
    float64, and within it of each other; dK/dV come from the same loop order, so equal."""
    shape, causal, config = (1, 4, 2, 45, 61, 40), True, CONFIGS["k32q16"]
    one_pass = check_cpu(shape, causal, config)
    two_kernel = check_cpu(shape, causal, config, deterministic=True)
    for name, a, b in zip(("dq", "dk", "dv"), one_pass, two_kernel, strict=True):
        torch.testing.assert_close(a, b, atol=FP32_TOL, rtol=FP32_TOL, msg=name)
    assert torch.equal(one_pass[1], two_kernel[1]) and torch.equal(one_pass[2], two_kernel[2])


# The slow tier: every property against every tile config.
SLOW_SHAPES = [
    (1, 4, 1, 17, 123, 64),  # GQA 4:1, Sq < Sk
    (1, 4, 2, 123, 17, 40),  # GQA 4:2, Sq > Sk
    (2, 1, 1, 100, 100, 16),  # tails of every tile config
    (1, 2, 2, 64, 64, 64),  # even: no masks at all
    (1, 2, 1, 1, 45, 40),  # one query row
    (1, 2, 1, 45, 1, 16),  # one key
]


@cpu_only
@pytest.mark.slow
@pytest.mark.parametrize("config", sorted(CONFIGS))
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", SLOW_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_one_pass_grid(shape, causal, config):
    check_cpu(shape, causal, CONFIGS[config])


@cpu_only
@pytest.mark.slow
@pytest.mark.parametrize("causal", [False, True])
def test_one_pass_bshd_layout_and_heuristic_config(causal):
    """(B, S, H, D) storage seen as (B, H, S, D), and the interpreter's default config."""
    q, k, v = make(2, 4, 2, 45, 29, 40, torch.float32, bshd=True)
    do, ours = grads(q, k, v, causal)
    ref = reference(q, k, v, causal, do=do)
    for a, r in zip(ours, (ref.dq, ref.dk, ref.dv), strict=True):
        torch.testing.assert_close(a.double(), r, atol=FP32_TOL, rtol=FP32_TOL)
    assert ours[0].stride() == q.stride()  # dq keeps q's layout


def test_the_default_backward_is_the_gluon_one_where_it_runs(monkeypatch):
    """`deterministic=None` (the default) runs the Gluon one-pass backward where
    backward_choice finds a launch (sm_90, fp16/bf16, head_dim 64/128: faked here), else
    the two-kernel backward (on a CPU: bitwise the same gradients as deterministic=True);
    a variant is asked too, with its Variant (windows, ALiBi and softcap run in the Gluon
    backward since session 17)."""
    import inspect

    from fa_bench.kernels import flash_gluon_bwd

    assert inspect.signature(flash_attention).parameters["deterministic"].default is None
    q, k, v = make(1, 4, 2, 33, 50, 16, torch.float32)
    _, default = grads(q, k, v, True, deterministic=None)
    _, two_kernel = grads(q, k, v, True, deterministic=True)
    assert all(torch.equal(a, b) for a, b in zip(default, two_kernel, strict=True))
    asked, ran = [], []
    monkeypatch.setattr(flash_gluon_bwd, "backward_choice",
                        lambda *a, default=False, variant=None:
                        asked.append((default, variant)) or "launch")  # fmt: skip

    def fake_backward(*a, **kw):
        ran.append((a[8], kw.get("variant")))
        return a[1] * 0, a[2] * 0, a[3] * 0

    monkeypatch.setattr(flash_gluon_bwd, "gluon_backward", fake_backward)
    _, faked = grads(q, k, v, True, deterministic=None)
    assert (asked, ran) == ([(True, None)], [("launch", None)])
    assert not any(g.any() for g in faked)
    o = flash_attention(q, k, v, causal=True, softcap=5.0)  # a variant: asked with it
    torch.autograd.grad(o, (q, k, v), output_grad(o))
    assert len(asked) == 2 and asked[1][1].softcap == 5.0 and ran[1] == ("launch", asked[1][1])


@cpu_only
def test_triton_onepass_is_registered():
    import fa_bench.kernels.triton_impl  # noqa: F401  (registers both names)
    from fa_bench.case import Case
    from fa_bench.registry import get

    impl = get("triton-onepass")
    assert "deterministic=False" in impl.description and "one-pass" in impl.description
    assert "Gluon one-pass" in get("triton").description
    assert "two-kernel backward always" in get("triton-deterministic").description
    cpu = torch.device("cpu")
    case = Case("triton-onepass", "fwd_bwd", "fp32", 1, 4, 2, 33, 50, 40, True)
    assert impl.unsupported_reason(case, cpu) is None
    assert "bf16" in impl.unsupported_reason(Case(**{**case.to_dict(), "dtype": "bf16"}), cpu)
    q, k, v = make(1, 4, 2, 33, 50, 40, torch.float32)
    prepared = impl.prepare(case, q, k, v)
    assert prepared.backend.startswith("triton-onepass:")
    assert get("triton").prepare(case, q, k, v).backend.startswith("triton:")
    torch.testing.assert_close(
        prepared.fn(q, k, v).double(), reference(q, k, v, True).o, atol=2e-5, rtol=2e-5
    )


# ---------------------------------------------------------------------------------------
# GPU: compiled kernels, both backwards, the 2x-PyTorch-error rule


def assert_backward_within_pytorch_error(q, k, v, causal, deterministic, config=None):
    """Our dq, dk, dv vs float64 <= 2 × PyTorch-in-dtype's error + the dtype's floor;
    returns our gradients."""
    do, ours = grads(q, k, v, causal, config, deterministic)
    exact = reference(q, k, v, causal, do=do)
    plain = reference(q, k, v, causal, dtype=q.dtype, do=do)
    for name, a, t, r in zip(
        ("dq", "dk", "dv"), ours, (plain.dq, plain.dk, plain.dv), (exact.dq, exact.dk, exact.dv),
        strict=True,
    ):  # fmt: skip
        ours_err = (a.double() - r).abs().max().item()
        torch_err = (t.double() - r).abs().max().item()
        floor = _FLOOR[q.dtype] * max(r.abs().max().item(), 1.0)
        assert ours_err <= 2 * torch_err + floor, (name, deterministic, ours_err, torch_err)
    return ours


GPU_SHAPES = [
    (2, 4, 1, 17, 300, 40),  # GQA 4:1, Sq < Sk, tails, padded head_dim
    (1, 8, 2, 333, 123, 128),  # GQA 4:1 over 2 kv heads, Sq > Sk
    (2, 4, 4, 1, 1, 64),  # length 1
    (1, 4, 2, 517, 517, 256),  # head_dim 256, tails
    (1, 16, 16, 2048, 2048, 128),  # the heuristic's Hopper tiles, even
]


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("deterministic", [False, True], ids=["one-pass", "deterministic"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_gpu_backward_accuracy(dtype, shape, causal, deterministic):
    q, k, v = make(*shape, dtype, device="cuda", bshd=shape[3] % 2 == 1)
    assert_backward_within_pytorch_error(q, k, v, causal, deterministic)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_one_pass_matches_deterministic(dtype, causal):
    """Both within the rule of float64, and their difference within the rule's allowance."""
    q, k, v = make(2, 8, 2, 1500, 1500, 128, dtype, device="cuda")
    one_pass = assert_backward_within_pytorch_error(q, k, v, causal, False)
    two_kernel = assert_backward_within_pytorch_error(q, k, v, causal, True)
    do = output_grad(flash_attention(q, k, v, causal=causal))
    exact = reference(q, k, v, causal, do=do)
    plain = reference(q, k, v, causal, dtype=dtype, do=do)
    for name, a, b, t, r in zip(
        ("dq", "dk", "dv"), one_pass, two_kernel, (plain.dq, plain.dk, plain.dv),
        (exact.dq, exact.dk, exact.dv), strict=True,
    ):  # fmt: skip
        torch_err = (t.double() - r).abs().max().item()
        floor = _FLOOR[dtype] * max(r.abs().max().item(), 1.0)
        diff = (a.double() - b.double()).abs().max().item()
        assert diff <= 2 * torch_err + floor, (name, diff, torch_err)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("d", "sq", "sk"), [(128, 333, 1000), (64, 1000, 777), (256, 300, 300)])
def test_gpu_one_pass_tma_reduce_add(d, sq, sk, causal):
    """dQ through the descriptor's reduce-add (use_tma=True) instead of pointer atomics."""
    base = default_config(d, torch.bfloat16, causal, torch.cuda.get_device_capability())
    cfg = FlashConfig(**{**base.__dict__, "use_tma": True, "warp_specialize": False})
    q, k, v = make(2, 4, 2, sq, sk, d, torch.bfloat16, device="cuda", bshd=True)
    assert_backward_within_pytorch_error(q, k, v, causal, False, config=cfg)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_long_one_pass(causal):
    q, k, v = make(1, 2, 1, 16384, 16384, 128, torch.bfloat16, device="cuda")
    assert_backward_within_pytorch_error(q, k, v, causal, False)
