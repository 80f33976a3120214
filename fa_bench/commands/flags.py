"""The flags `fa-bench run` and `fa-bench sweep` share: which cases, where, how timed.

`RunRequest` (commands/run_plan.py) and `SweepRequest` (commands/sweep.py) extend these, so
the two commands select cases (`suite.Overrides.from_flags` reads the same attribute
names) and build their timing the same way. The Typer options behind them are in
commands/options.py; their defaults are the ones here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from pathlib import Path
from typing import ClassVar

from fa_bench.errors import UsageError
from fa_bench.run.limits import DEFAULT_MAX_CASES
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
    seqlens_q: tuple[int, ...] = ()
    seqlens_k: tuple[int, ...] = ()
    page_sizes: tuple[int, ...] = ()  # decode only; 0 = contiguous
    ctx_spreads: tuple[float, ...] = ()  # decode only
    # Issue 19's variants (prefill only): (left, right) windows, ALiBi, softcaps, varlens.
    windows: tuple[tuple[int, int], ...] = ()
    alibi: bool | None = None
    softcaps: tuple[float, ...] = ()
    varlens: tuple[str, ...] = ()
    # Not an axis: how many cases the axes may make before the plan is refused.
    max_cases: int = DEFAULT_MAX_CASES


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
    cpu_threads: int | None = None  # None: run.timing.worker_threads's default
    # A run's case may be a slow peer (naive at a long sequence, a cold cuDNN plan);
    # SweepRequest sets its own, shorter one.
    DEFAULT_TIMEOUT_S: ClassVar[float] = 600.0

    @property
    def case_timeout_s(self) -> float:
        """--timeout, else the command's default."""
        return self.DEFAULT_TIMEOUT_S if self.timeout_s is None else self.timeout_s

    def timing(self, on_cpu: bool, *, gpu_max_time_s: float, **extra: object) -> TimingConfig:
        """The TimingConfig these flags ask for; `extra` sets the run-only fields."""
        self.check_values()
        try:
            config = TimingConfig(
                target_noise=self.target_noise,
                min_samples=self.min_samples,
                min_time_s=0.02 if on_cpu else 0.05,
                max_time_s=self.max_time_s or (1.0 if on_cpu else gpu_max_time_s),
                warmup_ms=default_warmup_ms(on_cpu) if self.warmup_ms is None else self.warmup_ms,
                **extra,  # type: ignore[arg-type]
            )
        except ValueError as exc:  # the flags' values, rejected by TimingConfig's checks
            raise UsageError(str(exc)) from None
        spent_s = config.warmup_ms / 1000 + config.max_time_s
        if spent_s >= self.case_timeout_s:
            # Warm-up and timing alone would reach the time-out: every case would be killed.
            raise UsageError(
                f"--warmup {config.warmup_ms:g} ms + --max-time {config.max_time_s:g} s "
                f"reach --timeout {self.case_timeout_s:g} s: every case would time out; "
                "lower them or raise --timeout"
            )
        return config

    def check_values(self) -> None:
        """Refuse NaN and infinity in any float flag: the CLI's ranges refuse them first;
        this holds for any caller of the command cores."""
        if self.cpu_threads is not None and self.cpu_threads < 1:
            raise UsageError(f"--cpu-threads: {self.cpu_threads} is not a count of threads (>= 1)")
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise UsageError(
                    f"{_FLAG_NAMES.get(f.name, f.name)}: {value} is not a finite number"
                )


_FLAG_NAMES = {
    "timeout_s": "--timeout",
    "target_noise": "--target-noise",
    "max_time_s": "--max-time",
    "warmup_ms": "--warmup",
    "merge_timeout_s": "--merge-timeout",
    "budget_minutes": "--budget-minutes",
    "min_gain_pct": "--min-gain",
}
