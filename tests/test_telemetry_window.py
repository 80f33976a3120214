"""The busy telemetry window, on a device stream simulated in host time: launches return at
once and queue, marks pass when the queue reaches them, as CUDA events do."""

from __future__ import annotations

import sys
import time

import pytest
from fake_clock import FakeClock
from fake_nvml import UUID, FakeNvml

from fa_bench.telemetry import window as window_module
from fa_bench.telemetry.session import TelemetryConfig, TelemetrySession
from fa_bench.telemetry.window import run_busy_window


class FakeStream:
    def __init__(self, cost_s: float) -> None:
        self.cost_s = cost_s
        self.free_at = time.perf_counter()  # when the queued work is done
        self.calls = 0

    def call(self) -> None:
        self.free_at = max(time.perf_counter(), self.free_at) + self.cost_s
        self.calls += 1

    def busy(self) -> bool:
        return time.perf_counter() < self.free_at

    def mark(self) -> FakeMark:
        return FakeMark(max(time.perf_counter(), self.free_at))

    def sync(self) -> None:
        time.sleep(max(0.0, self.free_at - time.perf_counter()))


class FakeMark:
    def __init__(self, at: float) -> None:
        self.at = at

    def query(self) -> bool:
        return time.perf_counter() >= self.at

    def synchronize(self) -> None:
        time.sleep(max(0.0, self.at - time.perf_counter()))

    def seconds_to(self, later: FakeMark) -> float:
        return later.at - self.at


class Ends:
    """open()/close() that note whether the stream was busy when they ran."""

    def __init__(self, stream: FakeStream) -> None:
        self.stream, self.opened, self.closed = stream, [], []

    def open(self) -> None:
        self.opened.append(self.stream.busy())

    def close(self) -> None:
        self.closed.append(self.stream.busy())


@pytest.fixture
def virtual_time(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    """The stream simulated here and the window's own clock both on a FakeClock."""
    clock = FakeClock()
    monkeypatch.setattr(sys.modules[__name__], "time", clock)
    monkeypatch.setattr(window_module, "time", clock)
    return clock


def window(stream: FakeStream, ends: Ends, per_call_s: float | None, target_s: float = 0.2):
    return run_busy_window(
        stream.call, None, mark=stream.mark, sync=stream.sync, open=ends.open,
        close=ends.close, per_call_s=per_call_s, target_s=target_s, max_calls=10**6,
        roll_s=0.05,
    )  # fmt: skip


def test_readings_fall_inside_the_busy_period(virtual_time: FakeClock) -> None:
    stream = FakeStream(0.002)
    ends = Ends(stream)
    w = window(stream, ends, per_call_s=0.002)
    assert ends.opened == [True] and ends.closed == [True]  # one attempt, both ends busy
    assert w.seconds == pytest.approx(w.calls * 0.002, rel=1e-6)  # device time, marks apart
    assert w.seconds >= 0.2 and w.calls < stream.calls  # pre- and post-roll ran too
    assert 0 < w.readings_s <= w.seconds + 0.01


def test_an_estimate_too_high_gets_a_second_attempt(virtual_time: FakeClock) -> None:
    stream = FakeStream(0.001)
    ends = Ends(stream)
    w = window(stream, ends, per_call_s=0.01)  # 10x too slow: 22 calls, 22 ms
    assert len(ends.opened) == len(ends.closed) == 2
    assert w.seconds >= 0.2 and all(ends.opened) and all(ends.closed)


def test_no_estimate_times_one_call_first(virtual_time: FakeClock) -> None:
    stream = FakeStream(0.004)
    ends = Ends(stream)
    w = window(stream, ends, per_call_s=None, target_s=0.1)
    assert w.seconds >= 0.1 and ends.opened == [True] and ends.closed == [True]


def test_session_reads_energy_over_the_readings_and_scales_it_per_call() -> None:
    stream = FakeStream(0.001)
    cfg = TelemetryConfig(window_s=0.2, poll_s=0.02)
    s = TelemetrySession.from_uuid(UUID, lib=FakeNvml(), config=cfg, mark=stream.mark)
    s.sync = stream.sync
    t = s.measure(stream.call, None, per_call_s=0.001, bytes_model=1e6)
    assert t["available"] and t["readings"] == "inside a busy window"
    assert t["window_s"] >= 0.2 and t["calls"] >= 200
    assert t["ms_per_call_window"] == pytest.approx(1.0, rel=1e-6)
    # Energy spans the readings (host time), calls the marks (device time): per call it
    # is the mean power times one call's device time.
    assert t["energy_j_per_call"] == pytest.approx(t["power_w_mean"] * 1e-3, rel=1e-6)
    assert t["gbps_nvml"] and t["sm_clock_mhz_mean"] and not t["unavailable"]


class IdleStream(FakeStream):
    """A closure that queues no device work: every mark lands on the same device instant."""

    def call(self) -> None:
        self.calls += 1

    def mark(self) -> FakeMark:
        return FakeMark(self.free_at)


def test_a_window_with_no_device_time_says_so_instead_of_dividing_by_zero() -> None:
    stream = IdleStream(0.0)
    cfg = TelemetryConfig(window_s=0.2, poll_s=0.02, max_calls=50)
    s = TelemetrySession.from_uuid(UUID, lib=FakeNvml(), config=cfg, mark=stream.mark)
    s.sync = stream.sync
    t = s.measure(stream.call, None, per_call_s=None, bytes_model=1e6)
    assert t["available"] is False
    assert "no device time" in t["reason"] and "failed" not in t["reason"]
