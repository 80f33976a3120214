"""The decode axes of a suite: page sizes and context spreads, and the checks that only
decode groups need (causal, Sq at most 16, contexts at least Sq).

A page or spread axis applies to a group's decode cases only; a suite that has one (in
the file or from a flag) without any decode case is an error, since it would be ignored.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from fa_bench.case import DECODE_MAX_SEQLEN_Q, Mode, check_ctx_spread, check_page_size
from fa_bench.suite.parse import DECODE_AXES, Axes, SuiteError, Where

# (page_size, ctx_spread) of every case that is not decode.
PREFILL_LAYOUT = ((0, 1.0),)


def has_decode(axes: Axes) -> bool:
    return any(Mode(m) is Mode.DECODE for m in axes.get("modes", ()))


def layouts(mode: str | Mode, axes: Axes) -> tuple[tuple[int, float], ...]:
    """The (page_size, ctx_spread) pairs of a mode's cases: the product of the decode axes
    for decode (contiguous and equal lengths where an axis is absent), one pair otherwise."""
    if Mode(mode) is not Mode.DECODE:
        return PREFILL_LAYOUT
    return tuple(
        (p, f) for p in axes.get("page_sizes", (0,)) for f in axes.get("ctx_spreads", (1.0,))
    )


def layout_count(axes: Axes) -> int:
    """Cases per (impl, dtype, head_dim, heads, batch, causal, seqlen) point, all modes."""
    return sum(len(layouts(m, axes)) for m in axes["modes"])


def checked_flag(name: str, flag: str, values: tuple) -> tuple:
    """--page-size or --ctx-spread values, checked (naming the flag) and normalised."""
    check = check_page_size if name == "page_sizes" else check_ctx_spread
    for v in values:
        reason = check(v)
        if reason is not None:
            raise SuiteError(f"{flag}: {v!r} is invalid: {reason}")
    return tuple(float(v) for v in values) if name == "ctx_spreads" else values


def check_decode_group(axes: Axes, where: Where, used: Callable[..., str]) -> None:
    """A group with the decode mode: causal true only, Sq in 1..16, contexts >= Sq.
    `used(*override_names)` says which flags changed the axes, for the message."""
    if not has_decode(axes):
        return
    if False in axes["causal"]:
        raise where.error(
            "key 'causal': decode cases are causal (each new token sees its own prefix); "
            "set causal = true" + used("causal")
        )
    key = "seqlens" if "seqlens" in axes else "seqlens_q"
    seqlens_q: Sequence[int] = axes[key]
    too_long = [s for s in seqlens_q if s > DECODE_MAX_SEQLEN_Q]
    if too_long:
        raise where.error(
            f"key {key!r}: {too_long[0]} new tokens per sequence; decode takes 1 to "
            f"{DECODE_MAX_SEQLEN_Q} (give the contexts in 'seqlens_k')"
            + used("seqlens", "seqlens_q")
        )
    if key == "seqlens_q":
        short = [k for k in axes["seqlens_k"] if k < max(seqlens_q)]
        if short:
            raise where.error(
                f"key 'seqlens_k': a context of {short[0]} is shorter than the "
                f"{max(seqlens_q)} new tokens of 'seqlens_q'; decode needs seqlen_k >= seqlen_q"
                + used("seqlens_q", "seqlens_k")
            )


def check_decode_axes_used(
    grid: Sequence[tuple[Where, Axes]], source: str, flags: dict[str, str], after: str
) -> None:
    """Refuse a page or spread axis where no group has the decode mode. `flags`: the
    decode axes that came from the command line, mapped to their flag; `after`: which
    flags changed the modes, for the message."""
    if any(has_decode(axes) for _, axes in grid):
        return
    for _, axes in grid:
        for key in DECODE_AXES:
            if key in axes:
                what = flags.get(key) or f"key {key!r}"
                raise SuiteError(
                    f"{source}: {what} applies to decode cases only, and no case of the "
                    f"suite has the decode mode{after} (add 'decode' to 'modes', or "
                    "--mode decode)"
                )
