"""Issue 20, session 11: a launch of few splits that the model times the same with a
deeper pipeline takes it and half the splits, while its programs still cover the SMs
(kernels/decode_config.py `deeper`, $FA_BENCH_DECODE_DEEP), and its A/B tool's pick."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from fa_bench.kernels.decode_config import DecodeConfig, resolve
from fa_bench.kernels.decode_rules import DEEP_ENV

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools" / "gpu"))


def _launch(batch=8, ctx=8192, page=None, rows=16, config=None, splits=None):
    ln = resolve(config, splits, programs=batch * 8, capacity=ctx, page_size=page, sms=132,
                 block_rows=rows)  # fmt: skip
    return ln.block_n, ln.num_stages, ln.num_splits


@pytest.mark.parametrize(
    ("page", "rows", "want"),
    [
        (None, 16, (64, 3, 4)),  # one more stage, half the splits
        (64, 16, (64, 5, 4)),  # paged: 64-key blocks at 5 stages, half the splits
        (16, 16, (64, 5, 4)),  # four pages of 16 a block
        (None, 32, (64, 3, 4)),  # GQA 8 x Sq 4: 4 splits, so one merge chunk
        (256, 32, (64, 5, 4)),
    ],
)
def test_batch_8_takes_the_deeper_pipeline(page, rows, want, monkeypatch):
    monkeypatch.delenv(DEEP_ENV, raising=False)
    assert _launch(page=page, rows=rows) == want


def test_the_environment_turns_it_off_and_a_bad_value_is_named(monkeypatch):
    monkeypatch.setenv(DEEP_ENV, "0")
    assert _launch(rows=16) == (64, 2, 8) and _launch(page=64, rows=16) == (32, 5, 8)
    monkeypatch.setenv(DEEP_ENV, "yes")
    with pytest.raises(ValueError, match=r"FA_BENCH_DECODE_DEEP is 'yes'; valid: 0, 1"):
        _launch(rows=16)


def test_set_fields_and_other_shapes_keep_their_launch(monkeypatch):
    monkeypatch.delenv(DEEP_ENV, raising=False)
    # a config's block or stages, or an explicit split count, are not second-guessed
    assert _launch(rows=16, config=DecodeConfig(num_stages=2)) == (64, 2, 8)
    assert _launch(page=64, rows=16, config=DecodeConfig(block_n=32)) == (32, 5, 8)
    assert _launch(rows=16, splits=8) == (64, 2, 8)
    # batch 1 x 1k (8 programs): 4 splits would leave SMs without a program (call 2:
    # 0.95 of 8 splits' speed), so 8 splits stay
    assert _launch(batch=1, ctx=1024, page=64) == (32, 5, 8)
    # many splits (batch 1 x 32k: the combine kernel by rows, not one merge chunk)
    assert _launch(batch=1, ctx=32768, rows=16)[2] > 8
    # one split already (batch 64 x 8k): nothing to halve
    assert _launch(batch=64, rows=16) == (64, 2, 1)
    # a 64k context paged already runs 64-key blocks: no 128-key step
    assert _launch(ctx=65536, page=64, rows=16)[0] == 64


def test_the_ab_tools_pick():
    import decode_s11_ab as ab

    def row(old, deep, same=False):
        return {"old": old, "deep": deep, "same_launch": same}

    assert ab.pick([row(72.0, 70.0), row(71.0, 70.5)])[0] == 1
    assert ab.pick([row(72.0, 70.0), row(70.0, 71.5)])[0] == 0  # one shape 2% slower
    assert ab.pick([row(70.0, 70.1), row(70.0, 69.9)])[0] == 0  # no gain
    assert ab.pick([row(70.0, 60.0, same=True)]) == (
        0, "no shape measured where the rule changes the launch")  # fmt: skip


@pytest.mark.slow
def test_the_ab_tool_runs_on_the_cpu(tmp_path):
    import subprocess

    tool = Path(__file__).resolve().parents[1] / "tools" / "gpu" / "decode_s11_ab.py"
    env = {**__import__("os").environ, "TRITON_INTERPRET": "1"}
    out = tmp_path / "ab.json"
    done = subprocess.run([sys.executable, str(tool), "--smoke", "--json", str(out)], env=env,
                          capture_output=True, text=True, timeout=900)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().endswith("pick: 0") and out.exists()


def test_one_loop_at_sq_above_1_follows_its_switch(monkeypatch):
    from fa_bench.kernels import decode_rules

    def one_loop(seq_q, config=None):
        return resolve(config, None, programs=64, capacity=8192, page_size=64, sms=132,
                       seq_q=seq_q).one_loop  # fmt: skip

    monkeypatch.delenv(decode_rules.ONE_LOOP_ENV, raising=False)
    assert one_loop(4) is decode_rules._ONE_LOOP_MULTI and one_loop(1) is False
    monkeypatch.setenv(decode_rules.ONE_LOOP_ENV, "1")
    assert one_loop(4) is True and one_loop(16) is True
    assert one_loop(1) is False  # no diagonal block at Sq 1
    assert one_loop(4, DecodeConfig(one_loop=False)) is False  # a set field wins
    monkeypatch.setenv(decode_rules.ONE_LOOP_ENV, "0")
    assert one_loop(4) is False
    monkeypatch.setenv(decode_rules.ONE_LOOP_ENV, "on")
    with pytest.raises(ValueError, match=r"FA_BENCH_DECODE_ONE_LOOP is 'on'; valid: 0, 1"):
        one_loop(4)
