"""The telemetry window: a case's closure back to back, and when its readings are taken.

A window read at its edges (GPM sampled before the first call and after the final
synchronisation) has idle time inside GPM's interval. On the H200 the calibration copy
read 0.855 of its own bytes/time that way (2026-11-29). So on a GPU the window is fenced
by two events inside a longer run of calls:

    pre-roll calls | A | window calls | B | post-roll calls

`open()` runs as soon as A has passed, with the window's calls queued behind it, and
`close()` as soon as B has passed, with the post-roll behind it. Both readings therefore
fall in steady load. The window's length and call count come from the events, not from
the host's clock.

`run_window` is the edge-read window: for sessions without device marks (a fake NVML in
the tests).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch

Closure = Callable[[], object]


class Mark(Protocol):
    """A point in the device's stream (a recorded CUDA event)."""

    def query(self) -> bool: ...

    def synchronize(self) -> None: ...

    def seconds_to(self, later: Mark) -> float: ...


@dataclass(frozen=True)
class BusyWindow:
    seconds: float  # device time from A to B
    calls: int  # calls between A and B
    open_at: float  # host perf_counter when open() ran
    close_at: float  # and close()

    @property
    def readings_s(self) -> float:
        """Host time between the two readings (what the energy counter's delta spans)."""
        return self.close_at - self.open_at


class CudaMark:
    def __init__(self, device: torch.device | str) -> None:
        import torch

        self.event = torch.cuda.Event(enable_timing=True)
        self.event.record(torch.cuda.current_stream(device))

    def query(self) -> bool:
        return bool(self.event.query())

    def synchronize(self) -> None:
        self.event.synchronize()

    def seconds_to(self, later: Mark) -> float:
        return self.event.elapsed_time(later.event) / 1e3  # type: ignore[attr-defined]


def run_busy_window(
    closure: Closure,
    before: Closure | None,
    *,
    mark: Callable[[], Mark],
    sync: Callable[[], None],
    open: Callable[[], None],
    close: Callable[[], None],
    per_call_s: float | None,
    target_s: float,
    max_calls: int,
    roll_s: float = 0.1,
) -> BusyWindow:
    """Run `closure` for at least `target_s` of device time between two marks, calling
    `open()` and `close()` at the marks; a second attempt (with `open`/`close` again) when
    the latency estimate `per_call_s` was so high that the first fell short."""

    def call() -> None:
        if before is not None:
            before()
        closure()

    est = per_call_s if per_call_s and per_call_s > 0 else None
    if est is None:  # one synchronised call for an estimate
        t0 = time.perf_counter()
        call()
        sync()
        est = max(time.perf_counter() - t0, 1e-6)
    for attempt in (1, 2):
        # 10% over the target: back-to-back calls skip the timing loop's L2 flush and so
        # often run a little faster than the latency median that sized them.
        n_win = min(max(1, math.ceil(1.1 * target_s / est)), max_calls)
        n_roll = min(max(1, math.ceil(roll_s / est)), max_calls)
        window = _fenced(call, mark, sync, open, close, n_win, n_roll)
        if attempt == 2 or window.seconds >= target_s or n_win >= max_calls:
            return window
        est = max(window.seconds / window.calls, 1e-9)
    raise AssertionError("unreachable: the second attempt returns")


def _fenced(
    call: Closure,
    mark: Callable[[], Mark],
    sync: Callable[[], None],
    open: Callable[[], None],
    close: Callable[[], None],
    n_win: int,
    n_roll: int,
) -> BusyWindow:
    # Launches block once about a thousand are pending, so the marks are polled between
    # launches: each reading happens as soon as its mark has passed.
    for _ in range(n_roll):
        call()
    a = mark()
    opened: float | None = None
    closed: float | None = None

    def poll(b: Mark | None) -> None:
        nonlocal opened, closed
        if opened is None and a.query():
            open()
            opened = time.perf_counter()
        if b is not None and opened is not None and closed is None and b.query():
            close()
            closed = time.perf_counter()

    for _ in range(n_win):
        call()
        poll(None)
    b = mark()
    for _ in range(n_roll):
        call()
        poll(b)
    if opened is None:  # every launch returned at once: the window's calls still run
        a.synchronize()
        open()
        opened = time.perf_counter()
    if closed is None:
        b.synchronize()
        close()
        closed = time.perf_counter()
    sync()
    return BusyWindow(a.seconds_to(b), n_win, opened, closed)


def run_window(
    closure: Closure,
    before: Closure | None,
    *,
    sync: Callable[[], None],
    per_call_s: float | None,
    target_s: float,
    max_calls: int,
) -> tuple[float, int]:
    """Call `closure` back to back until at least `target_s` has passed; (seconds, calls).

    Calls are launched without synchronising, so short kernels run densely; launching stops
    when the calls cover the remaining time by the latency estimate `per_call_s` (so a slow,
    asynchronous case is not queued thousands deep) or when host time has passed it (a
    host-bound case). Then the device is synchronised and the window measured; short of the
    target, another round. A 2 s case gets one call; at least one call always runs.
    """
    t0 = time.perf_counter()
    calls = 0
    while True:
        round_start, round_calls = time.perf_counter() - t0, calls
        remaining = target_s - round_start
        while calls < max_calls:
            if calls > round_calls and time.perf_counter() - t0 >= target_s:
                break
            if per_call_s and (calls - round_calls) * per_call_s >= remaining:
                break
            if before is not None:
                before()
            closure()
            calls += 1
        sync()
        elapsed = time.perf_counter() - t0
        if elapsed >= target_s or calls >= max_calls:
            return elapsed, calls
