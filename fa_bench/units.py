"""Figures with units that scale, for the terminal: 81.2 µs, 1.20 GFLOP/s, 3.4 TB/s.

Results files keep their fixed units (`latency_ms`, `tflops`, `gbps_model`); only what is
shown scales, so a CPU run's 2.5e-05 TFLOP/s reads as 25.0 GFLOP/s and its 0.4 GB/s is
not rounded to 0. Every function takes the figure in the results file's unit and returns
a short string with three significant digits (never an exponent), or NONE for None.
"""

from __future__ import annotations

import math

NONE = "–"

# (factor from the base unit, prefix), largest first
_SECONDS = ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs"), (1e-9, "ns"))
_RATE_PREFIXES = ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"), (1.0, ""))


def _three_digits(x: float) -> str:
    """`x` (>= 0 and < 1000 after scaling) with three significant digits, no exponent."""
    if x >= 100:
        return f"{x:.0f}"
    if x >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"


def _scaled(value: float, steps: tuple[tuple[float, str], ...], unit: str) -> str:
    if not math.isfinite(value):
        return f"{value} {unit}".strip()
    sign, mag = ("-" if value < 0 else ""), abs(value)
    for factor, prefix in steps:
        # 0.9995: a figure that would round to "1000" here shows as "1.00" one step up
        if mag >= factor * 0.9995 or factor == steps[-1][0]:
            return f"{sign}{_three_digits(mag / factor)} {prefix}{unit}"
    raise AssertionError("unreachable: the last step always matches")


def latency(ms: float | None) -> str:
    """A latency given in milliseconds: '812 ns', '81.2 µs', '1.20 ms', '2.50 s'."""
    if ms is None:
        return NONE
    if ms == 0:
        return "0 s"
    return _scaled(ms / 1e3, _SECONDS, "")


def flops(tflops: float | None) -> str:
    """A throughput given in TFLOP/s: '25.0 GFLOP/s', '664 TFLOP/s', '1.20 PFLOP/s'."""
    if tflops is None:
        return NONE
    if tflops == 0:
        return "0 FLOP/s"
    return _scaled(tflops * 1e12, _RATE_PREFIXES, "FLOP/s")


def bandwidth(gbps: float | None) -> str:
    """A bandwidth given in GB/s (10^9 bytes): '412 MB/s', '3.35 TB/s'."""
    if gbps is None:
        return NONE
    if gbps == 0:
        return "0 B/s"
    return _scaled(gbps * 1e9, _RATE_PREFIXES, "B/s")


def mebibytes(nbytes: float | None) -> str:
    """A size in bytes as MiB or GiB: '12.0 MiB', '1.50 GiB', '512 KiB'."""
    if nbytes is None:
        return NONE
    mag = abs(nbytes)
    for factor, unit in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if mag >= factor:
            return f"{'-' if nbytes < 0 else ''}{_three_digits(mag / factor)} {unit}"
    return f"{nbytes:.0f} B"


def percent(fraction: float | None) -> str:
    """A fraction as a percentage: 0.0123 -> '1.2%'."""
    if fraction is None:
        return NONE
    return f"{fraction * 100:.1f}%" if abs(fraction) < 0.1 else f"{fraction * 100:.0f}%"


def duration(seconds: float) -> str:
    """Elapsed or remaining time: '0:07', '12:03', '1:02:03'."""
    s = max(0, round(seconds))
    h, rest = divmod(s, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"
