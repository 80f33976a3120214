"""The decode combine by programmatic dependent launch (issue 20, session 6):
DecodeConfig(pdl=True) launches the combine kernel with triton's launch_pdl, the split
kernel letting it start (griddepcontrol.launch_dependents) and the combine waiting on the
split grid (griddepcontrol.wait) before it reads the partials.

CPU: the option is checked and resolved; which kernels get PDL and the launch option
(only the two-kernel launch with splits, only where the device can: never in the
interpreter, whose results with pdl=True are the plain launch's); the kernels compiled
for sm_90 carry the two instructions only with PDL (slow). GPU (`-m gpu`): the PDL launch
bit for bit the two-kernel launch (the same arithmetic; only when the combine starts
differs), over contiguous and paged caches, Sq 1 and 4, several split counts; a planned
PDL launch re-launched 200 times bit for bit.
"""

from __future__ import annotations

import importlib
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

pytest.importorskip("triton")

from test_decode_kernel import FP32_TOL, make_inputs, reference

from fa_bench.kernels import decode_attention
from fa_bench.kernels.decode_attention import _launch_calls, plan_launch
from fa_bench.kernels.decode_config import DecodeConfig, check_config, resolve
from fa_bench.kernels.decode_plan import plan_decode

# the module (fa_bench.kernels exports the function under the same name)
da_module = importlib.import_module("fa_bench.kernels.decode_attention")
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
cpu_only = pytest.mark.skipif(not INTERPRETED, reason="needs TRITON_INTERPRET=1 (CPU runs)")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available() or INTERPRETED, reason="needs CUDA")

# the combine kernel named: the default merges a few splits in the split kernel (fused)
PDL = DecodeConfig(pdl=True, fused_combine=False)
PLAIN = DecodeConfig(pdl=False, fused_combine=False)
KERNEL = DecodeConfig(fused_combine=False)  # pdl left to the default

# ---------------------------------------------------------------------------------------
# CPU: the option and the launches it makes


def test_the_option_is_checked_and_resolved() -> None:
    with pytest.raises(ValueError, match=r"config.pdl must be a bool or None, got 1"):
        check_config(DecodeConfig(pdl=1), None)  # type: ignore[arg-type]
    kw = dict(programs=64, capacity=8192, page_size=None, sms=132)
    assert resolve(PDL, None, **kw).pdl is True
    assert resolve(PLAIN, None, **kw).pdl is False
    # on by default: the H200 measured it 0.6-1.0 us faster (session 6, call B)
    assert resolve(None, None, **kw).pdl is True


def _kwargs(monkeypatch, can: bool, config, num_splits, sq=1):
    monkeypatch.setattr(da_module, "_pdl_ok", lambda device: can)
    q, k, v, seqlens, table = make_inputs([40, 9], sq, 4, 2, 16, page_size=16)
    launch = plan_launch(q, k, table, num_splits, config)
    _, _, calls = _launch_calls(q, k, v, seqlens, table, 0.25, launch)
    return [c[3] for c in calls]


@pytest.mark.parametrize("config", [PDL, KERNEL])
def test_pdl_marks_both_kernels_and_the_combine_launch(monkeypatch, config) -> None:
    split, combine = _kwargs(monkeypatch, True, config, 3)
    assert split["PDL"] is True and "launch_pdl" not in split
    assert combine["PDL"] is True and combine["launch_pdl"] is True


@pytest.mark.parametrize(
    "can, config, splits",
    [(False, PDL, 3), (False, KERNEL, 3), (True, PLAIN, 3)],
)
def test_no_pdl_without_the_option_or_the_device(monkeypatch, can, config, splits) -> None:
    split, combine = _kwargs(monkeypatch, can, config, splits)
    assert split["PDL"] is False and combine["PDL"] is False and "launch_pdl" not in combine


def test_no_pdl_with_one_split_or_the_fused_combine(monkeypatch) -> None:
    (one,) = _kwargs(monkeypatch, True, PDL, 1)
    assert one["PDL"] is False
    (fused,) = _kwargs(monkeypatch, True, DecodeConfig(pdl=True, fused_combine=True), 3)
    assert fused["PDL"] is False and fused["FUSED"] is True


@pytest.mark.parametrize("can", [True, False])
def test_a_plan_says_whether_its_combine_goes_by_pdl(monkeypatch, can) -> None:
    monkeypatch.setattr(da_module, "_pdl_ok", lambda device: can)
    q, k, v, seqlens, _ = make_inputs([40, 9], 1, 4, 2, 16)
    plan = plan_decode(q, k, v, cache_seqlens=seqlens, num_splits=3, config=KERNEL)  # planned
    assert plan.pdl is can
    one = plan_decode(q, k, v, cache_seqlens=seqlens, num_splits=1)
    assert one.pdl is False


def test_the_interpreter_never_takes_pdl() -> None:
    # the real _pdl_ok: a CPU tensor (and the interpreter) cannot
    q = torch.zeros(1)
    assert da_module._pdl_ok(q.device) is False


@cpu_only
@pytest.mark.slow  # the interpreter: ~3 s
@pytest.mark.parametrize("page_size, sq, hq, hkv, splits", [
    (0, 1, 8, 2, 3), (16, 4, 8, 8, 5), (48, 2, 8, 1, 64),
])  # fmt: skip
def test_interpreter_results_with_pdl_requested(page_size, sq, hq, hkv, splits) -> None:
    # ragged lengths with the shortest (Sq) and a page boundary, a shuffled table, more
    # splits than blocks
    q, k, v, seqlens, table = make_inputs([sq, 96, 57], sq, hq, hkv, 16, page_size=page_size)
    o, lse = decode_attention(q, k, v, cache_seqlens=seqlens, block_table=table,
                              num_splits=splits, return_lse=True, config=PDL)  # fmt: skip
    want_o, want_lse = reference(q, k, v, seqlens, table)
    torch.testing.assert_close(o.double(), want_o, **FP32_TOL)
    torch.testing.assert_close(lse.double(), want_lse, **FP32_TOL)


_COMPILE_SM90 = r"""
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from fa_bench.kernels import decode_kernels as dk
from decode_sm90 import signature

def compile_sm90(fn, consts, pdl):
    sig = signature(fn, consts, "bf16")
    opts = dict(num_warps=4, num_stages=2, launch_pdl=pdl)
    k = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts),
                       target=GPUTarget("cuda", 90, 32), options=opts)
    ptx = k.asm["ptx"]
    return (ptx.count("griddepcontrol.launch_dependents"), ptx.count("griddepcontrol.wait"),
            bool(k.metadata.launch_pdl))

for pdl in (False, True):
    consts = dict(HEAD_DIM=128, HEAD_DIM_PAD=128, GROUP=4, SEQ_Q=1, BLOCK_ROWS=16, BLOCK_N=64,
                  PAGED=False, PAGE_SIZE=0, SPLIT=True, DOT_PREC="tf32", INTERLEAVE=False,
                  FUSED=False, SPLITS_PAD=1, PDL=pdl)
    print("split", pdl, *compile_sm90(dk._decode_split_kernel, consts, False))
    consts = dict(HEAD_DIM=128, HEAD_DIM_PAD=128, SPLITS_PAD=8, PDL=pdl)
    print("combine", pdl, *compile_sm90(dk._decode_combine_kernel, consts, pdl))
"""


@pytest.mark.slow
def test_compiled_for_sm90_the_instructions_come_only_with_pdl() -> None:
    import subprocess
    import sys

    from decode_sm90 import subprocess_env

    done = subprocess.run([sys.executable, "-c", _COMPILE_SM90], env=subprocess_env(),
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == [
        "split False 0 0 False",
        "combine False 0 0 False",
        "split True 1 0 False",
        "combine True 0 1 True",
    ], done.stdout


# ---------------------------------------------------------------------------------------
# GPU: bit for bit the two-kernel launch


def _gpu_inputs(lengths, page_size, sq=1):
    return make_inputs(lengths, sq, 32, 8, 128, page_size=page_size, dtype=torch.bfloat16,
                       device="cuda")  # fmt: skip


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("page_size, sq, splits", [
    (0, 1, None), (0, 4, 3), (64, 1, None), (256, 1, 8), (16, 4, 128),
])  # fmt: skip
def test_gpu_pdl_is_the_two_kernel_launch_bit_for_bit(page_size, sq, splits):
    q, k, v, seqlens, table = _gpu_inputs([8192, 16, 3000, 4097], page_size, sq=sq)
    got = [decode_attention(q, k, v, cache_seqlens=seqlens, block_table=table,
                            num_splits=splits, return_lse=True, config=c)
           for c in (PDL, PLAIN)]  # fmt: skip
    assert plan_launch(q, k, table, splits, PDL).num_splits > 1
    assert torch.equal(got[0][0], got[1][0]) and torch.equal(got[0][1], got[1][1])


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("page_size", [0, 64])
def test_gpu_pdl_plan_relaunches_bit_for_bit(page_size):
    q, k, v, seqlens, table = _gpu_inputs([8192] * 8, page_size)
    plan = plan_decode(q, k, v, cache_seqlens=seqlens, block_table=table, config=PDL)
    assert plan.launch.num_splits > 1 and len(plan._calls) == 2
    assert plan._calls[1][3].get("launch_pdl") is True
    first = plan.run().clone()
    assert plan.bound, plan.bound_reason
    for _ in range(200):  # back to back: a combine reading before its split ended shows
        plan.run()
    torch.cuda.synchronize()
    assert torch.equal(plan.o, first)
    plain = decode_attention(q, k, v, cache_seqlens=seqlens, block_table=table,
                             num_splits=plan.launch.num_splits, config=PLAIN)  # fmt: skip
    assert torch.equal(first, plain)


@pytest.mark.gpu
@needs_cuda
def test_gpu_the_adapter_names_the_pdl_combine():
    from fa_bench import registry
    from fa_bench.case import Case
    from fa_bench.run.execute import make_inputs as case_inputs

    registry.load()
    case = Case(impl="triton", mode="decode", dtype="bf16", batch=8, heads_q=32, heads_kv=8,
                seqlen_q=1, seqlen_k=8192, head_dim=128, causal=True, page_size=64)  # fmt: skip
    q, k, v, _ = case_inputs(case, torch.device("cuda"))
    impl = registry.get("triton")
    backend = impl.prepare(case, q, k, v, {"fused_combine": False, "merge_tile": False}).backend
    assert "combine kernel (PDL); planned launch" in backend, backend
    # the default (session 9): a few splits merged in the split kernel, no second launch
    backend = impl.prepare(case, q, k, v).backend
    assert "fused combine (tile); planned launch" in backend, backend
