"""Tables that fit the terminal uncut, and the median cells every summary table shows
(fa_bench.console for all cases, fa_bench.console_decode for decode's own table).

A table gets only the columns that fit the console's width at their full length (no_wrap,
min widths), dropping the least needed first; when even the essential ones do not fit, the
caller prints each record as a block of lines.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rich.cells import cell_len
from rich.table import Table
from rich.text import Text

from fa_bench import units
from fa_bench.results.record import CaseRecord

MARK = "*"  # beside a median that stopped at the time limit above the noise target


@dataclass(frozen=True)
class Col:
    name: str
    right: bool = False
    drop: int = 0  # 0: essential; higher numbers are dropped first when the width is short


def _cell_width(cell: str | Text) -> int:
    return cell_len(cell.plain if isinstance(cell, Text) else cell)


def fit_table(
    title: str, cols: Sequence[Col], rows: Sequence[Sequence[str | Text]], width: int
) -> Table | None:
    """A table of the columns that fit `width` uncut, or None when the essential ones do
    not (then the caller prints blocks of lines)."""
    keep = list(range(len(cols)))
    natural = [max([cell_len(c.name)] + [_cell_width(row[i]) for row in rows])
               for i, c in enumerate(cols)]  # fmt: skip
    # The default box: a border before each column and one after, one space each side.
    while sum(natural[i] + 3 for i in keep) + 1 > width:
        droppable = [i for i in keep if cols[i].drop]
        if not droppable:
            return None
        keep.remove(max(droppable, key=lambda i: (cols[i].drop, i)))
    t = Table(title=title)
    for i in keep:
        t.add_column(cols[i].name, justify="right" if cols[i].right else "left",
                     no_wrap=True, min_width=natural[i])  # fmt: skip
    for row in rows:
        t.add_row(*(row[i] for i in keep))
    return t


def median_cell(r: CaseRecord) -> str:
    return units.latency(r.median_ms) + (f" {MARK}" if r.noisy_at_limit else "")


def spread_cell(r: CaseRecord) -> str:
    lat = r.latency_ms
    return "–" if lat is None else f"{units.latency(lat.p20)}–{units.latency(lat.p80)}"
