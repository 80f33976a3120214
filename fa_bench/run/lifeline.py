"""The worker's tie to the runner that started it: a worker never outlives its runner.

The runner stops its worker itself (at the end, after a timeout, on a stop signal). When
the runner dies without doing so (SIGKILL, a crash, the OOM killer), the worker must not
run on under PID 1 until its case ends. Three ties, any one of which suffices:

- Linux: prctl(PR_SET_PDEATHSIG, SIGKILL), so the kernel kills the worker when its parent
  dies. Strictly it fires when the parent *thread* that started the worker exits; the
  runner starts a worker from the thread that drives it (the main thread, or a part's
  thread under --gpus) and closes it before that thread ends, so only the runner's death
  fires it.
- a watchdog thread, anywhere: getppid() is no longer the parent seen at start (the
  worker was reparented) -> exit.
- the protocol: the runner's end of the worker's stdin closes when it dies; a reader
  thread sees EOF even while the main thread is busy with a case -> exit.

The exit is quiet (os._exit, no traceback, no BrokenPipeError): nobody is left to read.
The worker does not stop on SIGINT, SIGTERM or SIGHUP (a handler that does nothing): a
scheduler that signals every process of a job must not kill it mid-case, which the runner
would record as the case's error, before the runner has stopped the run;
the runner kills it (SIGKILL) when it stops, and the ties above cover a runner that died.
"""

from __future__ import annotations

import ctypes
import os
import queue
import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType
from typing import NoReturn, TextIO

from fa_bench.run.interrupts import STOP_SIGNALS

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
ORPHAN_EXIT = 0  # nobody reads it: the runner is gone
POLL_S = 0.5


def set_death_signal(sig: int = signal.SIGKILL) -> bool:
    """Ask Linux to send `sig` when the parent dies; False where that is not available."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def _unheeded(signum: int, frame: FrameType | None) -> None:
    """A stop signal that reached the worker: the runner decides, and stops it."""


def quit_quietly() -> NoReturn:
    """Leave at once: no atexit handlers, no flush of a pipe whose reader is gone."""
    os._exit(ORPHAN_EXIT)


class Lifeline:
    """Ties this process to `parent_pid` (the runner) and reads the runner's messages
    (stdin lines) on a thread, so that the end of the runner is seen even mid-case."""

    def __init__(self, parent_pid: int | None, stdin: TextIO | None = None) -> None:
        self.parent_pid = parent_pid
        # The watched parent is the one seen now: the runner, or a launcher between the
        # two (a Windows venv's python.exe starts the real interpreter as its child).
        self._ppid = os.getppid()
        self._stdin = stdin if stdin is not None else sys.stdin
        self._lines: queue.Queue[str] = queue.Queue()

    def start(self) -> Lifeline:
        for sig in STOP_SIGNALS:
            # A handler that does nothing, not SIG_IGN: an ignored signal stays ignored
            # across exec, so the compilers and compile pools the worker starts could not
            # be stopped with SIGTERM; a handler is reset to the default there.
            signal.signal(sig, _unheeded)
        set_death_signal()
        # The runner may have died before prctl was set (the worker starts in ~0.1 s).
        if self._runner_gone_already():
            quit_quietly()
        threading.Thread(target=self._watch, name="lifeline-watchdog", daemon=True).start()
        threading.Thread(target=self._read, name="lifeline-reader", daemon=True).start()
        return self

    def parent_gone(self) -> bool:
        return os.getppid() != self._ppid

    def _runner_gone_already(self) -> bool:
        """The runner died before prctl took hold (the worker was already reparented).
        POSIX only: Windows' os.kill would terminate the process it asks about. The
        reader's EOF covers this too; this check just does not wait for the first read."""
        if self.parent_pid is None or self._ppid == self.parent_pid or os.name != "posix":
            return False
        try:
            os.kill(self.parent_pid, 0)
        except ProcessLookupError:
            return True
        except OSError:
            return False  # alive, someone else's (EPERM): a launcher stands between
        return False

    def _watch(self) -> None:
        event = threading.Event()
        while not event.wait(POLL_S):
            if self.parent_gone():
                quit_quietly()

    def _read(self) -> None:
        try:
            for line in self._stdin:
                self._lines.put(line)
        except (OSError, ValueError):
            pass
        # EOF: the runner closed its end or died; it sends {"op": "exit"} to end a worker
        # it still needs to hear from, so nothing more can come and nobody would read on.
        quit_quietly()

    def messages(self) -> Iterator[str]:
        """The runner's lines, one at a time, as the main thread asks for them."""
        while True:
            yield self._lines.get()  # at EOF the reader ends the process instead
