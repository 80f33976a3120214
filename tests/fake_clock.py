"""A virtual `time` module for tests of loops that read the clock and sleep.

`sleep` moves the clock on, and so does every reading (one tick), as a real clock does: a
loop that only reads it still ends, and host-side work takes almost no time however busy
the machine running the test is. Deterministic where the real clock on a busy machine is
not (host-timed tests flapped under load).
"""

from __future__ import annotations


class FakeClock:
    TICK_S = 1e-6

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        self.now += self.TICK_S
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
