"""`fa-bench run --json`: the run's summary as one JSON document on stdout.

The human output goes to stderr meanwhile, so `fa-bench run --json | jq` reads only this.
Figures keep the results file's units and keys (`median_ms`, `tflops`, `gbps_model`), so
a script reads the summary and results.json alike.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from fa_bench.console import NOT_RUN
from fa_bench.results.bandwidth import fractions, is_decode
from fa_bench.results.record import CaseRecord

SUMMARY_VERSION = 1


def _case(r: CaseRecord, env: dict[str, Any]) -> dict[str, Any]:
    lat = r.latency_ms
    # Decode is memory-bound: its fractions of the GPU's ceilings, as results.csv has them.
    decode = dict(zip(("hbm_fraction", "copy_fraction"), fractions(r, env), strict=True))
    return {
        "id": r.id,
        "impl": r.impl,
        "status": r.status.value,
        "median_ms": r.median_ms,
        "p20_ms": lat.p20 if lat else None,
        "p80_ms": lat.p80 if lat else None,
        "noise": lat.noise if lat else None,
        "tflops": r.tflops,
        "gbps_model": r.gbps_model,
        "peak_mem_bytes": r.peak_mem_bytes,
        "max_abs_err": (r.accuracy or {}).get("max_abs_err"),
        "noisy_at_limit": r.noisy_at_limit,
        "error": (r.error or "").strip().splitlines()[0] if r.error else None,
        **(decode if is_decode(r.case) else {}),
    }


def summary_doc(
    records: Sequence[CaseRecord],
    *,
    out: Path,
    total: int,
    written: dict[str, Path | None],
    exit_code: int,
    interrupted: bool,
    missing: Sequence[int] = (),
    env: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The summary: files written, counts by status, why cases did not run, each case
    (a decode case with its fractions of the ceilings in `env`, the run's)."""
    not_run = Counter(
        (r.impl, r.status.value, (r.error or "").strip().splitlines()[0] if r.error else "")
        for r in records
        if r.status.value in NOT_RUN
    )
    return {
        "summary_version": SUMMARY_VERSION,
        "out": str(out),
        "files": {k: (str(v) if v is not None else None) for k, v in written.items()},
        "exit_code": exit_code,
        "interrupted": interrupted,
        "resume_command": f"fa-bench run --resume {out}" if interrupted else None,
        "planned": total,
        "recorded": len(records),
        "missing_parts": list(missing),
        "counts": dict(sorted(Counter(r.status.value for r in records).items())),
        "not_run": [
            {"impl": i, "status": s, "reason": why, "cases": n}
            for (i, s, why), n in not_run.items()
        ],
        "noisy_at_limit": sum(r.noisy_at_limit for r in records),
        "cases": [_case(r, env or {}) for r in records],
    }


def write_summary(stream: TextIO, doc: dict[str, Any]) -> None:
    """One JSON document and a newline; NaN and infinities as null (jq rejects them)."""
    stream.write(json.dumps(_finite(doc), indent=2, ensure_ascii=False) + "\n")
    stream.flush()


def _finite(value: Any) -> Any:
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value
