"""Our Triton FlashAttention against a float64 reference.

CPU tests run the kernels in the Triton interpreter (fp32, fp16: bf16 dots are wrong
there). GPU tests (`-m gpu`) run the compiled kernels, bf16 included, and hold them to the
project's accuracy rule: error <= 2 × plain PyTorch attention's error in the same dtype +
the dtype's rounding floor.

`triton.jit` reads TRITON_INTERPRET when a kernel is defined, so the flag is set here,
before the kernel module is first imported, on machines without CUDA. On a GPU machine
the same file runs the compiled kernels and the interpreter tests skip.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

pytest.importorskip("triton")

from fa_bench.kernels.flash_attention import flash_attention
from fa_bench.kernels.flash_config import FlashConfig, default_config
from fa_bench.run.accuracy import reference_attention

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
cpu_only = pytest.mark.skipif(not INTERPRETED, reason="needs TRITON_INTERPRET=1 (CPU runs)")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available() or INTERPRETED, reason="needs CUDA")

# One fixed small config: several blocks per sequence, tails, and a fast interpreter.
SMALL = FlashConfig(block_m=32, block_n=16, bwd_block_m=16, bwd_block_n=32)

CPU_DTYPES = [(torch.float32, 2e-5, 2e-5), (torch.float16, 4e-3, 4e-3)]


def reference(q, k, v, causal, scale=None, dtype=torch.float64, do=None):
    """The project's reference (fa_bench.run.accuracy.reference_attention) in `dtype`: in
    float64 the specification, in the inputs' dtype plain PyTorch attention. Returns
    (o, lse, dq, dk, dv); the grads are None without `do`."""
    q, k, v = (t.detach().to(dtype) for t in (q, k, v))
    do = None if do is None else do.to(dtype)
    return reference_attention(q, k, v, causal=causal, scale=scale, do=do)


def make(b, hq, hk, sq, sk, d, dtype, device="cpu", bshd=False, seed=0):
    """q, k, v leaf tensors; with bshd=True (B, S, H, D) storage seen as (B, H, S, D)."""
    g = torch.Generator(device="cpu").manual_seed(seed)

    def one(h, s):
        shape = (b, s, h, d) if bshd else (b, h, s, d)
        t = torch.randn(shape, generator=g).to(device=device, dtype=dtype)
        t = t.transpose(1, 2) if bshd else t
        return t.requires_grad_()

    return one(hq, sq), one(hk, sk), one(hk, sk)


def output_grad(o):
    """The one dO every comparison uses."""
    return torch.randn(o.shape, generator=torch.Generator().manual_seed(1)).to(o)


def run_both(q, k, v, causal, config=SMALL, ref_dtype=torch.float64):
    """(ours: o, dq, dk, dv), (reference in ref_dtype: o, dq, dk, dv) for one dO."""
    o = flash_attention(q, k, v, causal=causal, config=config)
    do = output_grad(o)
    dq, dk, dv = torch.autograd.grad(o, (q, k, v), do)
    ref = reference(q, k, v, causal, dtype=ref_dtype, do=do)
    return (o, dq, dk, dv), (ref.o, ref.dq, ref.dk, ref.dv)


def assert_close(ours, ref, atol, rtol):
    for name, a, r in zip(("o", "dq", "dk", "dv"), ours, ref, strict=True):
        torch.testing.assert_close(a.double(), r.double(), atol=atol, rtol=rtol, msg=name)


# ---------------------------------------------------------------------------------------
# CPU: the interpreter


SHAPES = [
    # (b, hq, hk, sq, sk, d)
    (1, 1, 1, 1, 1, 64),
    (1, 2, 2, 17, 17, 40),
    (1, 2, 1, 123, 123, 96),
    (1, 1, 1, 300, 300, 64),
    (1, 2, 2, 17, 123, 128),
    (2, 1, 1, 123, 17, 64),
    (1, 4, 1, 33, 70, 64),  # GQA 4:1
]


@cpu_only
@pytest.mark.parametrize(("dtype", "atol", "rtol"), CPU_DTYPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_matches_float64(shape, causal, dtype, atol, rtol):
    if dtype == torch.float16 and shape[3] * shape[4] > 123 * 123:
        pytest.skip("one fp16 run of the big shapes is enough (kept fast)")
    q, k, v = make(*shape, dtype)
    ours, ref = run_both(q, k, v, causal)
    assert_close(ours, ref, atol, rtol)


@cpu_only
@pytest.mark.parametrize(("dtype", "atol", "rtol"), CPU_DTYPES)
@pytest.mark.parametrize(("hq", "hk"), [(4, 1), (3, 3), (6, 2)])
def test_gqa_mqa_noncontiguous(hq, hk, dtype, atol, rtol):
    q, k, v = make(2, hq, hk, 45, 29, 40, dtype, bshd=True)
    assert not q.is_contiguous() and q.stride(-1) == 1
    ours, ref = run_both(q, k, v, causal=True)
    assert_close(ours, ref, atol, rtol)
    assert ours[0].stride() == q.stride()  # the output keeps the input's layout


@cpu_only
def test_rows_without_keys_are_zero_with_zero_grads():
    q, k, v = make(1, 2, 1, 50, 20, 32, torch.float32)
    o, lse = flash_attention(q, k, v, causal=True, return_lse=True, config=SMALL)
    (o * torch.randn_like(o)).sum().backward()
    empty = 50 - 20  # query i sees keys j <= i - 30
    assert torch.all(o[:, :, :empty] == 0)
    assert torch.all(lse[:, :, :empty] == float("-inf"))
    assert torch.all(q.grad[:, :, :empty] == 0)
    for t in (o, lse[:, :, empty:], q.grad, k.grad, v.grad):
        assert torch.isfinite(t).all()


@cpu_only
@pytest.mark.parametrize("causal", [False, True])
def test_lse_natural_log(causal):
    q, k, v = make(1, 2, 2, 37, 53, 64, torch.float32)
    _, lse = flash_attention(q, k, v, causal=causal, return_lse=True, config=SMALL)
    assert lse.dtype == torch.float32 and lse.shape == (1, 2, 37)
    want = reference(q, k, v, causal).lse  # natural log, scale 1/sqrt(64)
    torch.testing.assert_close(lse.double(), want, atol=1e-5, rtol=1e-5)


@cpu_only
def test_scale_and_default_config():
    q, k, v = make(1, 2, 2, 20, 20, 16, torch.float32)
    o = flash_attention(q, k, v, scale=0.3)  # the default (interpreter) config
    want = reference(q, k, v, False, scale=0.3).o
    torch.testing.assert_close(o.double(), want, atol=2e-5, rtol=0)


@cpu_only
def test_backward_is_deterministic():
    q, k, v = make(1, 4, 2, 70, 90, 40, torch.float32)
    first = torch.autograd.grad(
        flash_attention(q, k, v, causal=True, config=SMALL, deterministic=True).sum(), (q, k, v)
    )
    again = torch.autograd.grad(
        flash_attention(q, k, v, causal=True, config=SMALL, deterministic=True).sum(), (q, k, v)
    )
    for a, b in zip(first, again, strict=True):
        assert torch.equal(a, b)


@cpu_only
@pytest.mark.parametrize(
    ("shapes", "error", "match"),
    [
        (((1, 2, 8, 64), (1, 2, 8, 32), (1, 2, 8, 32)), ValueError, r"q \(1, 2, 8, 64\)"),
        (((1, 2, 8, 64), (1, 2, 8, 64), (1, 2, 9, 64)), ValueError, "same shape"),
        (((1, 3, 8, 64), (1, 2, 8, 64), (1, 2, 8, 64)), ValueError, "multiple of heads_kv"),
        (((1, 2, 8, 264), (1, 2, 8, 264), (1, 2, 8, 264)), ValueError, "head_dim"),
        (((1, 2, 8, 36), (1, 2, 8, 36), (1, 2, 8, 36)), ValueError, "multiple of 8"),
        (((2, 8, 64), (2, 8, 64), (2, 8, 64)), ValueError, "4-D"),
        (((2, 2, 8, 64), (1, 2, 8, 64), (1, 2, 8, 64)), ValueError, r"k \(1, 2, 8, 64\)"),
    ],
)
def test_bad_shapes(shapes, error, match):
    q, k, v = (torch.zeros(s) for s in shapes)
    with pytest.raises(error, match=match):
        flash_attention(q, k, v)


@cpu_only
def test_bad_dtype_and_cpu_without_interpreter(monkeypatch):
    x = torch.zeros(1, 1, 4, 16, dtype=torch.float64)
    with pytest.raises(TypeError, match="dtype"):
        flash_attention(x, x, x)
    y = torch.zeros(1, 1, 4, 16)
    with pytest.raises(TypeError, match="share a dtype"):
        flash_attention(y, y.half(), y)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="interpreter"):
        flash_attention(y, y, y)


def test_tma_allocator_is_set_in_each_thread():
    """triton keeps its allocator in a ContextVar, so it holds per thread/context, and
    autograd runs the backward on its own thread: setting it once (a module-global flag,
    the bug behind issue 18's failed TMA tests) left that thread without one. Checked on
    triton's ContextVar itself; nothing is launched, so no GPU is needed."""
    import contextvars
    import importlib
    import threading

    from triton.runtime import _allocation

    # the module, not the package's re-exported function of the same name
    fa = importlib.import_module("fa_bench.kernels.flash_attention")

    def ours() -> bool:  # an allocator set in this context (not triton's null one)
        return not isinstance(_allocation._allocator.get(), _allocation.NullAllocator)

    def main_then_fresh_thread() -> dict[str, bool]:
        seen: dict[str, bool] = {}
        fa._ensure_tma_allocator()
        seen["main"] = ours()

        def worker() -> None:  # a new thread starts with an empty context, as autograd's
            seen["thread before"] = ours()
            fa._ensure_tma_allocator()
            seen["thread after"] = ours()

        t = threading.Thread(target=worker)
        t.start()
        t.join()
        return seen

    # in a copied context, so this test's allocator does not leak into the others
    seen = contextvars.copy_context().run(main_then_fresh_thread)
    assert seen == {"main": True, "thread before": False, "thread after": True}


def test_config_validation():
    with pytest.raises(ValueError, match="block_m"):
        FlashConfig(block_m=48)
    with pytest.raises(ValueError, match="num_warps"):
        FlashConfig(num_warps=3)
    with pytest.raises(ValueError, match="num_stages"):
        FlashConfig(num_stages=0)
    with pytest.raises(ValueError, match="warp_specialize"):
        FlashConfig(warp_specialize=True, use_tma=False)
    h200 = default_config(128, torch.bfloat16, True, (9, 0))
    assert (h200.block_m, h200.block_n, h200.use_tma) == (128, 128, False)
    assert not default_config(128, torch.float32, False, (9, 0)).use_tma
    assert not default_config(64, torch.float16, False, (8, 0)).use_tma


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_short_causal_forward_takes_64x64_tiles(head_dim: int, dtype: torch.dtype) -> None:
    """The H200 sweeps: 64x64 tiles won the causal forward at 512 and 1k tokens only."""

    def tiles(causal: bool, seqlen: int | None) -> tuple:
        c = default_config(head_dim, dtype, causal, (9, 0), seqlen)
        return (c.block_m, c.block_n, c.num_warps, c.num_stages)

    long = tiles(True, None)
    assert long != (64, 64, 4, 3)
    assert tiles(True, 512) == tiles(True, 1024) == (64, 64, 4, 3)
    assert tiles(True, 1025) == tiles(True, 16384) == long
    assert tiles(False, 512) == tiles(False, None) == long
    # The backward fields do not depend on the sequence length.
    bwd = default_config(head_dim, dtype, True, (9, 0), 512)
    assert bwd.bwd_block_n == default_config(head_dim, dtype, True, (9, 0)).bwd_block_n
    # Unmeasured: fp32 and head_dim 256 keep their tiles.
    assert default_config(head_dim, torch.float32, True, (9, 0), 512) == default_config(
        head_dim, torch.float32, True, (9, 0)
    )
    assert default_config(256, dtype, True, (9, 0), 512).num_stages == 2


# ---------------------------------------------------------------------------------------
# GPU: compiled kernels, bf16 included, the 2x-PyTorch-error rule


# Rounding floor per dtype, relative to the reference's magnitude (at least 1). fp32 gets
# 16 ulp, not 1: the backward recomputes P with exp2 from a differently ordered dot and
# subtracts delta = rowsum(dO·O) instead of rowsum(P·dP); in fp32 that costs ~1e-6 absolute,
# 2-6x plain fp32 PyTorch's error on some shapes (measured on the H200, docs/kernel.md).
_FLOOR = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11, torch.float32: 2.0**-20}


def assert_within_pytorch_error(q, k, v, causal, config=None):
    """Our error vs float64 <= 2 × PyTorch-in-dtype's error + the dtype's rounding floor."""
    ours, exact = run_both(q, k, v, causal, config=config)
    plain = reference(q, k, v, causal, dtype=q.dtype, do=output_grad(ours[0]))
    theirs = (plain.o, plain.dq, plain.dk, plain.dv)
    for name, a, t, r in zip(("o", "dq", "dk", "dv"), ours, theirs, exact, strict=True):
        ours_err = (a.double() - r).abs().max().item()
        torch_err = (t.double() - r).abs().max().item()
        # relative to the reference's scale, at least 1: an exactly-zero gradient
        # (seqlen_k = 1 gives dq = 0) still allows fp32 accumulation noise
        floor = _FLOOR[q.dtype] * max(r.abs().max().item(), 1.0)
        assert ours_err <= 2 * torch_err + floor, (name, ours_err, torch_err, floor)


GPU_SHAPES = [
    (2, 4, 4, 1, 1, 64),
    (2, 4, 2, 17, 17, 40),
    (1, 8, 2, 123, 300, 96),
    (1, 4, 1, 300, 123, 128),
    (2, 4, 4, 1000, 1000, 64),
    (1, 4, 4, 517, 517, 256),
    (1, 16, 16, 2048, 2048, 128),
]


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_gpu_accuracy(dtype, shape, causal):
    q, k, v = make(*shape, dtype, device="cuda", bshd=shape[3] % 2 == 1)
    assert_within_pytorch_error(q, k, v, causal)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize(("d", "causal"), [(128, False), (128, True), (256, True)])
def test_gpu_long_sequence(d, causal):
    q, k, v = make(1, 2, 1, 16384, 16384, d, torch.bfloat16, device="cuda")
    assert_within_pytorch_error(q, k, v, causal)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("use_tma", [False, True])
def test_gpu_pointer_and_descriptor_paths(use_tma):
    base = default_config(128, torch.bfloat16, True, torch.cuda.get_device_capability())
    cfg = FlashConfig(**{**base.__dict__, "use_tma": use_tma, "warp_specialize": False})
    q, k, v = make(2, 4, 2, 333, 1000, 128, torch.bfloat16, device="cuda", bshd=True)
    assert_within_pytorch_error(q, k, v, True, config=cfg)


@pytest.mark.gpu
@needs_cuda
def test_gpu_deterministic():
    q, k, v = make(2, 8, 2, 1500, 1500, 128, torch.bfloat16, device="cuda")
    do = torch.randn(2, 8, 1500, 128, device="cuda", dtype=torch.bfloat16)
    runs = [
        torch.autograd.grad(
            flash_attention(q, k, v, causal=True, deterministic=True), (q, k, v), do
        )
        for _ in "ab"
    ]
    for a, b in zip(*runs, strict=True):
        assert torch.equal(a, b)


@cpu_only
def test_registered_impl_check_and_builder():
    import fa_bench.kernels.triton_impl  # noqa: F401  (registers "triton")
    from fa_bench.case import Case
    from fa_bench.registry import get

    impl = get("triton")
    cpu = torch.device("cpu")
    case = Case("triton", "fwd_bwd", "fp32", 1, 4, 2, 33, 50, 40, True)
    assert impl.unsupported_reason(case, cpu) is None
    assert "bf16" in impl.unsupported_reason(Case(**{**case.to_dict(), "dtype": "bf16"}), cpu)
    assert "head_dim" in impl.unsupported_reason(Case(**{**case.to_dict(), "head_dim": 36}), cpu)
    q, k, v = make(1, 4, 2, 33, 50, 40, torch.float32)
    o = impl.prepare(case, q, k, v).fn(q, k, v)
    torch.testing.assert_close(o.double(), reference(q, k, v, True).o, atol=2e-5, rtol=2e-5)
