"""The results format: results.json (schema fa-bench/1), results.csv, and the journal.

results.json = {"schema": "fa-bench/1", "run": {...}, "env": {...}, "cases": [...]}.
The journal (journal.jsonl) gets one line per finished case as it finishes, so an
interrupted run loses nothing; results.json/csv are written from it. Never pickled.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable
from pathlib import Path

from fa_bench.case import Status

SCHEMA = "fa-bench/1"
JOURNAL = "journal.jsonl"
PLAN = "plan.json"

CASE_KEYS = (
    "id", "impl", "mode", "dtype", "batch", "heads_q", "heads_kv", "seqlen_q", "seqlen_k",
    "head_dim", "causal", "device", "status", "error", "latency_ms", "tflops", "gbps_model",
    "peak_mem_bytes", "accuracy", "telemetry",
)  # fmt: skip
LATENCY_KEYS = ("median", "mean", "min", "max", "p20", "p80", "stdev", "n", "samples")


class ResultsError(ValueError):
    """A results file that is unreadable or not of this schema."""


def sanitize(obj: object) -> object:
    """JSON has no NaN or infinity: non-finite floats become null."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: sanitize(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [sanitize(v) for v in obj]
    return obj


def append_journal(out_dir: Path, record: dict) -> None:
    """Append and fsync, so a crash right after a case keeps it."""
    with open(Path(out_dir) / JOURNAL, "a", encoding="utf-8") as f:
        f.write(json.dumps(sanitize(record), allow_nan=False) + "\n")
        f.flush()
        os.fsync(f.fileno())


def read_journal(out_dir: Path) -> list[dict]:
    """Records in the journal; a torn last line (a crash mid-write) is ignored."""
    path = Path(out_dir) / JOURNAL
    if not path.exists():
        return []
    records = []
    lines = path.read_text(encoding="utf-8").splitlines()
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as exc:
            if n == len(lines):
                break
            raise ResultsError(f"{path}:{n}: corrupt journal line: {exc}") from None
    return records


def build_document(run: dict, env: dict, cases: Iterable[dict]) -> dict:
    return sanitize({"schema": SCHEMA, "run": run, "env": env, "cases": list(cases)})


def write_results(out_dir: Path, doc: dict) -> tuple[Path, Path]:
    """Write results.json and results.csv atomically (temp file, then rename)."""
    validate(doc, source=str(out_dir))
    out_dir = Path(out_dir)
    json_path, csv_path = out_dir / "results.json", out_dir / "results.csv"
    tmp = json_path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=1, allow_nan=False), encoding="utf-8")
    os.replace(tmp, json_path)
    frame = to_frame(doc)
    tmp = csv_path.with_suffix(".csv.tmp")
    frame.to_csv(tmp, index=False)
    os.replace(tmp, csv_path)
    return json_path, csv_path


def to_frame(doc: dict):
    """One row per case, raw samples left out, nested objects flattened with dots."""
    import pandas as pd

    rows = []
    for case in doc["cases"]:
        row = {
            k: v
            for k, v in case.items()
            if not isinstance(v, (dict, list)) and k != "traceback"  # the JSON keeps it
        }
        for key in ("latency_ms", "accuracy", "timing", "telemetry"):
            for sub, val in (case.get(key) or {}).items():
                if not isinstance(val, (dict, list)):
                    row[f"{key}.{sub}"] = val
        gpu = case.get("gpu")
        if isinstance(gpu, dict):  # runs over several GPUs keep each case's own
            row.update({"gpu": gpu.get("name"), "gpu.index": gpu.get("index"),
                        "gpu.uuid": gpu.get("uuid")})  # fmt: skip
        else:
            row["gpu"] = doc.get("env", {}).get("gpu_name")
        rows.append(row)
    return pd.DataFrame(rows)


def validate(doc: object, *, source: str = "results") -> dict:
    if not isinstance(doc, dict):
        raise ResultsError(f"{source}: not a JSON object")
    if doc.get("schema") != SCHEMA:
        raise ResultsError(
            f"{source}: schema is {doc.get('schema')!r}, this fa-bench reads {SCHEMA!r}"
        )
    for key, kind in (("run", dict), ("env", dict), ("cases", list)):
        if not isinstance(doc.get(key), kind):
            raise ResultsError(f"{source}: '{key}' must be a JSON {kind.__name__}")
    valid_status = {s.value for s in Status}
    for i, case in enumerate(doc["cases"]):
        where = f"{source}: cases[{i}]"
        if not isinstance(case, dict):
            raise ResultsError(f"{where} is not an object")
        missing = [k for k in CASE_KEYS if k not in case]
        if missing:
            raise ResultsError(f"{where} ({case.get('id')}) lacks {', '.join(missing)}")
        if case["status"] not in valid_status:
            valid = ", ".join(sorted(valid_status))
            raise ResultsError(f"{where}: status {case['status']!r} is not one of {valid}")
        tel = case["telemetry"]
        tel_ok = isinstance(tel, dict) and isinstance(tel.get("available"), bool)
        if tel is not None and not tel_ok:
            raise ResultsError(f"{where}: telemetry must be null or an object with 'available'")
        lat = case["latency_ms"]
        if lat is not None and (
            not isinstance(lat, dict) or any(k not in lat for k in LATENCY_KEYS)
        ):
            raise ResultsError(f"{where}: latency_ms must hold {', '.join(LATENCY_KEYS)}")
    return doc


def load_results(path: str | os.PathLike) -> dict:
    """Read and validate a results.json (or a directory holding one)."""
    p = Path(path)
    if p.is_dir():
        p = p / "results.json"
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ResultsError(f"{p}: no such file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ResultsError(f"{p}: cannot read results: {exc}") from None
    return validate(doc, source=str(p))
