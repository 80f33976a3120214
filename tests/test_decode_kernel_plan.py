"""fa_bench.kernels.decode_plan: a decode call planned once and run many times. CPU: the
interpreter (the JIT path) against test_decode_kernel's float64 reference, the argument
order of a bound launch on a recording fake kernel, and the heuristic's choices on the
H200 shapes the tuning measured. GPU (`-m gpu`): the bound launches, bit for bit the JIT
launch's output, and runs that follow changed cache contents."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

pytest.importorskip("triton")

from test_decode_kernel import FP32_TOL, make_inputs, reference

from fa_bench.kernels import decode_attention
from fa_bench.kernels.decode_config import DecodeConfig, resolve
from fa_bench.kernels.decode_plan import _Bound, _values, plan_decode

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
cpu_only = pytest.mark.skipif(not INTERPRETED, reason="needs TRITON_INTERPRET=1 (CPU runs)")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available() or INTERPRETED, reason="needs CUDA")


@cpu_only
def test_plan_runs_match_the_reference_and_follow_new_lengths():
    q, k, v, seqlens, table = make_inputs([70, 33, 5], 2, 4, 2, 16, page_size=16, capacity=96)
    plan = plan_decode(q, k, v, cache_seqlens=seqlens, block_table=table, num_splits=3)
    assert plan.bound_reason == "not run yet"
    for _ in range(2):
        want_o, want_lse = reference(q, k, v, seqlens, table)
        o = plan.run()
        torch.testing.assert_close(o.double(), want_o, **FP32_TOL)
        torch.testing.assert_close(plan.lse().double(), want_lse, **FP32_TOL)
        seqlens[0] = 64  # the plan reads the lengths' contents at each run
    assert plan.run() is o  # one output tensor
    assert not plan.bound and "interpreter" in plan.bound_reason


@cpu_only
def test_plan_checks_its_arguments():
    q, k, v, seqlens, table = make_inputs([20], 1, 2, 1, 16, page_size=16)
    with pytest.raises(ValueError, match="num_splits must be None or an integer"):
        plan_decode(q, k, v, cache_seqlens=seqlens, block_table=table, num_splits=0)
    seqlens[0] = 99
    with pytest.raises(ValueError, match=r"cache_seqlens\[0\] is 99"):
        plan_decode(q, k, v, cache_seqlens=seqlens, block_table=table)


def test_values_put_every_parameter_in_order():
    class Fn:
        arg_names = ("A", "b", "C", "D")

    assert _values(Fn, (1, 2), {"C": 3, "D": 4, "num_warps": 8}) == [1, 2, 3, 4]
    assert _values(Fn, (1, 2), {"C": 3}) is None  # D missing


def test_bound_launch_passes_what_jit_run_passes(monkeypatch):
    calls = []

    class Kernel:
        function, packed_metadata = "fn", "meta"

        def run(self, *args):
            calls.append(args)

        def launch_metadata(self, grid, stream, *values):
            return ("md", grid, stream, values)

    import triton
    from triton.runtime.driver import driver

    monkeypatch.setattr(type(driver), "active", property(lambda self: _FakeDriver()), raising=False)
    hooks = triton.knobs.runtime
    bound = _Bound(Kernel(), (6, 3), [10, 20, "K"], device=0)
    bound()
    want = (6, 3, 1, "stream0", "fn", "meta", ("md", (6, 3, 1), "stream0", (10, 20, "K")))
    assert calls[-1][:7] == want
    assert calls[-1][7] is hooks.launch_enter_hook and calls[-1][8] is hooks.launch_exit_hook
    assert calls[-1][9:] == (10, 20, "K")


class _FakeDriver:
    @staticmethod
    def get_current_stream(device):
        return f"stream{device}"


# The heuristic on the shapes decode_tune measured on the H200 (2026-11-30 12:50 UTC,
# /tmp/work/s4/gpu/B/decode_tune.md), d128 bf16, 32/8 heads (16 rows), 132 SMs. The
# comment after each: the measured best, and this launch's fraction of it.
@pytest.mark.parametrize(
    ("batch", "ctx", "page", "want"),
    [
        (1, 32768, None, (64, 3, 32)),  # 64/3 x16 2731 GB/s; x33 0.99
        (1, 131072, None, (64, 3, 33)),  # 64/3 x33 interleaved 3887; runs 0.998
        # session 11's deeper pipeline: 64/3 x4 69.6 us against 64/2 x8's 70.3 (call 3)
        (8, 8192, None, (64, 3, 4)),  # 64/2 x6 interleaved 3380; 64/2 x8 0.994
        (64, 8192, None, (64, 2, 1)),  # 128/3 x1 4368; 64/2 x1 0.993
        (1, 32768, 64, (32, 5, 49)),  # 64/6 x16 2676; 32/5 x48 0.985
        (1, 131072, 16, (64, 5, 33)),  # 64/5 x33 is the best (3709)
        (8, 8192, 16, (64, 5, 4)),  # 32/6 x6 3266; session 11: 64/5 x4 73.5 us, 32/5 x8 73.8
        (64, 8192, 64, (32, 5, 1)),  # 64/3 x1 4319; 32/5 x1 0.995
        (256, 4096, 16, (64, 3, 1)),  # 128/4 x1 4426; 64/3 x1 0.987 (32/5: 0.932)
    ],
)
def test_heuristic_on_the_tuned_shapes(batch, ctx, page, want):
    launch = resolve(None, None, programs=batch * 8, capacity=ctx, page_size=page, sms=132)
    assert (launch.block_n, launch.num_stages, launch.num_splits) == want
    assert launch.num_warps == 4 and not launch.interleave


# ---------------------------------------------------------------------------------------
# GPU


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize(("page_size", "num_splits"), [(0, None), (16, None), (64, 1), (256, 7)])
def test_gpu_bound_plan_is_the_jit_launch(page_size, num_splits):
    lengths = [4097, 16, 1000, 8192, 1, 3333]
    q, k, v, seqlens, table = make_inputs(
        lengths, 1, 32, 8, 128, page_size=page_size, dtype=torch.bfloat16, device="cuda"
    )
    plan = plan_decode(q, k, v, cache_seqlens=seqlens, block_table=table, num_splits=num_splits)
    first = plan.run().clone()
    assert plan.bound, plan.bound_reason
    plain = decode_attention(q, k, v, cache_seqlens=seqlens, block_table=table,
                             num_splits=num_splits)  # fmt: skip
    assert torch.equal(first, plain)
    # new contents, same storage: a shorter first sequence and new queries
    seqlens[0] = 2000
    q.copy_(torch.randn_like(q))
    again = plan.run()
    want = decode_attention(q, k, v, cache_seqlens=seqlens, block_table=table,
                            num_splits=num_splits)  # fmt: skip
    assert torch.equal(again, want)


@pytest.mark.gpu
@needs_cuda
def test_gpu_plan_with_a_config():
    q, k, v, seqlens, table = make_inputs(
        [300, 5000], 4, 64, 8, 128, page_size=16, dtype=torch.float16, device="cuda"
    )
    cfg = DecodeConfig(block_n=64, num_warps=4, num_stages=5)
    plan = plan_decode(q, k, v, cache_seqlens=seqlens, block_table=table, config=cfg)
    o = plan.run()
    assert plan.bound and plan.launch.block_n == 64
    ref = reference(q, k, v, seqlens, table)[0]
    assert (o.double().cpu() - ref).abs().max().item() < 2e-2
