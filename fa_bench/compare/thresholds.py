"""What `fa-bench compare` measures and how strictly: the metric, the thresholds of the
decision rule (`fa_bench.compare.core`'s docstring), their presets and `--threshold` text.

`fa_bench.compare.core` re-exports these names, where the commands and tests import them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum

from fa_bench.compare.match import CompareError


class Metric(str, Enum):
    LATENCY = "latency"
    TFLOPS = "tflops"
    GBPS = "gbps"
    PEAK_MEM = "peak_mem"

    @property
    def higher_is_better(self) -> bool:
        return self in (Metric.TFLOPS, Metric.GBPS)

    @property
    def unit(self) -> str:
        return {"latency": "ms", "tflops": "TFLOP/s", "gbps": "GB/s", "peak_mem": "MiB"}[self.value]


@dataclass(frozen=True)
class Thresholds:
    """Relative thresholds per metric (0.05 = 5%), the test's significance level, and the
    fewest samples per side for a timing change to count."""

    latency: float = 0.05
    tflops: float = 0.05
    gbps: float = 0.05
    peak_mem: float = 0.05
    alpha: float = 0.01
    min_samples: int = 5

    def __post_init__(self) -> None:
        for m in Metric:
            value = getattr(self, m.value)
            if not (isinstance(value, (int, float)) and 0 < value < 100):
                raise ValueError(f"threshold for {m.value} must be in (0, 100), got {value!r}")
        if not 0 < self.alpha < 1:
            raise ValueError(f"alpha must be in (0, 1), got {self.alpha!r}")
        if self.min_samples < 2:
            raise ValueError(f"min_samples must be at least 2, got {self.min_samples!r}")

    def of(self, metric: Metric) -> float:
        return getattr(self, metric.value)


# strict catches 2% on quiet dedicated GPUs; permissive suits shared or throttling hosts.
PRESETS: dict[str, Thresholds] = {
    "default": Thresholds(),
    "strict": Thresholds(latency=0.02, tflops=0.02, gbps=0.02, peak_mem=0.01, alpha=0.05),
    "permissive": Thresholds(latency=0.10, tflops=0.10, gbps=0.10, peak_mem=0.10, alpha=0.001),
}


def parse_threshold(text: str) -> tuple[Metric | None, float]:
    """'5%' or '0.05' (for the compared metric) or 'peak_mem=10%' (for one metric)."""
    metric: Metric | None = None
    value = text.strip()
    if "=" in value:
        name, value = (s.strip() for s in value.split("=", 1))
        try:
            metric = Metric(name)
        except ValueError:
            valid = ", ".join(m.value for m in Metric)
            raise CompareError(
                f"--threshold {text!r}: {name!r} is not a metric (valid: {valid})"
            ) from None
    percent = value.endswith("%")
    try:
        number = float(value[:-1] if percent else value)
    except ValueError:
        raise CompareError(
            f"--threshold {text!r}: write a percentage (5%) or a fraction (0.05)"
        ) from None
    fraction = number / 100 if percent else number
    if not percent and number >= 1:
        raise CompareError(f"--threshold {text!r}: did you mean {number:g}%? (a fraction is < 1)")
    if not 0 < fraction < 100 or not math.isfinite(fraction):
        raise CompareError(f"--threshold {text!r}: must be above 0%")
    return metric, fraction


def thresholds_from(preset: str, overrides: Iterable[str], metric: Metric) -> Thresholds:
    """A preset with `--threshold` overrides applied; a bare value sets `metric`'s."""
    if preset not in PRESETS:
        raise CompareError(f"--preset {preset!r} is not one of: {', '.join(PRESETS)}")
    values = {m.value: PRESETS[preset].of(m) for m in Metric}
    for text in overrides:
        which, fraction = parse_threshold(text)
        values[(which or metric).value] = fraction
    base = PRESETS[preset]
    return Thresholds(**values, alpha=base.alpha, min_samples=base.min_samples)
