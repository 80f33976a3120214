"""Paged batch 8 in the decode heuristic (kernels/decode_config.py), session 6: 64-key
blocks at 4 stages (one table read per block) were tried for pages of 64 keys and up from
8k (call B: 0.6-0.7 us faster at batch 8 x 8k) and not taken (call C: 1.1% slower at 32k
page 64, and with the PDL combine 3 us slower at 8k page 64, fa-bench run 0.85 x copy):
the heuristic keeps 32-key blocks at 5 stages there. The 64-key launch stays reachable by
DecodeConfig, run here against the reference in the interpreter, and its sm_90 loop is
compared with the 32-key one (tools/gpu/decode_sass.py)."""

from __future__ import annotations

import pytest

from fa_bench.kernels.decode_config import DecodeConfig, resolve
from fa_bench.kernels.decode_rules import DEEP_ENV


def _launch(batch, ctx, page, config=None, heads_kv=8):
    launch = resolve(config, None, programs=batch * heads_kv, capacity=ctx, page_size=page,
                     sms=132)  # fmt: skip
    return launch.block_n, launch.num_stages, launch.num_splits


@pytest.mark.parametrize("page", [16, 64, 128, 256])
@pytest.mark.parametrize("ctx", [8192, 32768])
def test_batch_8_paged_keeps_32_key_blocks_at_5_stages(page, ctx, monkeypatch) -> None:
    # the base rule; session 11's deeper pipeline then takes 64-key blocks at 5 stages
    # with half the splits (kernels/decode_rules.py, tests/test_decode_s11.py)
    monkeypatch.setenv(DEEP_ENV, "0")
    assert _launch(8, ctx, page) == (32, 5, 8)


def test_a_config_reaches_the_64_key_launch() -> None:
    config = DecodeConfig(block_n=64, num_stages=4)
    assert _launch(8, 8192, 64, config) == (64, 4, 8)


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
