"""The one base class of the user's mistakes, and the one way to report them.

Anything raised as a `UsageError` (a bad flag, suite key, results file, output folder, ...)
is the user's to fix: the CLI prints its message and exits 2. Any other exception is a
bug in fa-bench: exit 1 with a short message (the traceback under `--debug`).
"""

from __future__ import annotations

from typing import Protocol

from rich.text import Text

USAGE_EXIT = 2  # the user's mistake (Typer's own usage errors exit 2 too)
BUG_EXIT = 1


class UsageError(Exception):
    """Bad input, named in the message (the file, key or flag, and the valid choices)."""


class _Printer(Protocol):
    def print(self, *objects: object, highlight: bool | None = ...) -> None: ...


def print_error(err_console: _Printer, message: object, code: int = USAGE_EXIT) -> int:
    """Print `error: <message>` on the error console; returns `code` for the caller to exit
    with. The message is data (paths, keys, exception text), never Rich markup: a Text is
    printed as is, so `[red]` or `[/x]` in it shows literally and cannot raise."""
    err_console.print(Text.assemble(("error:", "bold red"), " ", str(message)), highlight=False)
    return code
