"""The measurement engine: statistics and stopping rule (CPU), warm-up and clock (GPU)."""

from __future__ import annotations

import math
import time

import pytest
import torch
from fake_clock import FakeClock

from fa_bench.run import timing
from fa_bench.run.timing import (
    Timing,
    TimingConfig,
    default_warmup_ms,
    measure,
    noise,
    quantile,
    summarize,
)


def test_quantile_matches_linear_interpolation() -> None:
    values = [1.0, 2.0, 3.0, 4.0, 5.0]
    assert quantile(values, 0.5) == 3.0
    assert quantile(values, 0.2) == pytest.approx(1.8)
    assert quantile(values, 0.8) == pytest.approx(4.2)
    assert quantile([7.0], 0.3) == 7.0


def test_summarize_keeps_samples_and_order() -> None:
    s = summarize([3.0, 1.0, 2.0])
    assert s["samples"] == [3.0, 1.0, 2.0]
    assert (s["min"], s["median"], s["max"], s["n"]) == (1.0, 2.0, 3.0, 3)
    assert s["stdev"] == pytest.approx(1.0)
    assert s["noise"] == pytest.approx(1.0 / 2.0 / math.sqrt(3))


def test_noise_is_relative_standard_error() -> None:
    assert noise([1.0]) == math.inf
    assert noise([2.0, 2.0, 2.0]) == 0.0


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(timing, "time", fake)
    return fake


def test_stops_on_noise_after_min_samples(clock: FakeClock) -> None:
    cfg = TimingConfig(target_noise=0.5, min_samples=5, min_time_s=0.0, max_time_s=10)
    t = measure(lambda: clock.sleep(0.001), device="cpu", config=cfg)
    assert t.stop_reason == "noise"
    assert len(t.samples_ms) == 5
    # 1 ms asleep plus the one tick between the two readings.
    assert t.samples_ms == pytest.approx([1.001] * 5)
    assert 19 <= t.warmup_calls <= 21  # 20 ms of warm-up in 1 ms calls


def test_gives_up_at_time_limit(clock: FakeClock) -> None:
    calls = []

    def jittery() -> None:
        calls.append(1)
        clock.sleep(0.0005 if len(calls) % 2 else 0.004)  # far noisier than the target

    cfg = TimingConfig(target_noise=0.0001, min_samples=2, min_time_s=0.0, max_time_s=0.1)
    t0 = clock.perf_counter()
    t = measure(jittery, device="cpu", config=cfg)
    wall = clock.perf_counter() - t0
    assert t.stop_reason == "time-limit"
    # The warm-up, then samples until the first one that ends past the limit; each of the
    # two can overrun by at most one call.
    warmup_s = cfg.warmup_ms / 1e3
    assert warmup_s + cfg.max_time_s <= wall < warmup_s + cfg.max_time_s + 2 * 0.0041
    assert {round(s, 2) for s in t.samples_ms} == {0.5, 4.0}  # alternating, none dropped


def test_before_runs_outside_timed_span(clock: FakeClock) -> None:
    cfg = TimingConfig(target_noise=0.5, min_samples=3, min_time_s=0.0, max_time_s=5)
    t = measure(lambda: None, device="cpu", config=cfg, before=lambda: clock.sleep(0.01))
    assert max(t.samples_ms) < 5.0  # the 10 ms sleeps are not in the samples
    assert t.samples_ms == pytest.approx([0.001] * 3)  # only the tick between the readings


def test_cpu_timing_reads_the_real_clock() -> None:
    # The one check against the real perf_counter: a sleep cannot take less than asked.
    cfg = TimingConfig(target_noise=0.5, min_samples=3, min_time_s=0.0, max_time_s=1.0)
    t = measure(lambda: time.sleep(0.001), device="cpu", config=cfg)
    assert t.method == "perf_counter" and t.stop_reason in ("noise", "time-limit")
    assert len(t.samples_ms) >= 3 and all(s >= 1.0 for s in t.samples_ms)


@pytest.mark.parametrize(
    "kw",
    [dict(target_noise=0.0), dict(min_samples=1), dict(min_time_s=5, max_time_s=1)],
)
def test_config_validation(kw: dict) -> None:
    with pytest.raises(ValueError):
        TimingConfig(**kw)


def test_clock_stats_summarize_the_readings() -> None:
    t = Timing([1.0, 1.1], "cuda-events", "noise", 2, True, [1980.0, 1830.0, 1890.0])
    assert t.clock_stats() == {"min": 1830.0, "mean": 1900.0, "max": 1980.0, "n": 3}
    assert Timing([1.0], "perf_counter", "noise", 2, False).clock_stats() is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_warmup_fills_its_time_and_the_clock_is_read_per_batch() -> None:
    a = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
    readings = iter([1980.0, None, 1500.0] + [1700.0] * 10_000)
    cfg = TimingConfig(warmup_ms=300.0, target_noise=0.05, max_time_s=0.5)
    t0 = time.perf_counter()
    cuda = torch.device("cuda")
    t = measure(lambda: a @ a, device=cuda, config=cfg, clock=lambda: next(readings))
    assert time.perf_counter() - t0 >= 0.3
    # A 2048^3 matmul takes well under a millisecond: 300 ms of warm-up is many calls.
    assert t.warmup_calls > 50
    assert t.sm_clock_mhz[:2] == [1980.0, 1500.0]  # the None reading is skipped


def test_default_warmup_waits_for_a_gpu_clock_only() -> None:
    assert default_warmup_ms(on_cpu=True) == 20.0
    assert default_warmup_ms(on_cpu=False) == 500.0
