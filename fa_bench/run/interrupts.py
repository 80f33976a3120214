"""Ctrl-C during a run: the first one stops the cases, later ones cannot lose results.

While cases run, SIGINT raises KeyboardInterrupt as usual (the runner stops its worker
and the journal keeps every finished case). From the first SIGINT on, or once the cases
are done (`hold`), further ones only say that the results are being written: a second or
third Ctrl-C can no longer cut results.json or results.csv short. `allow` lets SIGINT
raise again for a step that may be skipped, such as the HTML report.
"""

from __future__ import annotations

import os
import signal
import threading
from types import FrameType, TracebackType

_HELD_NOTE = b"\nstill writing the results; they will be kept (Ctrl-C is held until then)\n"


class InterruptGuard:
    """Installs its SIGINT handler on entry (main thread only) and restores the old one."""

    def __init__(self) -> None:
        self.raising = True
        self.count = 0  # SIGINTs received while installed
        self._old: object = None
        self._installed = False

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.count += 1
        if self.raising:
            self.raising = False  # the results are written next: hold the next ones
            raise KeyboardInterrupt
        os.write(2, _HELD_NOTE)  # os.write: safe inside a signal handler, unlike print

    def hold(self) -> None:
        self.raising = False

    def allow(self) -> None:
        self.raising = True

    def __enter__(self) -> InterruptGuard:
        if threading.current_thread() is threading.main_thread():
            self._old = signal.signal(signal.SIGINT, self._handle)
            self._installed = True
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._installed:
            signal.signal(signal.SIGINT, self._old)  # type: ignore[arg-type]
            self._installed = False
