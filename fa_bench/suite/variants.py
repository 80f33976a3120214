"""The variant axes of a suite (issue 19): windows, alibi, softcaps and varlens.

A variant axis applies to a group's prefill cases (fwd, bwd, fwd_bwd); decode cases take
only dense attention, so a group whose only mode is decode may not set one to anything
else. A packed (varlen) case replaces the group's sequence lengths with its documents':
its batch is the document count (a list spec's count; with `tokens`, a uniform spec's
count that makes about that many tokens; else `batch`), and seqlen_q = seqlen_k = the
longest document.

This module imports nothing of the suite's own (`parse` checks the axes with it), so its
checks raise ValueError with the reason, and the caller names the file, key or flag.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from fa_bench import variants
from fa_bench.case import Mode

VARIANT_AXES = ("windows", "alibi", "softcaps", "varlens")
WINDOW_HINT = "give [left, right] pairs like [[4096, 0], [-1, -1]] (-1 = unbounded)"


class Point(NamedTuple):
    """One variant of a case: the Case fields of the four axes."""

    window_left: int = -1
    window_right: int = -1
    alibi: bool = False
    softcap: float = 0.0
    varlen: str = ""


DENSE = Point()


def _window(item: object) -> tuple[int, int]:
    if not isinstance(item, (list, tuple)) or len(item) != 2:
        raise ValueError(f"{item!r} is not a window; {WINDOW_HINT}")
    for name, value in zip(("left", "right"), item, strict=True):
        reason = variants.check_window(name, value)
        if reason:
            raise ValueError(f"{list(item)!r}: {reason}")
    return int(item[0]), int(item[1])


def _softcap(item: object) -> float:
    reason = variants.check_softcap(item)
    if reason:
        raise ValueError(reason)
    return float(item)  # type: ignore[arg-type]


def _alibi(item: object) -> bool:
    if not isinstance(item, bool):
        raise ValueError(f"expected true, false or a list of them, got {item!r}")
    return item


def axis_values(key: str, items: Sequence[object]) -> tuple:
    """A variant axis's values, checked and normalised (canonical varlen specs, float
    softcaps, (left, right) tuples); ValueError with the reason for the first bad one."""
    check: Any = {
        "windows": _window,
        "alibi": _alibi,
        "softcaps": _softcap,
        "varlens": variants.canonical_varlen,
    }[key]
    return tuple(check(item) for item in items)


def points(mode: str | Mode, axes: dict[str, tuple]) -> tuple[Point, ...]:
    """The variants of a mode's cases: the product of the axes for the prefill modes
    (dense where an axis is absent), dense attention alone for decode."""
    if Mode(mode) is Mode.DECODE:
        return (DENSE,)
    return tuple(
        Point(left, right, alibi, cap, spec)
        for left, right in axes.get("windows", ((-1, -1),))
        for alibi in axes.get("alibi", (False,))
        for cap in axes.get("softcaps", (0.0,))
        for spec in axes.get("varlens", ("",))
    )


def check_group(axes: dict[str, tuple]) -> str | None:
    """Why a group's variant axes would be ignored (only decode modes, and an axis set to
    something other than dense), or None."""
    if any(Mode(m) is not Mode.DECODE for m in axes.get("modes", ())):
        return None
    for key in (k for k in VARIANT_AXES if k in axes):
        if any(p != DENSE for p in points(Mode.FWD, {key: axes[key]})):
            return f"key {key!r} applies to fwd, bwd and fwd_bwd cases; the group has decode only"
    return None


def shape(
    point: Point, size: int, by_tokens: bool, seqlen_q: int, seqlen_k: int
) -> tuple[int, int, int]:
    """(batch, seqlen_q, seqlen_k) of a case: the group's for equal lengths; a packed
    case's document count and longest document (see the module's docstring)."""
    if not point.varlen:
        batch = max(1, size // seqlen_q) if by_tokens else size
        return batch, seqlen_q, seqlen_k
    kind, values = variants.parse_varlen(point.varlen)
    if kind == variants.VARLEN_LIST:
        batch = len(values)
    elif by_tokens:
        batch = max(1, round(2 * size / (values[0] + values[1])))
    else:
        batch = size
    longest = max(variants.varlen_lengths(point.varlen, batch))
    return batch, longest, longest


def window_flag(value: str) -> tuple[int, int]:
    """One --window value, "L,R" (-1 or inf: unbounded) or "none" (no window)."""
    text = value.strip().lower()
    if text == "none":
        return -1, -1
    parts = [p.strip() for p in text.split(",")]
    if len(parts) != 2:
        raise ValueError(f"{value!r} is not LEFT,RIGHT (like 4096,0; -1 or inf = unbounded)")
    out = []
    for part in parts:
        digits = part[1:] if part[:1] in "+-" else part
        if part == "inf":
            out.append(-1)
        elif digits.isdigit() and digits.isascii():
            out.append(int(part))
        else:
            raise ValueError(f"{value!r}: {part!r} is not an integer (-1 or inf = unbounded)")
    return _window(out)
