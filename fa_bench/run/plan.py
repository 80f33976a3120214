"""Orchestrates `fa-bench run`: plan the cases, execute them, write the results.

The plan (plan.json) is written before the first case, so `--resume DIR` can finish an
interrupted run with exactly the same cases and options.
"""

from __future__ import annotations

import json
import os
import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from fa_bench import __version__
from fa_bench.case import Case
from fa_bench.env import git_sha
from fa_bench.errors import UsageError
from fa_bench.results import schema
from fa_bench.results.files import (
    PLAN,
    JournalWriteError,
    build_document,
    read_journal,
    write_results,
)
from fa_bench.results.record import CaseRecord, ResultsError
from fa_bench.run.runner import ProgressFn, RunOptions, execute

# /2 keeps the options once, in run["options"] (as results.json records them), plus the
# part's own GPU; /1 (read for --resume of older folders) also had a top-level copy.
PLAN_SCHEMA = "fa-bench-plan/2"
_OLD_PLAN_SCHEMAS = ("fa-bench-plan/1",)


class PlanError(UsageError, ValueError):
    """Bad input for a run (maps to exit code 2)."""


@dataclass
class Plan:
    run: dict  # results.json's run; run["options"] is `options` as planned, before a split
    options: RunOptions  # what the worker runs with: the planned ones on this part's GPU
    cases: list[Case]


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def default_out_dir(suite_names: Sequence[str], base: Path = Path("fa-bench-out")) -> Path:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    label = "+".join(Path(s).stem for s in suite_names) or "run"
    return base / f"{stamp}-{label}"


def new_plan(
    cases: Sequence[Case], options: RunOptions, suites: list[dict], argv: list[str]
) -> Plan:
    if not cases:
        raise PlanError("the chosen suites and flags select no case")
    run = {
        "id": uuid.uuid4().hex[:12],
        "started": now_iso(),
        "ended": None,
        "argv": argv,
        "suites": suites,
        "fa_bench": __version__,
        "git_sha": git_sha(),
        "device": options.device,
        "seed": options.seed,
        "options": options.to_dict(),
        "interrupted": False,
        "resumed": [],
    }
    return Plan(run=run, options=options, cases=list(cases))


def save_plan(out_dir: Path, plan: Plan) -> None:
    # A part differs from run["options"] only in its GPU (multi.split, a rank's local GPU).
    doc = {
        "schema": PLAN_SCHEMA,
        "run": plan.run,
        "gpu": plan.options.gpu,
        "cases": [c.to_dict() for c in plan.cases],
    }
    path, tmp = out_dir / PLAN, out_dir / (PLAN + ".tmp")
    try:  # temp file, then rename: a full disk never leaves a truncated plan behind
        tmp.write_text(json.dumps(doc, indent=1), encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        raise JournalWriteError(exc.errno, f"cannot write {path}: {exc.strerror}") from exc


def load_plan(out_dir: Path) -> Plan:
    path = Path(out_dir) / PLAN
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PlanError(
            f"--resume {out_dir}: no {PLAN} there (not an fa-bench run folder)"
        ) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PlanError(f"--resume {out_dir}: cannot read {PLAN}: {exc}") from None
    except RecursionError:
        raise PlanError(f"--resume {out_dir}: cannot read {PLAN}: nested too deeply") from None
    if not isinstance(doc, dict):
        raise PlanError(f"{path}: invalid plan: not a JSON object")
    if doc.get("schema") not in (PLAN_SCHEMA, *_OLD_PLAN_SCHEMAS):
        raise PlanError(f"{path}: schema {doc.get('schema')!r} is not {PLAN_SCHEMA!r}")
    run = doc.get("run")
    if not isinstance(run, dict) or not isinstance(doc.get("cases"), list):
        raise PlanError(f"{path}: invalid plan: 'run' must be an object and 'cases' a list")
    if not isinstance(run.setdefault("resumed", []), list):
        raise PlanError(f"{path}: invalid plan: 'run.resumed' must be a list")
    try:  # what results.json will be checked for at the end, checked before any case runs
        schema.check_run(run, f"{path}: invalid plan")
        if run.get("env") is not None:
            if not isinstance(run["env"], dict):
                raise ResultsError(f"{path}: invalid plan: 'run.env' must be an object")
            schema.check_env(run["env"], f"{path}: invalid plan: run")
    except ResultsError as exc:
        raise PlanError(str(exc)) from None
    try:
        cases = [Case.from_dict(c) for c in doc["cases"]]
        if doc["schema"] == PLAN_SCHEMA:
            options = RunOptions.from_dict({**run["options"], "gpu": doc["gpu"]})
        else:
            options = RunOptions.from_dict(doc["options"])
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        # AttributeError: a case or an options object that is not a JSON object.
        raise PlanError(f"{path}: invalid plan: {type(exc).__name__}: {exc}") from None
    return Plan(run=run, options=options, cases=cases)


def ordered_records(plan: Plan, out_dir: Path) -> list[CaseRecord]:
    """Journal records in plan order; a case journaled twice keeps its last record."""
    latest = {r.id: r for r in read_journal(out_dir)}
    return [latest[c.id] for c in plan.cases if c.id in latest]


def finish(plan: Plan, out_dir: Path, env: dict | None, interrupted: bool) -> tuple[Path, Path]:
    plan.run["ended"] = now_iso()
    plan.run["interrupted"] = interrupted
    env = env or plan.run.get("env") or {}
    plan.run["env"] = env  # kept in the plan so a resumed run without new cases has it
    save_plan(out_dir, plan)
    env_doc = dict(env)
    gpus = env_doc.get("gpus") or []
    env_doc["gpu_name"] = gpus[0]["name"] if gpus and plan.options.device != "cpu" else None
    doc = build_document({k: v for k, v in plan.run.items() if k != "env"}, env_doc,
                         ordered_records(plan, out_dir))  # fmt: skip
    return write_results(out_dir, doc)


def run_plan(
    plan: Plan,
    out_dir: Path,
    on_event: ProgressFn | None,
    stop: threading.Event | None = None,
) -> tuple[dict | None, bool]:
    """Execute the plan's remaining cases; returns (worker env, interrupted)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    save_plan(out_dir, plan)
    try:
        return execute(plan.cases, out_dir, plan.options, on_event, stop=stop), False
    except KeyboardInterrupt as exc:
        return getattr(exc, "env", None), True


def exit_code(records: Sequence[CaseRecord]) -> int:
    """0 when every case is ok, oom or unsupported; 1 when any failed."""
    return 1 if any(r.status.is_failure for r in records) else 0
