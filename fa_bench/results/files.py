"""The results files: results.json (schema fa-bench/1), results.csv, and the journal.

results.json = {"schema": "fa-bench/1", "run": {...}, "env": {...}, "cases": [...]}, a
`ResultsDoc` of `CaseRecord`s (fa_bench.results.record owns the format and its checks).
The journal (journal.jsonl) gets one line per finished case as it finishes, so an
interrupted run loses nothing; results.json/csv are written from it. Never pickled.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fa_bench.results.record import CaseRecord, ResultsDoc, ResultsError

if TYPE_CHECKING:
    import pandas as pd

JOURNAL = "journal.jsonl"
PLAN = "plan.json"


def sanitize(obj: Any) -> Any:
    """JSON has no NaN or infinity: non-finite floats become null."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: sanitize(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [sanitize(v) for v in obj]
    return obj


def append_json_line(path: Path, obj: dict) -> None:
    """Append one JSON line and fsync, so a crash right after it keeps it."""
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(sanitize(obj), allow_nan=False) + "\n")
        f.flush()
        os.fsync(f.fileno())


def append_journal(out_dir: Path, record: CaseRecord) -> None:
    """Journal one finished case (fsynced)."""
    append_json_line(Path(out_dir) / JOURNAL, record.to_json())


def read_journal(out_dir: Path) -> list[CaseRecord]:
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
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            if n == len(lines):
                break
            raise ResultsError(f"{path}:{n}: corrupt journal line: {exc}") from None
        records.append(CaseRecord.from_json(obj, f"{path}:{n}"))
    return records


def build_document(run: dict, env: dict, cases: Iterable[CaseRecord]) -> ResultsDoc:
    """The results document of a run: its run and env objects and its records, in order."""
    return ResultsDoc(run=run, env=env, cases=list(cases))


def write_results(out_dir: Path, doc: ResultsDoc) -> tuple[Path, Path]:
    """Write results.json and results.csv atomically (temp file, then rename)."""
    data = sanitize(doc.to_json())
    # What is written must read back: a bad record fails here, not in a later report.
    ResultsDoc.from_json(data, source=str(out_dir))
    out_dir = Path(out_dir)
    json_path, csv_path = out_dir / "results.json", out_dir / "results.csv"
    tmp = json_path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=1, allow_nan=False), encoding="utf-8")
    os.replace(tmp, json_path)
    frame = to_frame(doc)
    tmp = csv_path.with_suffix(".csv.tmp")
    frame.to_csv(tmp, index=False)
    os.replace(tmp, csv_path)
    return json_path, csv_path


def to_frame(doc: ResultsDoc) -> pd.DataFrame:
    """One row per case, raw samples left out, nested objects flattened with dots."""
    import pandas as pd

    rows = []
    for record in doc.cases:
        case = sanitize(record.to_json())
        row = {
            k: v
            for k, v in case.items()
            if not isinstance(v, (dict, list)) and k != "traceback"  # the JSON keeps it
        }
        for key in ("latency_ms", "accuracy", "timing", "telemetry"):
            for sub, val in (case.get(key) or {}).items():
                if not isinstance(val, (dict, list)):
                    row[f"{key}.{sub}"] = val
        gpu = record.gpu
        if gpu is not None:  # runs over several GPUs keep each case's own
            row.update({"gpu": gpu.name, "gpu.index": gpu.index, "gpu.uuid": gpu.uuid})
        else:
            row["gpu"] = doc.env.get("gpu_name")
        rows.append(row)
    return pd.DataFrame(rows)


def load_results(path: str | os.PathLike) -> ResultsDoc:
    """Read and check a results.json (or a directory holding one)."""
    p = Path(path)
    if p.is_dir():
        p = p / "results.json"
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ResultsError(f"{p}: no such file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ResultsError(f"{p}: cannot read results: {exc}") from None
    return ResultsDoc.from_json(doc, source=str(p))
