"""Stop signals during a run: the first one stops the cases, later ones cannot lose results.

Ctrl-C (SIGINT), SIGTERM (a batch scheduler's time limit, `timeout`, `kill`) and SIGHUP
(the terminal closed) are handled alike. While cases run, the first one raises
`Interrupted`, a KeyboardInterrupt, as Ctrl-C always did (the runner stops its worker and
the journal keeps every finished case). From the first one on, or once the cases are done
(`hold`), further ones only say that the results are being written: a second or third
signal can no longer cut results.json or results.csv short. `allow` lets them raise again
for a step that may be skipped, such as the HTML report. The command exits 128 + the first
signal's number (130, 143, 129), as a shell reports a process that signal killed.
"""

from __future__ import annotations

import os
import signal
import threading
from types import FrameType, TracebackType

# SIGHUP does not exist on Windows; the guard installs what the platform has.
STOP_SIGNALS: tuple[signal.Signals, ...] = tuple(
    getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name)
)

_HELD_NOTE = b"\nstill writing the results; they will be kept (%s is held until then)\n"


class Interrupted(KeyboardInterrupt):
    """Raised by the guard's handler: every `except KeyboardInterrupt` also stops on it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal_label(signum))
        self.signum = signum


def signal_label(signum: int | None) -> str:
    """How messages name a stop signal: "Ctrl-C" for SIGINT, else its name (SIGTERM)."""
    if signum is None:
        return "interrupted"
    if signum == signal.SIGINT:
        return "Ctrl-C"
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def stop_exit_code(signum: int | None) -> int:
    """128 + the signal's number (SIGINT 130, SIGTERM 143, SIGHUP 129); 130 without one."""
    return 128 + (signum if signum is not None else signal.SIGINT)


class InterruptGuard:
    """Installs its handler for STOP_SIGNALS on entry (main thread only) and restores the
    old ones on exit."""

    def __init__(self) -> None:
        self.raising = True
        self.count = 0  # stop signals received while installed
        self.signum: int | None = None  # the first one
        self._old: dict[int, object] = {}
        self._ttys: list[int] = []  # stdout/stderr fds that were a terminal on entry

    @property
    def exit_code(self) -> int:
        return stop_exit_code(self.signum)

    @property
    def reason(self) -> str:
        return signal_label(self.signum)

    @property
    def headline(self) -> str:
        """A message's head: 'interrupted (SIGTERM)', or 'interrupted' without a signal."""
        return "interrupted" if self.signum is None else f"interrupted ({self.reason})"

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self._detach_dead_terminal()
        self.count += 1
        if self.signum is None:
            self.signum = signum
        if self.raising:
            self.raising = False  # the results are written next: hold the next ones
            raise Interrupted(signum)
        note = _HELD_NOTE % signal_label(signum).encode()
        try:
            os.write(2, note)  # os.write: safe inside a signal handler, unlike print
        except OSError:
            pass  # stderr gone (the terminal closed): the results matter, not the note

    def _detach_dead_terminal(self) -> None:
        """After a hang-up (the terminal closed: SIGHUP) every write to it fails with EIO,
        which would end the command before the results are written; what was printed
        there goes to /dev/null instead. A live terminal is left alone."""
        for fd in self._ttys:
            if not os.isatty(fd):  # a hung-up terminal answers EIO to isatty's ioctl
                null = os.open(os.devnull, os.O_WRONLY)
                os.dup2(null, fd)
                os.close(null)
        self._ttys = [fd for fd in self._ttys if os.isatty(fd)]

    def hold(self) -> None:
        self.raising = False

    def allow(self) -> None:
        self.raising = True

    def __enter__(self) -> InterruptGuard:
        if threading.current_thread() is threading.main_thread():
            self._ttys = [fd for fd in (1, 2) if os.isatty(fd)]
            for sig in STOP_SIGNALS:
                # An ignored signal stays ignored: `nohup` ignores SIGHUP so that the run
                # outlives the terminal, a shell's `cmd &` ignores SIGINT.
                if signal.getsignal(sig) is not signal.SIG_IGN:
                    self._old[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for sig, old in self._old.items():
            # None: a handler not set from Python, which cannot be put back; the default.
            signal.signal(sig, signal.SIG_DFL if old is None else old)  # type: ignore[arg-type]
        self._old = {}
