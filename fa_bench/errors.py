"""The one base class of the user's mistakes.

Anything raised as a `UsageError` (a bad flag, suite key, results file, output folder, ...)
is the user's to fix: the CLI prints its message and exits 2. Any other exception is a
bug in fa-bench: exit 1 with a short message (the traceback under `--debug`).
"""

from __future__ import annotations


class UsageError(Exception):
    """Bad input, named in the message (the file, key or flag, and the valid choices)."""
