"""The attention variants of issue 19, as plain values: sliding windows, ALiBi slopes,
softcapping and packed variable-length batches (their spec strings and lengths), and the
exact count of attended (query, key) pairs under a causal mask and a window.

Semantics follow flash-attn: for query i and key j of one sequence (lengths Sq, Sk,
o = Sk − Sq), j is visible when i + o − left ≤ j ≤ i + o + right, −1 meaning unbounded;
causal sets right to 0. Imports nothing of ours, so `case` and `models` can both use it.
"""

from __future__ import annotations

import hashlib
import math
import random

# −1: that side of the window is unbounded (flash-attn's window_size convention).
UNBOUNDED = -1
VARLEN_UNIFORM = "uniform"
VARLEN_LIST = "list"
VARLEN_FORMS = "'' (equal lengths), 'uniform:LO-HI' or 'list:L1,L2,...'"
# Documents of one packed batch, at most: their lengths are drawn and kept as a tuple.
MAX_DOCUMENTS = 1 << 20


def check_window(name: str, value: object) -> str | None:
    """Why `value` is not one side of a window (an integer >= -1), or None."""
    if isinstance(value, bool) or not isinstance(value, int):
        return f"{name} must be an integer (-1 = unbounded), got {value!r}"
    if value < UNBOUNDED:
        return f"{name} must be -1 (unbounded) or >= 0, got {value}"
    return None


def check_softcap(value: object) -> str | None:
    """Why `value` is not a softcap (0 = off, else a finite positive number), or None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"softcap must be a number (0 = off), got {value!r}"
    if not math.isfinite(value) or value < 0:
        return f"softcap must be 0 (off) or a finite positive number, got {value!r}"
    return None


def parse_varlen(spec: object) -> tuple[str, tuple[int, ...]]:
    """A varlen spec as ("uniform", (LO, HI)), ("list", lengths) or ("", ()).
    Raises ValueError naming varlen, the spec and the valid forms."""
    if not isinstance(spec, str):
        raise ValueError(f"varlen must be a string, one of {VARLEN_FORMS}; got {spec!r}")
    text = spec.strip()
    if not text:
        return "", ()
    kind, sep, rest = text.partition(":")
    kind = kind.strip().lower()
    try:
        if not sep or kind not in (VARLEN_UNIFORM, VARLEN_LIST):
            raise ValueError
        if kind == VARLEN_UNIFORM:
            lo_text, dash, hi_text = rest.partition("-")
            if not dash:
                raise ValueError
            values: tuple[int, ...] = (int(lo_text), int(hi_text))
        else:
            values = tuple(int(part) for part in rest.split(","))
    except ValueError:
        raise ValueError(f"varlen {spec!r} does not parse; use {VARLEN_FORMS}") from None
    if min(values) < 1:
        raise ValueError(f"varlen {spec!r}: every length must be at least 1")
    if kind == VARLEN_UNIFORM and values[0] > values[1]:
        raise ValueError(f"varlen {spec!r}: LO ({values[0]}) is above HI ({values[1]})")
    return kind, values


def canonical_varlen(spec: str) -> str:
    """The one spelling of a spec (no spaces, lower-case kind), so one workload has one id."""
    kind, values = parse_varlen(spec)
    if not kind:
        return ""
    if kind == VARLEN_UNIFORM:
        return f"{VARLEN_UNIFORM}:{values[0]}-{values[1]}"
    return f"{VARLEN_LIST}:" + ",".join(map(str, values))


def varlen_lengths(spec: str, batch: int) -> tuple[int, ...]:
    """The `batch` document lengths of a spec; the same on every machine (a fixed seed per
    batch size). A list spec must name exactly `batch` lengths."""
    kind, values = parse_varlen(spec)
    if kind and batch > MAX_DOCUMENTS:
        raise ValueError(
            f"batch {batch} is too many documents for varlen {spec!r} (at most {MAX_DOCUMENTS})"
        )
    if kind == VARLEN_LIST:
        if len(values) != batch:
            raise ValueError(
                f"varlen {spec!r} lists {len(values)} lengths but batch is {batch}; they must agree"
            )
        return values
    if kind == VARLEN_UNIFORM:
        rng = random.Random(0xD0C + batch)
        return tuple(rng.randint(values[0], values[1]) for _ in range(batch))
    raise ValueError("varlen is '' (equal lengths): no document lengths to draw")


def varlen_id(spec: str) -> str:
    """The id part of a spec: var-u{LO}.{HI} or var-l{n}.{8 hex digits of sha1}."""
    kind, values = parse_varlen(spec)
    if kind == VARLEN_UNIFORM:
        return f"var-u{values[0]}.{values[1]}"
    digest = hashlib.sha1(",".join(map(str, values)).encode()).hexdigest()[:8]
    return f"var-l{len(values)}.{digest}"


def alibi_slopes(heads: int) -> list[float]:
    """ALiBi's per-head slopes (Press et al.; BLOOM's rule for a head count that is not a
    power of two: the slopes of the power below, then every other slope of twice it)."""
    if isinstance(heads, bool) or not isinstance(heads, int) or heads < 1:
        raise ValueError(f"heads must be a positive integer, got {heads!r}")

    def geometric(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    power = 1 << (heads.bit_length() - 1)
    if power == heads:
        return geometric(heads)
    return geometric(power) + geometric(2 * power)[0::2][: heads - power]


def _sum_clamped(first: int, last: int, shift: int, cap: int) -> int:
    """Σ_{x=first}^{last} clamp(x + shift, 0, cap), in closed form."""
    if last < first:
        return 0
    # Linear where 1 <= x + shift <= cap - 1; cap from x + shift >= cap on; 0 below.
    lin_lo, lin_hi = max(first, 1 - shift), min(last, cap - 1 - shift)
    total = 0
    if lin_hi >= lin_lo:
        total += (lin_hi - lin_lo + 1) * (lin_lo + lin_hi + 2 * shift) // 2
    sat_lo = max(first, cap - shift)
    if last >= sat_lo:
        total += (last - sat_lo + 1) * cap
    return total


def window_pairs(
    seqlen_q: int, seqlen_k: int, causal: bool, left: int = UNBOUNDED, right: int = UNBOUNDED
) -> int:
    """The (query, key) pairs of one sequence that attention sees, exactly, in O(1).

    Query i's keys are [i + o − left, i + o + right] ∩ [0, Sk − 1]; its count is
    C(i + o + right) − C(i + o − left − 1) with C(t) = clamp(t + 1, 0, Sk), the keys at or
    below t (exact because left + right >= 0, so the lower edge never passes the upper).
    """
    offset = seqlen_k - seqlen_q
    if causal:
        right = 0
    first, last = offset, offset + seqlen_q - 1  # x = i + o over the rows
    upper = (
        seqlen_q * seqlen_k
        if right == UNBOUNDED
        else _sum_clamped(first, last, right + 1, seqlen_k)
    )
    lower = 0 if left == UNBOUNDED else _sum_clamped(first, last, -left, seqlen_k)
    return upper - lower
