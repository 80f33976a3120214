"""`run`'s flags for issue 19's variants (windows, ALiBi, softcap, packed batches), and
their conversion from the strings Typer hands over; the ranges are the suite's checks,
which name the flag (exit 2)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Any

from fa_bench.commands.lists import ListFlagError, float_items
from fa_bench.commands.options import CASES, opt
from fa_bench.suite.variants import window_flag

Windows = Annotated[
    list[str] | None,
    opt(
        "--window",
        panel=CASES,
        metavar="LEFT,RIGHT",
        help="Sliding window: key j visible to query i when i-LEFT <= j <= i+RIGHT "
        "(bottom-right aligned; -1 or inf = unbounded; none = no window); repeatable.",
    ),
]
Alibi = Annotated[
    bool | None,
    opt(
        "--alibi/--no-alibi",
        panel=CASES,
        help="Only cases with ALiBi (the geometric slopes of the query heads), or only "
        "without (default: the suite's).",
    ),
]
Softcaps = Annotated[
    list[str] | None,
    opt(
        "--softcap",
        panel=CASES,
        metavar="C[,C...]",
        help="Logit softcap c·tanh(s/c) (0 = off); repeatable or a comma list.",
    ),
]
Varlens = Annotated[
    list[str] | None,
    opt(
        "--varlen",
        panel=CASES,
        metavar="SPEC",
        help="Packed batches of documents: uniform:LO-HI (batch lengths drawn in "
        "[LO, HI]), list:L1,L2,... (those lengths; batch = their count) or none "
        "(equal lengths); repeatable.",
    ),
]


def window_items(flag: str, values: Iterable[str] | None) -> tuple[tuple[int, int], ...]:
    """--window values: each one window (its comma separates left and right)."""
    out = []
    for value in values or ():
        try:
            out.append(window_flag(value))
        except ValueError as exc:
            raise ListFlagError(f"{flag}: {exc}") from None
    return tuple(out)


def variant_axes(
    window: list[str] | None, alibi: bool | None, softcap: list[str] | None,
    varlen: list[str] | None,
) -> dict[str, Any]:  # fmt: skip
    """The variant fields of a RunRequest from run's flags."""
    return {
        "windows": window_items("--window", window),
        "alibi": alibi,
        "softcaps": float_items("--softcap", softcap),
        "varlens": tuple("" if v.strip().lower() == "none" else v for v in varlen or ()),
    }
