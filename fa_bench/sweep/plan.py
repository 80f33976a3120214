"""A sweep's plan on disk, its journal read back, and the estimate said before it starts.

sweep-plan.json is written into the sweep's folder before the first config runs: every
point (case, config fields, default/pruned/rules) and the options it runs with. `fa-bench
sweep --resume DIR` reads it back, so an interrupted sweep finishes with exactly the same
points, whatever the defaults or the heuristic have become since. journal.jsonl holds one
row per finished point (pruned ones included); a point with a row is done, and the last
row of a point journaled twice wins, so every config is in sweep.json exactly once.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from fa_bench.case import Case
from fa_bench.errors import UsageError
from fa_bench.results.files import JOURNAL, sanitize
from fa_bench.run.limits import CASE_OVERHEAD_S, WORKER_START_S, human_duration
from fa_bench.run.runner import RunOptions
from fa_bench.sweep.gluon_space import GluonSpace
from fa_bench.sweep.space import Point, SweepSpace

SWEEP_PLAN = "sweep-plan.json"
PLAN_SCHEMA = "fa-bench-sweep-plan/1"
# On a CPU the kernel runs in Triton's interpreter (numpy): warps and stages do nothing
# there and the timings rank nothing a GPU would see, so the default space only checks
# that the sweep works: 2 × 2 tiles, one warp and stage setting (docs/sweep.md).
CPU_SPACE = SweepSpace(block_m=(16, 32), block_n=(16, 32), warps=(4,), stages=(1,))
# Upper figure for one config's build in the parallel compile phase, per process: the
# H200 built 420 configs in 79 s with 8 processes (about 1.5 s each); twice that.
BUILD_S = 3.0


class SweepPlanError(UsageError, ValueError):
    """A folder that `--resume` cannot finish (exit 2), naming the folder and the file."""


@dataclass
class SweepPlan:
    run: dict  # argv, device, space, smem_limit_bytes, the sweep's own options, resumed
    options: RunOptions
    points: list[Point]


def point_to_json(p: Point) -> dict:
    return {"case": p.case.to_dict(), "fields": dict(p.fields), "is_default": p.is_default,
            "pruned": p.pruned, "rules": list(p.rules)}  # fmt: skip


def point_from_json(d: dict) -> Point:
    """A point of sweep-plan.json; a wrong type is a TypeError naming the key."""
    pruned, rules = d["pruned"], d["rules"]
    if not (pruned is None or isinstance(pruned, str)):
        raise TypeError(f"'pruned' must be a string or null, got {pruned!r}")
    if not isinstance(rules, list) or not all(isinstance(r, str) for r in rules):
        raise TypeError(f"'rules' must be a list of strings, got {rules!r}")
    if not isinstance(d["is_default"], bool):
        raise TypeError(f"'is_default' must be true or false, got {d['is_default']!r}")
    fields = {str(k): _field_value(k, v) for k, v in d["fields"].items()}
    return Point(Case.from_dict(d["case"]), fields, d["is_default"], pruned, tuple(rules))


def _field_value(name: str, value: object) -> object:
    """A config field as FlashConfig takes it: the tile fields are integers (written as
    such), a Gluon launch's (`gluon_*`) also strings, bools and null."""
    if name.startswith("gluon_") and (value is None or isinstance(value, (str, bool))):
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise TypeError(f"field {name!r} has the wrong type: {value!r}")
    return int(value)


def write_plan(out: Path, plan: SweepPlan) -> Path:
    doc = {"schema": PLAN_SCHEMA, "run": plan.run, "options": plan.options.to_dict(),
           "points": [point_to_json(p) for p in plan.points]}  # fmt: skip
    path = out / SWEEP_PLAN
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(json.dumps(sanitize(doc), indent=1, allow_nan=False), encoding="utf-8")
        tmp.replace(path)  # never half a plan: --resume reads all of it or nothing
    except OSError as exc:
        raise SweepPlanError(f"{path}: cannot write it: {exc.strerror or exc}") from None
    return path


def load_plan(out: Path) -> SweepPlan:
    """The plan of the sweep in `out`; a missing or broken one names the file."""
    path = out / SWEEP_PLAN
    shown = f"--resume {out}"
    if not out.is_dir():
        raise SweepPlanError(f"{shown}: not a folder")
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SweepPlanError(
            f"{shown}: no {SWEEP_PLAN} there (not a sweep folder, or one from before "
            "`sweep --resume` existed)"
        ) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise SweepPlanError(f"{shown}: cannot read {SWEEP_PLAN}: {exc}") from None
    if not isinstance(doc, dict) or doc.get("schema") != PLAN_SCHEMA:
        raise SweepPlanError(f"{path}: not a {PLAN_SCHEMA} file")
    try:
        run = doc["run"]
        if not isinstance(run, dict) or not isinstance(run.setdefault("resumed", []), list):
            raise TypeError("'run' must be an object with a 'resumed' list")
        _check_run(run)
        options = RunOptions.from_dict(doc["options"])
        points = [point_from_json(p) for p in doc["points"]]
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise SweepPlanError(f"{path}: invalid plan: {type(exc).__name__}: {exc}") from None
    return SweepPlan(run=run, options=options, points=points)


# The plan's own keys and their JSON types (bool is an int in Python: checked apart).
_RUN_KEYS: dict[str, tuple[type, ...]] = {
    "started": (str,), "argv": (list,), "device": (str,), "smem_limit_bytes": (int, type(None)),
    "space": (dict,), "rules": (bool,), "budget_minutes": (int, float, type(None)),
    "save_best": (bool,), "min_gain_pct": (int, float), "compile_jobs": (int,),
    "tuning_cache": (str, type(None)),
}  # fmt: skip


def _check_run(run: dict) -> None:
    """The keys `fa-bench sweep --resume` reads, each of its type (TypeError naming it)."""
    for key, types in _RUN_KEYS.items():
        value = run.get(key, KeyError)
        if value is KeyError:
            raise TypeError(f"'run.{key}' is missing")
        wrong_bool = isinstance(value, bool) and bool not in types
        if wrong_bool or not isinstance(value, types):
            raise TypeError(f"'run.{key}' has the wrong type: {value!r}")
    if run["compile_jobs"] < 0 or run["device"] not in ("cpu", "cuda"):
        raise TypeError("'run.compile_jobs' must be >= 0 and 'run.device' cpu or cuda")
    space_of(run)  # ValueError if bad


def space_of(run: dict) -> SweepSpace | GluonSpace:
    """The space a plan's `run` names: a Gluon sweep's (`kernel` "gluon"), else the `tl`
    kernel's tiles (plans written before the Gluon sweep have no `kernel`)."""
    if run.get("kernel", "tl") == "gluon":
        return GluonSpace.from_dict(run["space"])
    return SweepSpace(**{axis: tuple(v) for axis, v in run["space"].items()})


def journal_rows(out: Path, points: list[Point]) -> tuple[dict[str, dict], int]:
    """({point id: its last journaled row}, lines skipped): a torn or foreign line (not
    JSON, not a row of this plan) is skipped and counted, never fatal."""
    ids = {p.id: p for p in points}
    rows: dict[str, dict] = {}
    skipped = 0
    try:
        data = (out / JOURNAL).read_bytes()
    except FileNotFoundError:
        return rows, 0
    except OSError as exc:
        raise SweepPlanError(f"{out / JOURNAL}: cannot read it: {exc.strerror}") from None
    for raw in data.split(b"\n"):
        if not raw.strip():
            continue
        try:
            row = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
            skipped += 1
            continue
        if _is_row(row, ids):
            rows[row["id"]] = row
        else:
            skipped += 1
    return rows, skipped


def _is_row(row: object, ids: dict[str, Point]) -> bool:
    """A row of this plan as execute._row writes it (the keys sweep.json's summary and
    the report read, of their types); anything else is measured again."""
    if not isinstance(row, dict) or row.get("id") not in ids:
        return False
    point = ids[row["id"]]
    number = (int, float, type(None))
    return (row.get("case_id") == point.case.id and row.get("label") == point.label
            and row.get("is_default") == point.is_default
            and isinstance(row.get("status"), str) and isinstance(row.get("tflops", ""), number)
            and isinstance(row.get("error", 0), (str, type(None)))
            and isinstance(row.get("latency_ms", 0), (dict, type(None)))
            and isinstance(row.get("config"), dict) and isinstance(row.get("fields"), dict)
            and isinstance(row.get("rules"), list))  # fmt: skip


def estimate_s(points: int, groups: int, jobs: int, options: RunOptions) -> float:
    """A rough upper estimate of a sweep's length (`describe_estimate` says what it
    assumes): the builds, then per measured config its warm-up, --max-time and the
    hand-off and accuracy check; once, the worker's start."""
    if points <= 0:
        return 0.0
    timing = options.timing
    per_point = timing.warmup_ms / 1000 + timing.max_time_s + CASE_OVERHEAD_S
    builds = BUILD_S * groups / jobs if jobs > 0 else 0.0
    return WORKER_START_S + builds + points * per_point


def describe_estimate(
    points: int, groups: int, jobs: int, options: RunOptions, budget_minutes: float | None
) -> str:
    """The estimate line: the figure, what it is made of and what it assumes."""
    total = estimate_s(points, groups, jobs, options)
    timing = options.timing
    parts = [f"{points} configs × (warm-up {timing.warmup_ms / 1000:g} s + --max-time "
             f"{timing.max_time_s:g} s + ~{CASE_OVERHEAD_S:g} s check and hand-off)"]  # fmt: skip
    if jobs > 0 and groups:
        parts.append(f"{groups} builds at ≤ {BUILD_S:g} s each over {jobs} processes")
    parts.append(f"{WORKER_START_S:g} s worker start")
    line = (f"estimate: at most about {human_duration(total)} ({' + '.join(parts)}); "
            "most configs stop sooner, at --target-noise. It assumes no config reaches "
            f"--timeout {options.timeout_s:g} s")  # fmt: skip
    if options.device == "cpu":
        # A config stops at --max-time only after 2 timed calls, plus a warm-up call and
        # the accuracy check's: in the interpreter one call can take a second or more.
        line += (f", and calls shorter than about {timing.max_time_s / 4:g} s: each config "
                 "makes at least four, and in the interpreter one can take seconds; the "
                 "progress lines' eta follows the real pace")  # fmt: skip
    if budget_minutes is not None:
        line += f"; --budget-minutes {budget_minutes:g} stops it by then, keeping every row"
    return line + "."


# Which flag sets a FlashConfig field, for the messages about a pruned space.
_FIELD_FLAGS = {"block_m": "--block-m", "block_n": "--block-n", "num_warps": "--warps",
                "num_stages": "--stages"}  # fmt: skip


def pruned_summary(points: list[Point]) -> str:
    """'12 pruned (redundant 8, shared memory 4)': the pruned points by reason."""
    reasons: dict[str, int] = {}
    for p in points:
        if p.pruned:
            kind = p.pruned.split(":")[0]
            reasons[kind] = reasons.get(kind, 0) + 1
    n = sum(reasons.values())
    if not n:
        return "0 pruned"
    return f"{n} pruned ({', '.join(f'{k} {v}' for k, v in reasons.items())})"


def check_space_not_all_pruned(points: list[Point], space: SweepSpace, given: set[str]) -> None:
    """Refuse (exit 2) a sweep whose requested space is pruned for every case: it would
    measure the heuristic's config alone and look like a finished sweep."""
    from fa_bench.sweep.vocab import MODE_FIELDS

    product = {tuple(v) for v in _product(space)}
    requested = [
        p for p in points if tuple(p.fields[n] for n in MODE_FIELDS[p.case.mode.value]) in product
    ]
    if not requested or any(not p.pruned for p in requested):
        return
    reasons = sorted({p.pruned or "" for p in requested})
    flags = sorted({flag for r in reasons for field, flag in _FIELD_FLAGS.items() if field in r})
    if any(r.startswith("shared memory") for r in reasons):
        flags = sorted({*flags, "--block-n", "--stages"})
    named = [f for f in flags if f in given] or flags or ["--block-m", "--block-n"]
    shown = " ".join(f"{f} {space.axis_text(_axis(f))}" for f in named)
    more = f" (and {len(reasons) - 3} more)" if len(reasons) > 3 else ""
    raise SweepPlanError(
        f"{shown}: every config of the requested space is pruned for every case, so only "
        f"the heuristic's config would be measured; why: {'; '.join(reasons[:3])}{more}. "
        "Tiles are powers of two in [16, 256], no longer than the sequence; warps 1, 2, 4, "
        "8 or 16; stages 1..8 (docs/sweep.md)"
    )


def _axis(flag: str) -> str:
    return {"--warps": "warps", "--stages": "stages"}.get(flag, flag[2:].replace("-", "_"))


def _product(space: SweepSpace) -> list[tuple[int, ...]]:
    import itertools

    return list(itertools.product(*(getattr(space, axis) for axis in space.AXES)))
