"""The tuning cache: path rule, seqlen buckets, write/read/lookup, broken files."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch

from fa_bench.kernels.flash_config import FlashConfig, default_config, heuristic_config
from fa_bench.sweep import tuning

CPU = torch.device("cpu")


def select_config(
    head_dim: int, dtype: torch.dtype, causal: bool, device: torch.device, seqlen: int,
    cache_path: Path | None,
) -> tuple[FlashConfig, str]:  # fmt: skip
    """What the `triton` adapter does: the heuristic, then the cache laid over it."""
    base = heuristic_config(head_dim, dtype, causal, device, seqlen)
    return tuning.select(base, gpu="cpu", dtype="fp32", head_dim=head_dim, causal=causal,
                         seqlen=seqlen, path=cache_path)  # fmt: skip


def _entry(mode: str = "fwd", bucket: str = "1025-4096", **config: int) -> dict:
    fields = config or (
        {"block_m": 32, "block_n": 16, "num_warps": 2, "num_stages": 1}
        if mode == "fwd"
        else {"bwd_block_m": 16, "bwd_block_n": 32, "bwd_num_warps": 2, "bwd_num_stages": 1}
    )
    return {"gpu": "cpu", "dtype": "fp32", "head_dim": 40, "causal": True, "mode": mode,
            "seqlen_bucket": bucket, "config": fields}  # fmt: skip


@pytest.mark.parametrize(
    ("seqlen", "bucket"),
    [(1, "1-256"), (256, "1-256"), (257, "257-1024"), (1024, "257-1024"),
     (1025, "1025-4096"), (4096, "1025-4096"), (16384, "4097-16384"), (65537, "65537-")],
)  # fmt: skip
def test_seqlen_bucket_boundaries(seqlen: int, bucket: str) -> None:
    assert tuning.seqlen_bucket(seqlen) == bucket


def test_path_rule(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(tuning.ENV_VAR, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert tuning.resolve_path() == tmp_path / "fa-bench" / "tuning.json"
    monkeypatch.setenv(tuning.ENV_VAR, str(tmp_path / "env.json"))
    assert tuning.resolve_path() == tmp_path / "env.json"
    assert tuning.resolve_path(tmp_path / "flag.json") == tmp_path / "flag.json"
    assert tuning.resolve_path("off") is None


def test_write_merges_and_lookup_finds_by_bucket(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    tuning.write_cache(path, [_entry("fwd")])
    tuning.write_cache(path, [_entry("bwd"), _entry("fwd", block_m=64, block_n=16,
                                                   num_warps=4, num_stages=1)])  # fmt: skip
    doc = json.loads(path.read_text())
    assert doc["schema"] == tuning.SCHEMA and len(doc["entries"]) == 2  # fwd replaced
    key = dict(gpu="cpu", dtype="fp32", head_dim=40, causal=True, path=path)
    found = tuning.lookup(seqlen=2000, **key)
    assert found["fwd"]["block_m"] == 64 and found["bwd"]["bwd_block_n"] == 32
    assert tuning.lookup(seqlen=1024, **key) == {}  # another bucket: not there
    assert tuning.lookup(seqlen=2000, **{**key, "causal": False}) == {}


def test_write_removes_keys_a_newer_sweep_left_to_the_heuristic(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    tuning.write_cache(path, [_entry("fwd"), _entry("bwd")])
    tuning.write_cache(path, [], remove=[tuning.entry_key(_entry("fwd")), ("other",)])
    assert [e["mode"] for e in json.loads(path.read_text())["entries"]] == ["bwd"]


def test_select_config_uses_cache_or_falls_back(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    tuning.write_cache(path, [_entry("fwd")])
    cpu = CPU
    cfg, source = select_config(40, torch.float32, True, cpu, 4096, cache_path=path)
    assert (cfg.block_m, cfg.block_n, cfg.num_warps) == (32, 16, 2)
    heuristic = default_config(64, torch.float32, True, None)
    assert cfg.bwd_block_m == heuristic.bwd_block_m  # no bwd entry: heuristic fields
    assert source == "tuning cache (fwd)"
    cfg, source = select_config(40, torch.float32, True, cpu, 100, cache_path=path)
    assert (cfg, source) == (heuristic, "heuristic")
    cfg, source = select_config(40, torch.float32, True, cpu, 4096, cache_path=None)
    assert source == "heuristic"


@pytest.mark.parametrize(
    "content",
    ["{not json", '{"schema": "other/1", "entries": []}', '{"schema": "fa-bench-tuning/1"}',
     json.dumps({"schema": "fa-bench-tuning/1", "entries": [{"gpu": "cpu"}]}),
     json.dumps({"schema": "fa-bench-tuning/1",
                 "entries": [_entry("fwd", block_m=48, block_n=16, num_warps=4,
                                    num_stages=1)]})],
)  # fmt: skip
def test_corrupted_cache_warns_and_uses_heuristic(tmp_path: Path, content: str) -> None:
    path = tmp_path / "broken.json"
    path.write_text(content)
    with pytest.warns(UserWarning, match="tuning cache ignored"):
        cfg, source = select_config(40, torch.float32, True, CPU, 4096, cache_path=path)
    assert source == "heuristic"
    assert cfg == default_config(64, torch.float32, True, None)
    with pytest.raises(tuning.TuningCacheError, match=str(path)):
        tuning.write_cache(path, [_entry("fwd")])  # never overwrite what we cannot read


def test_missing_cache_is_silent(tmp_path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert tuning.lookup(gpu="cpu", dtype="fp32", head_dim=40, causal=True, seqlen=10,
                             path=tmp_path / "none.json") == {}  # fmt: skip


def test_the_triton_adapter_runs_the_cached_config(tmp_path: Path, monkeypatch) -> None:
    """The registry adapter picks the cache up and hands the kernel an explicit config; a
    wrong cached config would show here as an error, a right one as output equal to the
    explicit-config call. The library's own `flash_attention(config=None)` ignores it."""
    from fa_bench import registry
    from fa_bench.case import Case
    from fa_bench.kernels.flash_attention import flash_attention

    path = tmp_path / "t.json"
    tuning.write_cache(path, [_entry("fwd", bucket="1-256")])
    monkeypatch.setenv(tuning.ENV_VAR, str(path))
    q, k, v = (torch.randn(1, 2, 40, 40) for _ in range(3))
    case = Case("triton", "fwd", "fp32", 1, 2, 2, 40, 40, 40, True)
    prepared = registry.load()["triton"].prepare(case, q, k, v)
    assert prepared.backend == "triton:bm32-bn16-w2-s1 (tuning cache (fwd))"
    got = prepared.fn(q, k, v)
    explicit = FlashConfig(block_m=32, block_n=16, num_warps=2, num_stages=1,
                           bwd_block_m=64, bwd_block_n=64)  # fmt: skip
    want = flash_attention(q, k, v, causal=True, config=explicit)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    heuristic = flash_attention(
        q, k, v, causal=True, config=default_config(64, q.dtype, True, None)
    )
    torch.testing.assert_close(flash_attention(q, k, v, causal=True), heuristic, rtol=0, atol=0)


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU end-to-end")
def test_run_honours_a_relative_cache_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny_suite
) -> None:
    # The worker runs in the output folder: a relative $FA_BENCH_TUNING_CACHE was once
    # read from there, found nothing, and the run silently used the heuristic (H200,
    # 2026-11-29: a "slowed" run that was not slowed).
    from slow_tuning import write_slow_cache
    from typer.testing import CliRunner

    from fa_bench.cli import app

    monkeypatch.chdir(tmp_path)
    write_slow_cache(tmp_path / "slow.json", "cpu", block_m=16, block_n=16)
    monkeypatch.setenv(tuning.ENV_VAR, "slow.json")
    suite = tiny_suite(["triton"], seqlens=[32], head_dims=[16])
    args = ["run", "-s", str(suite), "--out", "out", "--max-time", "0.05", "--mode", "fwd"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    case = json.loads((tmp_path / "out" / "results.json").read_text())["cases"][0]
    assert "bm16-bn16" in case["backend"] and "tuning cache" in case["backend"]


@pytest.mark.parametrize("via", ["flag", "env"])
def test_run_rejects_a_named_cache_that_does_not_exist(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, via: str
) -> None:
    from typer.testing import CliRunner

    from fa_bench.cli import app

    missing = tmp_path / "nope.json"
    args = ["run", "-s", "smoke", "--out", str(tmp_path / "out")]
    if via == "flag":
        args += ["--tuning-cache", str(missing)]
    else:
        monkeypatch.setenv(tuning.ENV_VAR, str(missing))
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    named = "--tuning-cache" if via == "flag" else tuning.ENV_VAR
    assert named in result.output and "nope.json" in result.output
    assert not (tmp_path / "out").exists()
