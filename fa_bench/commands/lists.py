"""One way to pass a list on the command line: the repeated flag or a comma list, or both.

`--seqlen 512 --seqlen 1024`, `--seqlen 512,1024` and `--seqlen 512,1024 --seqlen 2048`
all mean the same. The Typer options behind these take strings (`list[str]`: a comma list
is not an int), and the commands convert them here, so a bad element is one message that
names the flag, the element and what is valid (exit 2), in the same words for `run` and
`sweep`. `--plugin` is not split: a file path may contain a comma.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from enum import Enum

from fa_bench.errors import UsageError


class ListFlagError(UsageError):
    """An element of a list-valued flag that is empty or not one of the valid values."""


def split_items(flag: str, values: Iterable[str] | None) -> tuple[str, ...]:
    """Every element of the flag's values, each value split at commas, in order;
    surrounding spaces dropped. An empty element ('512,,1024', a trailing comma) is an
    error: it is a typo more often than not."""
    items: list[str] = []
    for value in values or ():
        for part in value.split(","):
            item = part.strip()
            if not item:
                raise ListFlagError(f"{flag}: empty element in {value!r}; give values like 'a,b'")
            items.append(item)
    return tuple(items)


def int_items(flag: str, values: Iterable[str] | None) -> tuple[int, ...]:
    """The elements as integers ('512', '1_024' is refused: only plain digits)."""
    out: list[int] = []
    for item in split_items(flag, values):
        digits = item[1:] if item[:1] in "+-" else item
        if not digits.isdigit() or not digits.isascii():
            raise ListFlagError(f"{flag}: {item!r} is not an integer; give integers like 512,1024")
        out.append(int(item))
    return tuple(out)


def choice_items(
    flag: str, values: Iterable[str] | None, choices: type[Enum] | Sequence[str]
) -> tuple[str, ...]:
    """The elements, each one of `choices` (an Enum's values, or the strings): exact
    match, as Typer's own choices are."""
    valid = [str(c.value) for c in choices] if isinstance(choices, type) else list(choices)
    items = split_items(flag, values)
    for item in items:
        if item not in valid:
            raise ListFlagError(
                f"{flag}: {item!r} is not one of: {', '.join(valid)} "
                "(repeat the flag or give a comma list)"
            )
    return items


def metavar(choices: type[Enum] | Sequence[str]) -> str:
    """The help's placeholder for a comma list of these choices: 'fwd|bwd|fwd_bwd[,...]'."""
    valid = [str(c.value) for c in choices] if isinstance(choices, type) else list(choices)
    return "|".join(valid) + "[,...]"


def page_size_items(flag: str, values: Iterable[str] | None) -> tuple[int, ...]:
    """Page sizes: integers, or 'none' for a contiguous cache (read as 0); the range is
    the suite's check (it names the flag too)."""
    items = split_items(flag, values)
    ints = [i for i in items if i.lower() != "none"]
    parsed = iter(int_items(flag, ints))  # refuses a non-integer in the same words
    return tuple(0 if i.lower() == "none" else next(parsed) for i in items)


def float_items(flag: str, values: Iterable[str] | None) -> tuple[float, ...]:
    """The elements as finite decimal numbers ('0.25', '1'); 'nan', 'inf' are refused."""
    out: list[float] = []
    for item in split_items(flag, values):
        try:
            value = float(item)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or not item.isascii():
            raise ListFlagError(f"{flag}: {item!r} is not a number; give numbers like 0.25,1")
        out.append(value)
    return tuple(out)


INTS = "N[,N...]"  # the help's placeholder for a comma list of integers
