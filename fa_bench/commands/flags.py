"""The flags `fa-bench run` and `fa-bench sweep` share: which cases, where, how timed.

`RunRequest` (commands/run.py) and `SweepRequest` (commands/sweep.py) extend these, so
the two commands select cases (`suite.Overrides.from_flags` reads the same attribute
names) and build their timing the same way. The Typer options behind them are in
commands/options.py; their defaults are the ones here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from fa_bench.errors import UsageError
from fa_bench.run.timing import TimingConfig, default_warmup_ms


@dataclass(frozen=True)
class CaseFlags:
    """Axes given on the command line; empty (or None) keeps the suite's axis."""

    suites: tuple[str, ...] = ()
    modes: tuple[str, ...] = ()
    dtypes: tuple[str, ...] = ()
    seqlens: tuple[int, ...] = ()
    head_dims: tuple[int, ...] = ()
    batch: tuple[int, ...] = ()
    heads: tuple[int, ...] = ()
    kv_heads: tuple[int, ...] = ()
    causal: bool | None = None


@dataclass(frozen=True)
class MeasureFlags:
    """Where the cases run and how each is timed."""

    device: str = "auto"
    gpu: int | None = None
    out: Path | None = None
    timeout_s: float | None = None  # None: the command's DEFAULT_TIMEOUT_S
    target_noise: float = 0.01
    min_samples: int = 10
    max_time_s: float | None = None  # None: 1 s on CPU, the command's own GPU default
    warmup_ms: float | None = None  # None: default_warmup_ms for the device
    # A run's case may be a slow peer (naive at a long sequence, a cold cuDNN plan);
    # SweepRequest sets its own, shorter one.
    DEFAULT_TIMEOUT_S: ClassVar[float] = 600.0

    @property
    def case_timeout_s(self) -> float:
        """--timeout, else the command's default."""
        return self.DEFAULT_TIMEOUT_S if self.timeout_s is None else self.timeout_s

    def timing(self, on_cpu: bool, *, gpu_max_time_s: float, **extra: object) -> TimingConfig:
        """The TimingConfig these flags ask for; `extra` sets the run-only fields."""
        try:
            return TimingConfig(
                target_noise=self.target_noise,
                min_samples=self.min_samples,
                min_time_s=0.02 if on_cpu else 0.05,
                max_time_s=self.max_time_s or (1.0 if on_cpu else gpu_max_time_s),
                warmup_ms=default_warmup_ms(on_cpu) if self.warmup_ms is None else self.warmup_ms,
                **extra,  # type: ignore[arg-type]
            )
        except ValueError as exc:  # the flags' values, rejected by TimingConfig's checks
            raise UsageError(str(exc)) from None
