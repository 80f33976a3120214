"""The decode heuristic's session-6 rule (kernels/decode_config.py, `_MID_*`): a paged
cache of pages >= 64 keys, a capacity from 8k below 64k and programs from a quarter of
the SMs to one per SM (batch 8 at 8 KV heads) takes 64-key blocks at 4 stages, measured
0.6-0.7 us faster than 32-key blocks at 5 stages on the H200 (call B); every other launch
is the one before it."""

from __future__ import annotations

import pytest

from fa_bench.kernels.decode_config import DecodeConfig, resolve


def _launch(batch, ctx, page, config=None, heads_kv=8):
    launch = resolve(config, None, programs=batch * heads_kv, capacity=ctx, page_size=page,
                     sms=132)  # fmt: skip
    return launch.block_n, launch.num_stages, launch.num_splits


@pytest.mark.parametrize("page", [64, 128, 256])
@pytest.mark.parametrize("ctx", [8192, 32768])
def test_batch_8_paged_takes_64_key_blocks_at_4_stages(page, ctx) -> None:
    # 8 splits: 512 programs, 4 per SM (one wave), as measured
    assert _launch(8, ctx, page) == (64, 4, 8)


@pytest.mark.parametrize(
    ("batch", "ctx", "page", "want"),
    [
        (8, 8192, 16, (32, 5, 8)),  # pages of 16: the tuned 32-key blocks
        (8, 8192, 32, (32, 5, 8)),
        (8, 4096, 64, (32, 5, 8)),  # below 8k
        (8, 131072, 64, (64, 5, 4)),  # the long-context rule
        (64, 8192, 64, (32, 5, 1)),  # 512 programs: a wave of their own
        (1, 32768, 64, (32, 5, 49)),  # 8 programs: the splits' rule
        (2, 32768, 64, (32, 5, 32)),  # 16 programs: under a quarter of the SMs
        (8, 8192, None, (64, 2, 8)),  # contiguous
    ],
)
def test_other_launches_are_unchanged(batch, ctx, page, want) -> None:
    assert _launch(batch, ctx, page) == want


def test_a_config_that_fixes_the_block_or_the_stages_keeps_them() -> None:
    assert _launch(8, 8192, 64, DecodeConfig(block_n=32))[:2] == (32, 5)
    assert _launch(8, 8192, 64, DecodeConfig(num_stages=5))[:2] == (32, 5)


# ---------------------------------------------------------------------------------------
# The launch it takes, run: interpreter (fp32) and GPU (bf16)


def _kernel_tests():
    import os

    import torch

    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"
    pytest.importorskip("triton")
    import test_decode_kernel

    return test_decode_kernel


@pytest.mark.slow  # the interpreter
@pytest.mark.parametrize("page", [64, 256])
def test_interpreter_64_key_blocks_in_pages_against_the_reference(page) -> None:
    import torch

    tk = _kernel_tests()
    if not tk.INTERPRETED:
        pytest.skip("needs TRITON_INTERPRET=1 (CPU runs)")
    from fa_bench.kernels import decode_attention

    # ragged: 1, a page boundary, a length mid-page; a shuffled table; 3 splits
    q, k, v, seqlens, table = tk.make_inputs([1, page, 2 * page + 17], 1, 8, 2, 16,
                                             page_size=page)  # fmt: skip
    config = DecodeConfig(block_n=64, num_stages=4)
    o, lse = decode_attention(q, k, v, cache_seqlens=seqlens, block_table=table,
                              num_splits=3, return_lse=True, config=config)  # fmt: skip
    want_o, want_lse = tk.reference(q, k, v, seqlens, table)
    torch.testing.assert_close(o.double(), want_o, **tk.FP32_TOL)
    torch.testing.assert_close(lse.double(), want_lse, **tk.FP32_TOL)


@pytest.mark.gpu
@pytest.mark.parametrize("page", [64, 256])
@pytest.mark.parametrize("lengths", [[8192] * 8, [8192, 16, 3000, 4097, 64, 5000, 8000, 1]])
def test_gpu_the_rule_launch_against_the_reference(page, lengths) -> None:
    import torch

    tk = _kernel_tests()
    if tk.INTERPRETED or not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from fa_bench.kernels.decode_attention import plan_launch

    q, k, _, _, table = tk.make_inputs(lengths, 1, 32, 8, 128, page_size=page,
                                       dtype=torch.bfloat16, device="cuda")  # fmt: skip
    launch = plan_launch(q, k, table, None, None)
    assert (launch.block_n, launch.num_stages, launch.num_splits) == (64, 4, 8)
    tk._assert_within_pytorch_error(lengths, 1, 32, 8, 128, torch.bfloat16, page)


@pytest.mark.slow  # compiles four kernels for sm_90
def test_sm90_the_64_key_loop_takes_fewer_instructions_per_key() -> None:
    import os
    import subprocess
    import sys
    from pathlib import Path

    tool = Path(__file__).resolve().parent.parent / "tools" / "gpu" / "decode_sass.py"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, str(tool)], env=env, capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line.split("|")[1:-1] for line in done.stdout.splitlines()[3:]]
    per_key = {(int(r[0]), int(r[1])): float(r[7]) for r in rows}
    for page in (64, 256):
        assert per_key[(page, 64)] < 0.75 * per_key[(page, 32)], done.stdout
