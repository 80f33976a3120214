"""The `fa-bench` console script: imports the app, then runs it.

Importing the app takes a second or more (torch). A Ctrl-C in that time must not raise
KeyboardInterrupt: raised inside a callback from torch's C++ (pybind11) it is not a
traceback but `terminate called ...` and an abort (exit -6, seen under load). Nothing
has run yet then, so the handler leaves at once with exit 130 and one line; the app
installs its own handling once it runs.
"""

from __future__ import annotations

import os
import signal
from types import FrameType

_NOTE = b"interrupted while starting: nothing ran\n"


def _leave(signum: int, frame: FrameType | None) -> None:
    os.write(2, _NOTE)  # async-signal-safe, unlike print
    os._exit(128 + signum)


def main() -> None:
    previous = signal.signal(signal.SIGINT, _leave)
    try:
        from fa_bench.cli import main as cli_main
    finally:
        signal.signal(signal.SIGINT, previous)
    cli_main()


if __name__ == "__main__":
    main()
