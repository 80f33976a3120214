"""Counted nouns in messages: "1 case", "2 cases", "1 entry", "3 entries" (never "run(s)").

Irregular plurals are given by the caller (`plural(n, "entry", "entries")`); the rest take
an "s". Used wherever a message counts something the user sees.
"""

from __future__ import annotations


def plural(count: int, noun: str, many: str | None = None) -> str:
    """`count` and the noun in the right number: plural(1, "run") == "1 run"."""
    word = noun if count == 1 else (many if many is not None else noun + "s")
    return f"{count} {word}"
