"""The results files: results.json (schema fa-bench/1), results.csv, and the journal.

results.json = {"schema": "fa-bench/1", "run": {...}, "env": {...}, "cases": [...]}, a
`ResultsDoc` of `CaseRecord`s (fa_bench.results.record owns the format and its checks).
The journal (journal.jsonl) gets one line per finished case as it finishes, so an
interrupted run loses nothing; results.json/csv are written from it. Reading it never
fails on a bad line (torn by a crash, a full disk, an edit): the line is skipped and
reported and its case runs again. Never pickled.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fa_bench.case import VARIANT_FIELDS, Case
from fa_bench.results.bandwidth import fractions, is_decode
from fa_bench.results.record import CaseRecord, ResultsDoc, ResultsError
from fa_bench.words import plural

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


class JournalWriteError(OSError):
    """A journal or results file could not be written (a full disk, no permission). Not a
    usage error: what was journaled before it is intact, and `--resume` finishes the run
    once the cause is fixed (the CLI exits with WRITE_ERROR_EXIT)."""


# EX_IOERR of sysexits.h: neither a failed case (1) nor bad input (2).
WRITE_ERROR_EXIT = 74


def append_json_line(path: Path, obj: dict) -> None:
    """Append one JSON line and fsync, so a crash right after it keeps it.

    The line always starts on a line boundary: a torn tail (a crash or a full disk in the
    middle of an earlier write) is ended with a newline first, so it stays one bad line
    that readers skip and report, and the new record is never glued to it. Its bytes are
    kept, not cut: they are the evidence of what happened.
    """
    line = json.dumps(sanitize(obj), allow_nan=False) + "\n"
    try:
        with open(path, "a+b") as f:
            if f.tell() > 0:
                f.seek(f.tell() - 1)
                if f.read(1) != b"\n":
                    line = "\n" + line
            f.write(line.encode("utf-8"))
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:
        raise JournalWriteError(exc.errno, f"cannot write {path}: {exc.strerror}") from exc


def append_journal(out_dir: Path, record: CaseRecord) -> None:
    """Journal one finished case (fsynced)."""
    append_json_line(Path(out_dir) / JOURNAL, record.to_json())


@dataclass
class JournalScan:
    """What a journal holds: its valid records, in order, and the lines that are not one
    (line number, why), which are skipped, so the cases they held run again."""

    records: list[CaseRecord] = field(default_factory=list)
    bad: list[tuple[int, str]] = field(default_factory=list)

    def warning(self, path: Path) -> str | None:
        """One line for the terminal naming the skipped lines, or None when there are none."""
        if not self.bad:
            return None
        numbers = [n for n, _ in self.bad]
        shown = ", ".join(map(str, numbers[:10])) + (", ..." if len(numbers) > 10 else "")
        return (
            f"{path}: skipped {plural(len(self.bad), 'unreadable line')} "
            f"(line{'s' * (len(numbers) > 1)} "
            f"{shown}; line "
            f"{self.bad[0][0]}: {self.bad[0][1]}); the cases they held run again"
        )


def scan_journal(out_dir: Path) -> JournalScan:
    """Every valid record of the journal; a line that is not one (torn, not JSON, not an
    object, or a record `CaseRecord.from_json` rejects) is skipped and listed."""
    path = Path(out_dir) / JOURNAL
    scan = JournalScan()
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return scan
    except OSError as exc:  # a folder or an unreadable file in its place: the user's to fix
        raise ResultsError(f"{path}: cannot read the journal: {exc.strerror}") from None
    for n, raw in enumerate(data.split(b"\n"), 1):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw.decode("utf-8"))
            scan.records.append(CaseRecord.from_json(obj, "the record"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            scan.bad.append((n, f"not JSON ({exc})"))
        except (ResultsError, TypeError, ValueError, KeyError, AttributeError) as exc:
            # Not only ResultsError: a hand-edited record can break any field's check.
            scan.bad.append((n, str(exc)))
        except RecursionError:
            scan.bad.append((n, "nested too deeply"))
    return scan


def read_journal(out_dir: Path) -> list[CaseRecord]:
    """The valid records in the journal (see `scan_journal` for the lines skipped)."""
    return scan_journal(out_dir).records


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
    frame = to_frame(doc)
    text = json.dumps(data, indent=1, allow_nan=False)
    for path, write in ((json_path, lambda t: t.write_text(text, encoding="utf-8")),
                        (csv_path, lambda t: frame.to_csv(t, index=False))):  # fmt: skip
        tmp = path.with_name(path.name + ".tmp")
        try:
            write(tmp)
            os.replace(tmp, path)
        except OSError as exc:
            with contextlib.suppress(OSError):  # a half-written temp file only takes space
                tmp.unlink(missing_ok=True)
            raise JournalWriteError(exc.errno, f"cannot write {path}: {exc.strerror}") from exc
    return json_path, csv_path


def to_frame(doc: ResultsDoc) -> pd.DataFrame:
    """One row per case, raw samples left out, nested objects flattened with dots; decode
    cases add hbm_fraction and copy_fraction (fa_bench.results.bandwidth)."""
    import pandas as pd

    rows = []
    # A run with variant cases gives every row its variant fields (after `causal`): a
    # blank cell would turn the column into floats. Dense runs' CSV stays as it was.
    variants = any(r.case.is_variant for r in doc.cases)
    for record in doc.cases:
        case = sanitize(record.to_json())
        if variants:
            case = _with_variant_fields(case, record.case)
        row = {
            k: v
            for k, v in case.items()
            if not isinstance(v, (dict, list)) and k != "traceback"  # the JSON keeps it
        }
        # fp8_scales: an fp8 case's per-tensor scales (absent elsewhere: no columns)
        for key in ("latency_ms", "accuracy", "timing", "telemetry", "fp8_scales"):
            for sub, val in (case.get(key) or {}).items():
                if not isinstance(val, (dict, list)):
                    row[f"{key}.{sub}"] = val
        if is_decode(record.case):  # memory-bound: how near its GPU's ceilings (derived)
            hbm, copy = fractions(record, doc.env)
            row.update(hbm_fraction=hbm, copy_fraction=copy)
        gpu = record.gpu
        if gpu is not None:  # runs over several GPUs keep each case's own
            row.update({"gpu": gpu.name, "gpu.index": gpu.index, "gpu.uuid": gpu.uuid})
        else:
            row["gpu"] = doc.env.get("gpu_name")
        rows.append(row)
    return pd.DataFrame(rows)


def _with_variant_fields(row: dict, case: Case) -> dict:
    """The record's keys with every variant field right after `causal`."""
    out = {}
    for key, value in row.items():
        if key not in VARIANT_FIELDS:
            out[key] = value
        if key == "causal":
            out.update({name: getattr(case, name) for name in VARIANT_FIELDS})
    return out


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
