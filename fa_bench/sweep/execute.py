"""Run a block-size sweep: every point through the runner's worker, then sweep.json.

Each point is a case plus a kernel config sent to the worker (`options.config`), so it is
measured by the same engine as `fa-bench run` (accuracy check first, then timing) and a
config that crashes or hangs is a recorded `error`/`timeout`. Compilation happens in the
builder, outside the timed span; its wall time is the row's `compile_s`.

sweep.json = {"schema": "fa-bench-sweep/1", "run", "env", "space", "rows", "cases"}:
one row per case × config (pruned configs included, with their reason), and per case a
summary (best config, default config, gain of the best over the default).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from fa_bench.case import Case
from fa_bench.errors import UsageError
from fa_bench.results.files import JOURNAL, append_json_line, sanitize
from fa_bench.results.record import CaseRecord
from fa_bench.run.runner import CaseRunner, RunOptions
from fa_bench.sweep.space import Point
from fa_bench.sweep.vocab import fields_kernel, row_config

SCHEMA = "fa-bench-sweep/1"
SWEEP_JSON = "sweep.json"
PointEvent = Callable[[str, Point, dict | None], None]


def _row(point: Point, **fields: object) -> dict:
    case = point.case
    row = {
        "id": point.id,
        "case_id": case.id,
        **case.to_dict(),
        "config": row_config(point.fields),
        "fields": dict(point.fields),
        "kernel": fields_kernel(point.fields),
        "label": point.label,
        "is_default": point.is_default,
        "rules": list(point.rules),
        "status": "pruned" if point.pruned else None,
        "error": point.pruned,
        "tflops": None,
        "latency_ms": None,
        "compile_s": None,
        "prepare_s": None,
        "accuracy_passed": None,
        "backend": None,
        "wall_s": None,
    }
    row.update(fields)
    return row


def _from_record(point: Point, record: CaseRecord, wall_s: float, built: dict | None) -> dict:
    acc = record.accuracy or {}
    # With the parallel compile phase (fa_bench.sweep.precompile) the build happened there;
    # the worker's own build (`prepare_s`) was then a load from Triton's cache.
    return _row(
        point,
        status=record.status.value,
        error=record.error,
        tflops=record.tflops,
        latency_ms=record.latency_ms.to_json() if record.latency_ms is not None else None,
        compile_s=built["compile_s"] if built else record.prepare_s,
        prepare_s=record.prepare_s,
        accuracy_passed=acc.get("passed") if acc else None,
        backend=record.backend,
        wall_s=round(wall_s, 3),
    )


def execute_points(
    points: Sequence[Point],
    out_dir: Path,
    opts: RunOptions,
    *,
    budget_s: float | None = None,
    on_event: PointEvent | None = None,
    built: dict[str, dict] | None = None,
) -> tuple[list[dict], dict | None, str | None]:
    """Measure the points; returns (rows, worker env, stop reason or None).

    Pruned points become rows without running. The budget is checked before each point,
    so the sweep stops between points and keeps every row measured so far; a
    KeyboardInterrupt stops it the same way ("interrupted").
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    runner = CaseRunner(opts, out_dir)
    stop: str | None = None
    start = time.monotonic()
    try:
        for point in points:
            if point.pruned:
                rows.append(_row(point))
                append_json_line(out_dir / JOURNAL, rows[-1])
                continue
            if budget_s is not None and time.monotonic() - start >= budget_s:
                stop = "budget"
                break
            if on_event:
                on_event("start", point, None)
            record = runner.run(point.case, {"config": dict(point.fields)})
            # The runner has placed the record, so wall_s is set.
            row = _from_record(point, record, record.wall_s or 0.0, (built or {}).get(point.id))
            rows.append(row)
            append_json_line(out_dir / JOURNAL, row)
            if on_event:
                on_event("done", point, row)
    except KeyboardInterrupt:
        stop = "interrupted"
    finally:
        runner.close(kill=stop == "interrupted")
    env = runner.env
    return rows, env, stop


def summarize_cases(rows: Sequence[dict]) -> list[dict]:
    """Per case: the best ok config, the default's, the gain, and the config counts."""
    by_case: dict[str, list[dict]] = {}
    for r in rows:
        by_case.setdefault(r["case_id"], []).append(r)
    out = []
    for case_id, rs in by_case.items():
        ok = sorted((r for r in rs if r["status"] == "ok" and r["tflops"]),
                    key=lambda r: -r["tflops"])  # fmt: skip
        default = next((r for r in rs if r["is_default"]), None)
        best = ok[0] if ok else None
        d_tf = default["tflops"] if default and default["status"] == "ok" else None
        counts: dict[str, int] = {}
        for r in rs:
            counts[r["status"]] = counts.get(r["status"], 0) + 1
        out.append({
            "case_id": case_id,
            "kernel": rs[0].get("kernel", "tl"),  # rows before the Gluon sweep: tl
            "best": best["label"] if best else None,
            "best_config": best["config"] if best else None,
            "best_fields": best["fields"] if best else None,
            "best_tflops": best["tflops"] if best else None,
            "default": default["label"] if default else None,
            "default_tflops": d_tf,
            "gain_over_default": (best["tflops"] / d_tf - 1) if best and d_tf else None,
            "counts": counts,
        })  # fmt: skip
    return out


def build_doc(run: dict, env: dict, space: dict, rows: Sequence[dict]) -> dict:
    return {"schema": SCHEMA, "run": run, "env": env, "space": space, "rows": list(rows),
            "cases": summarize_cases(rows)}  # fmt: skip


def write_doc(out_dir: Path, doc: dict) -> Path:
    path = Path(out_dir) / SWEEP_JSON
    path.write_text(json.dumps(sanitize(doc), indent=1, allow_nan=False), encoding="utf-8")
    return path


class SweepFileError(UsageError, ValueError):
    pass


def load_sweep(path: Path) -> dict:
    """Read and check a sweep.json (its schema and the keys the report reads)."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise SweepFileError(f"{path}: cannot read it: {exc}") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise SweepFileError(f"{path}: not a {SCHEMA} file")
    for key in ("run", "env", "space", "rows", "cases"):
        if key not in doc:
            raise SweepFileError(f"{path}: missing key {key!r}")
    return doc


def best_entries(
    doc: dict, gpu: str, source: str, saved: str, min_gain: float = 0.0
) -> tuple[list[dict], list[tuple]]:
    """Tuning cache entries from a sweep: per case its best ok config (accuracy passed),
    and the keys where the heuristic stays because the best beat it by less than
    `min_gain` (a fraction): differences that small are within run-to-run noise.

    Two cases with the same key (same seqlen bucket, e.g. different batch) keep the one
    with the longest sequence, the one a bucket's larger runs resemble most.
    """
    from fa_bench.sweep.tuning import entry_key, seqlen_bucket

    rows = {r["case_id"]: r for r in doc["rows"]}
    chosen: dict[tuple, tuple[dict, float | None]] = {}
    for c in doc["cases"]:
        if not c["best_fields"]:
            continue
        r = rows[c["case_id"]]
        seqlen = Case.from_dict(r).max_seqlen
        entry = {
            "gpu": gpu, "dtype": r["dtype"], "head_dim": r["head_dim"], "causal": r["causal"],
            "mode": r["mode"], "seqlen_bucket": seqlen_bucket(seqlen),
            "config": c["best_fields"], "tflops": c["best_tflops"],
            "default_tflops": c["default_tflops"], "seqlen": seqlen, "source": source,
            "saved": saved,
        }  # fmt: skip
        if fields_kernel(c["best_fields"]) == "gluon":  # a `tl` entry keeps the old shape
            entry["kernel"] = "gluon"
        key = entry_key(entry)
        if key not in chosen or chosen[key][0]["seqlen"] <= seqlen:
            chosen[key] = (entry, c["gain_over_default"])
    # No gain (the default failed, so there is nothing to compare with) keeps the entry.
    keep = [e for e, gain in chosen.values() if gain is None or gain >= min_gain]
    heuristic = [k for k, (_, gain) in chosen.items() if gain is not None and gain < min_gain]
    return keep, heuristic
