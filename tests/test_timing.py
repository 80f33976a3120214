"""The measurement engine's statistics and stopping rule (CPU path)."""

from __future__ import annotations

import math
import time

import pytest

from fa_bench.timing import TimingConfig, measure, noise, quantile, summarize


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


def test_stops_on_noise_after_min_samples() -> None:
    cfg = TimingConfig(target_noise=0.5, min_samples=5, min_time_s=0.0, max_time_s=10)
    t = measure(lambda: time.sleep(0.001), device="cpu", config=cfg)
    assert t.stop_reason == "noise"
    assert len(t.samples_ms) == 5
    assert all(s >= 1.0 for s in t.samples_ms)  # sleep(1 ms) cannot take less


def test_gives_up_at_time_limit() -> None:
    calls = []

    def jittery() -> None:
        calls.append(1)
        time.sleep(0.0005 if len(calls) % 2 else 0.004)  # far noisier than the target

    cfg = TimingConfig(target_noise=0.0001, min_samples=2, min_time_s=0.0, max_time_s=0.1)
    t0 = time.perf_counter()
    t = measure(jittery, device="cpu", config=cfg)
    wall = time.perf_counter() - t0
    assert t.stop_reason == "time-limit"
    assert 0.1 <= wall < 1.0


def test_before_runs_outside_timed_span() -> None:
    cfg = TimingConfig(target_noise=0.5, min_samples=3, min_time_s=0.0, max_time_s=5)
    t = measure(lambda: None, device="cpu", config=cfg, before=lambda: time.sleep(0.01))
    assert max(t.samples_ms) < 5.0  # the 10 ms sleeps are not in the samples


@pytest.mark.parametrize(
    "kw",
    [dict(target_noise=0.0), dict(min_samples=1), dict(min_time_s=5, max_time_s=1)],
)
def test_config_validation(kw: dict) -> None:
    with pytest.raises(ValueError):
        TimingConfig(**kw)
