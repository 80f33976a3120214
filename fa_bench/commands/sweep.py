"""`fa-bench sweep`: time our Triton kernel over its tiling space (docs/sweep.md)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from rich.console import Console
from rich.table import Table
from rich.text import Text

from fa_bench.case import Status
from fa_bench.commands.flags import CaseFlags, MeasureFlags
from fa_bench.console import RunProgress
from fa_bench.errors import UsageError, print_error
from fa_bench.run.folder_lock import FolderLock
from fa_bench.run.limits import check_case_count, check_case_sizes, check_out_dir
from fa_bench.sweep.space import Point, SweepSpace
from fa_bench.sweep.vocab import SWEEP_MODES

_DEFAULT_OUT = Path("fa-bench-out")
_SPACE = SweepSpace()  # the default space: its axes are the flags' defaults


@dataclass(frozen=True)
class SweepRequest(CaseFlags, MeasureFlags):
    modes: tuple[str, ...] = SWEEP_MODES
    block_m: str = _SPACE.axis_text("block_m")
    block_n: str = _SPACE.axis_text("block_n")
    warps: str = _SPACE.axis_text("warps")
    stages: str = _SPACE.axis_text("stages")
    budget_minutes: float | None = None
    save_best: bool = False
    min_gain_pct: float = 3.0  # --save-best keeps the heuristic below this gain
    rules: bool = True  # also measure each rule of thumb's tile
    tuning_cache: str | None = None
    compile_jobs: int | None = None  # None: sweep_compile.default_jobs for the device
    argv: tuple[str, ...] | list[str] = ()
    # One config is one build and one kernel, and a sweep has hundreds: a hung one should
    # cost less than a run's case may.
    DEFAULT_TIMEOUT_S: ClassVar[float] = 300.0


class SweepInputError(UsageError, ValueError):
    """Bad flag values: exit code 2 with the message."""


def parse_int_list(flag: str, text: str) -> tuple[int, ...]:
    """ "32,64,128" -> (32, 64, 128); anything else names the flag."""
    try:
        values = tuple(int(p) for p in text.replace(" ", "").split(",") if p)
    except ValueError:
        raise SweepInputError(f"{flag} {text!r}: expected comma-separated integers") from None
    if not values:
        raise SweepInputError(f"{flag}: needs at least one value")
    return values


def _smem_limit(device: str, gpu: int | None) -> int | None:
    if device != "cuda":
        return None
    import torch

    from fa_bench.sweep.space import H200_SMEM_BYTES

    props = torch.cuda.get_device_properties(gpu or 0)
    return int(getattr(props, "shared_memory_per_block_optin", 0) or H200_SMEM_BYTES)


def plan_points(req: SweepRequest, device: str) -> tuple[list[Point], SweepSpace, int | None]:
    """The sweep's points, its space and the shared-memory limit used for pruning."""
    from fa_bench import registry
    from fa_bench.suite.expand import Overrides, load_suites
    from fa_bench.sweep.space import sweep_case, sweep_points

    bad = [m for m in req.modes if m not in SWEEP_MODES]
    if bad:
        raise SweepInputError(f"--mode {bad[0]}: valid sweep modes are {', '.join(SWEEP_MODES)}")
    try:
        space = SweepSpace(
            block_m=parse_int_list("--block-m", req.block_m),
            block_n=parse_int_list("--block-n", req.block_n),
            warps=parse_int_list("--warps", req.warps),
            stages=parse_int_list("--stages", req.stages),
        )
    except ValueError as exc:  # SweepSpace's checks name the flag (--block-m 0)
        if isinstance(exc, SweepInputError):
            raise
        raise SweepInputError(str(exc)) from None
    registry.load()
    overrides = Overrides.from_flags(req, impls=("triton",))
    names = list(req.suites) or ["standard" if device == "cuda" else "smoke"]
    suites = load_suites(
        names, overrides=overrides, known_impls=registry.names(), max_cases=req.max_cases
    )
    cases = list({c.id: sweep_case(c) for s in suites for c in s.cases}.values())
    check_case_sizes(cases, device, req.gpu)
    capability = None
    if device == "cuda":
        import torch

        capability = torch.cuda.get_device_capability(req.gpu or 0)
    smem = _smem_limit(device, req.gpu)
    points = sweep_points(
        cases, space, capability=capability, smem_limit_bytes=smem, with_rules=req.rules
    )
    check_case_count(len(points), req.max_cases, "the cases × configs", "points")
    return points, space, smem


def _claim_out(out: Path) -> tuple[Path, FolderLock]:
    """The output folder, checked before any config is built (not a finished sweep, not a
    file or an unwritable place) and locked: one writer per folder, released when the lock
    is dropped (the command returns) or the process exits."""
    if (out / "sweep.json").exists():
        raise SweepInputError(f"--out {out}: already holds a sweep.json")
    check_out_dir(out)
    return out, FolderLock(out, "--out").acquire()


def sweep_command(req: SweepRequest, *, console: Console, err_console: Console) -> int:
    """Plan, measure with a progress bar, write sweep.json, optionally save the best."""
    from fa_bench.commands.run import resolve_device
    from fa_bench.run.plan import now_iso
    from fa_bench.run.runner import RunOptions
    from fa_bench.sweep import tuning
    from fa_bench.sweep.execute import build_doc, execute_points, write_doc

    try:
        device = resolve_device(req.device, req.gpu)
        points, space, smem = plan_points(req, device)
        cache_path = tuning.resolve_path(req.tuning_cache) if req.save_best else None
        if req.save_best and cache_path is None:
            raise SweepInputError("--save-best needs a tuning cache, but it is 'off'")
        timing = req.timing(device == "cpu", gpu_max_time_s=2.0)
        out, lock = _claim_out(req.out or _DEFAULT_OUT / f"{now_iso().replace(':', '')}-sweep")
    except UsageError as exc:
        return print_error(err_console, exc)
    # No telemetry window: configs are ranked by latency alone, and the window would
    # add at least a second to every point.
    opts = RunOptions(device=device, gpu=req.gpu if device == "cuda" else None, timing=timing,
                      timeout_s=req.case_timeout_s, tuning_cache="off",
                      telemetry=False, cpu_threads=req.cpu_threads)  # fmt: skip
    todo = [p for p in points if not p.pruned]
    console.print(f"{len({p.case.id for p in points})} cases × up to {space.size} configs "
                  "(plus the heuristic's and the rules of thumb's where the product lacks them): "
                  f"{len(todo)} to measure, {len(points) - len(todo)} pruned → {out}",
                  markup=False)  # fmt: skip
    started = now_iso()
    budget_s = req.budget_minutes * 60 if req.budget_minutes else None
    built, compiled = _compile_phase(req, points, device, budget_s, console, err_console)
    if budget_s is not None:
        budget_s = max(0.0, budget_s - compiled["wall_s"])
    with RunProgress(console, total=len(todo)) as progress:
        rows, env, stop = execute_points(
            points, out, opts, budget_s=budget_s, on_event=_progress_events(progress), built=built
        )
    run = {"started": started, "ended": now_iso(), "argv": list(req.argv), "device": device,
           "smem_limit_bytes": smem, "budget_minutes": req.budget_minutes, "stopped": stop,
           "points": len(points), "measured": sum(r["status"] != "pruned" for r in rows),
           "timing": timing.__dict__, "compile_phase": compiled}  # fmt: skip
    doc = build_doc(run, env or {}, space.to_dict(), rows)
    path = write_doc(out, doc)
    console.print(best_table(doc))
    console.print(f"sweep: {path}", markup=False)
    _write_page(doc, out / "sweep.html", console=console, err_console=err_console)
    if stop:
        err_console.print(f"[yellow]stopped early ({stop})[/]: {run['measured']} of "
                          f"{len(todo)} configs measured; sweep.json keeps them")  # fmt: skip
    if cache_path is not None:  # --save-best (its 'off' cache was refused above)
        gpus = (env or {}).get("gpus") or []
        gpu = gpus[0]["name"] if device == "cuda" and gpus else "cpu"
        if not _save_best(doc, gpu, path, cache_path, req.min_gain_pct, console, err_console):
            return 2
    lock.release()
    return 130 if stop == "interrupted" else 0


def _progress_events(progress: RunProgress) -> Callable[[str, Point, dict | None], None]:
    """execute_points' events shown on the run's progress bar, the config in its label."""

    def on_event(event: str, point: Point, row: dict | None) -> None:
        if row is None:
            progress.start(point.case)
        else:  # a measured row: its status and error are the case record's
            progress.done(point.case, Status(row["status"]), row["error"])
        if event == "start":
            progress.progress.update(progress.task, description=f"{point.case.label} {point.label}")

    return on_event


def _save_best(
    doc: dict,
    gpu: str,
    path: Path,
    cache_path: Path,
    min_gain_pct: float,
    console: Console,
    err_console: Console,
) -> bool:
    """Write each case's best config to the tuning cache; False (said why) when it fails."""
    from fa_bench.run.plan import now_iso
    from fa_bench.sweep import tuning
    from fa_bench.sweep.execute import best_entries

    try:
        entries, stay = best_entries(doc, gpu, str(path), now_iso(), min_gain_pct / 100)
        tuning.write_cache(cache_path, entries, remove=stay)
    except (tuning.TuningCacheError, OSError) as exc:
        print_error(err_console, f"--save-best: {exc}")
        return False
    console.print(f"tuning cache: {len(entries)} entries saved to {cache_path}; "
                  f"{len(stay)} keys keep the heuristic (best within "
                  f"{min_gain_pct:g}% of it, --min-gain)", markup=False)  # fmt: skip
    return True


def _compile_phase(
    req: SweepRequest,
    points: list,
    device: str,
    budget_s: float | None,
    console: Console,
    err_console: Console,
) -> tuple[dict, dict]:
    """Build every config in parallel first (fa_bench.sweep.precompile); ({}, summary) when
    there is nothing to do. Never fatal: the timing worker builds whatever is missing."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    from fa_bench.sweep.precompile import compile_groups, default_jobs, precompile

    jobs = default_jobs(device) if req.compile_jobs is None else req.compile_jobs
    groups = compile_groups(points)
    n = len(groups)
    if jobs < 1 or n == 0:
        return {}, {"jobs": 0, "groups": n, "wall_s": 0.0, "stopped": None}
    bar = Progress("compiling", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   console=console)  # fmt: skip
    with bar:
        task = bar.add_task("compile", total=n)
        built, summary = precompile(
            groups, device=device, gpu=req.gpu if device == "cuda" else None, jobs=jobs,
            deadline_s=_compile_deadline(budget_s, req.case_timeout_s, n, jobs),
            on_progress=lambda done, _: bar.update(task, completed=done),
        )  # fmt: skip
    console.print(f"compiled {summary.get('built', 0)} configs ({n} groups) with {jobs} "
                  f"processes in {summary['wall_s']:.0f} s; {summary.get('failed', 0)} "
                  "failed and are left to the timing worker")  # fmt: skip
    if summary["stopped"]:
        err_console.print(Text.assemble(("warning:", "yellow"), " compile phase stopped early "
                                        f"({summary['stopped']}); the timing worker builds "
                                        "the rest"))  # fmt: skip
    return built, summary


def _compile_deadline(budget_s: float | None, timeout_s: float, groups: int, jobs: int) -> float:
    """At most half the budget, so that the timing keeps the rest; without one, a generous
    20 s per group per process (H200 builds took 1-3 s), so one hung build cannot stall the
    sweep. What is not built by then is built by the timing worker, under its timeout."""
    if budget_s is not None:
        return budget_s / 2
    return max(timeout_s, 20.0 * groups / jobs)


def _write_page(doc: dict, out: Path, *, console: Console, err_console: Console) -> None:
    """The sweep's HTML page; sweep.json is already written, so a failure only warns."""
    from fa_bench.reports.build import write_report

    try:
        console.print(f"report: {write_report([], out, sweeps=[doc])}", markup=False)
    except Exception as exc:  # the measurements are safe in sweep.json whatever happens here
        err_console.print(Text.assemble(("warning:", "yellow"), f" sweep page not written: {exc}"))


def best_table(doc: dict) -> Table:
    t = Table(title="Best config per case")
    for col in ("case", "best", "TFLOP/s", "default", "TFLOP/s", "gain", "ok/failed/pruned"):
        t.add_column(col)
    for c in doc["cases"]:
        n = c["counts"]
        failed = sum(v for k, v in n.items() if k not in ("ok", "pruned"))
        gain = c["gain_over_default"]
        t.add_row(
            Text(c["case_id"]), Text(c["best"] or "–"), _f(c["best_tflops"]),
            Text(c["default"] or "–"),
            _f(c["default_tflops"]), "–" if gain is None else f"{gain:+.1%}",
            f"{n.get('ok', 0)}/{failed}/{n.get('pruned', 0)}",
        )  # fmt: skip
    return t


def _f(x: float | None) -> str:
    return "–" if x is None else f"{x:.4g}"
