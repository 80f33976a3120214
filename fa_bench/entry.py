"""The `fa-bench` console script: imports the app, then runs it.

Importing the app takes a second or more (torch); a Ctrl-C in that time would otherwise
print a KeyboardInterrupt traceback from deep inside torch's import. Nothing has run yet
then, so it is a plain exit 130.
"""

from __future__ import annotations

import sys


def main() -> None:
    try:
        from fa_bench.cli import main as cli_main
    except KeyboardInterrupt:
        print("interrupted while starting: nothing ran", file=sys.stderr)
        sys.exit(130)
    cli_main()
