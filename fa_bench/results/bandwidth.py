"""How close a case came to the device's memory bandwidth: the fractions of the HBM peak
and of the run's measured copy bandwidth, the figures of a memory-bound regime (decode).

They are derived, never stored: a record already holds `gbps_model` (bytes model ÷
median latency) and the run's env holds both ceilings, written once by the worker
before the first case (fa_bench/run/worker.py):

- `env.telemetry.gbps_peak_theoretical`: NVML's theoretical HBM bandwidth (memory clock ×
  bus width; 4814 GB/s on an H200), what `fa-bench env` shows as "theoretical HBM";
- `env.telemetry.calibration.gbps_copy`: a device-to-device copy timed over a window,
  read + write bytes ÷ time (about 4.2 TB/s on an H200): what a kernel that only streams
  memory reaches on this card, the ceiling a decode kernel is judged against.

A stored fraction would repeat those two numbers in every record and could disagree with
them (a record edited or re-derived, a ceiling re-measured); derived, each reader (the
terminal summary, results.csv, the report) computes the same value from the same inputs.
A run over several GPUs keeps each part's env under `env.parts` and tags each record
with its part (`rank`): a record is measured against its own GPU's ceilings.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fa_bench.case import Case, Status
from fa_bench.results.record import CaseRecord

__all__ = ["Ceilings", "ceilings", "fractions", "is_decode", "record_env"]


def is_decode(case: Case) -> bool:
    """A decode case (Mode.DECODE): its figures are bandwidth first."""
    return case.mode.value == "decode"


@dataclass(frozen=True)
class Ceilings:
    """A GPU's bandwidth ceilings in GB/s; None where the run did not record one (a CPU
    run, --no-telemetry, NVML without the reading)."""

    hbm_gbps: float | None = None
    copy_gbps: float | None = None


def _positive(value: object) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
    return float(value) if ok else None  # type: ignore[arg-type]


def ceilings(env: dict[str, Any]) -> Ceilings:
    """The ceilings one worker's env recorded. NVML gives the peak as a number or, where it
    cannot, as the reason (a string): only a positive number counts."""
    tel = env.get("telemetry")
    if not isinstance(tel, dict):
        return Ceilings()
    cal = tel.get("calibration")
    cal = cal if isinstance(cal, dict) and cal.get("available") else {}
    # The calibration repeats the peak; describe()'s copy is there even when the copy failed.
    hbm = _positive(tel.get("gbps_peak_theoretical")) or _positive(cal.get("gbps_peak_theoretical"))
    return Ceilings(hbm_gbps=hbm, copy_gbps=_positive(cal.get("gbps_copy")))


def record_env(env: dict[str, Any], record: CaseRecord) -> dict[str, Any]:
    """The env of the worker that measured `record`: its part's in a merged run, else `env`."""
    parts = env.get("parts")
    rank = record.rank
    if isinstance(parts, dict) and rank is not None and isinstance(parts.get(str(rank)), dict):
        return parts[str(rank)]
    return env


def fractions(record: CaseRecord, env: dict[str, Any]) -> tuple[float | None, float | None]:
    """(gbps_model ÷ HBM peak, gbps_model ÷ copy bandwidth) of an ok record, against the
    ceilings of the worker that measured it (`record_env`); None where either is unknown."""
    gbps = record.gbps_model
    if record.status is not Status.OK or gbps is None:
        return None, None
    ceil = ceilings(record_env(env, record))
    hbm = gbps / ceil.hbm_gbps if ceil.hbm_gbps else None
    copy = gbps / ceil.copy_gbps if ceil.copy_gbps else None
    return hbm, copy
