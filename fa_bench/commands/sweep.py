"""`fa-bench sweep`: time our Triton kernel over its tiling space (docs/sweep.md)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import ClassVar

from rich.console import Console
from rich.text import Text

from fa_bench.commands.flags import CaseFlags, MeasureFlags
from fa_bench.errors import UsageError, print_error
from fa_bench.results.files import JOURNAL
from fa_bench.run.folder_lock import FolderLock
from fa_bench.run.interrupts import InterruptGuard
from fa_bench.run.limits import check_case_count, check_case_sizes, check_out_dir
from fa_bench.run.runner import RunOptions
from fa_bench.sweep.gluon_space import GluonSpace
from fa_bench.sweep.plan import (
    CPU_SPACE,
    SWEEP_PLAN,
    SweepPlan,
    check_space_not_all_pruned,
    describe_estimate,
    journal_rows,
    load_plan,
    pruned_summary,
    space_of,
    write_plan,
)
from fa_bench.sweep.precompile import compile_phase
from fa_bench.sweep.progress import SweepProgress, show_best
from fa_bench.sweep.space import Point, SweepSpace
from fa_bench.sweep.vocab import SWEEP_MODES
from fa_bench.words import plural

_DEFAULT_OUT = Path("fa-bench-out")
_SPACE = SweepSpace()  # the default space on a GPU: its axes are the flags' defaults
# With --resume only these may be given: a stop rule for this call, not how it measures.
_RESUME_FLAGS = {"--resume", "--budget-minutes"}


@dataclass(frozen=True)
class SweepRequest(CaseFlags, MeasureFlags):
    modes: tuple[str, ...] = SWEEP_MODES
    # None: the device's default space (the GPU's _SPACE, the CPU interpreter's CPU_SPACE).
    block_m: tuple[int, ...] | None = None
    block_n: tuple[int, ...] | None = None
    warps: tuple[int, ...] | None = None
    stages: tuple[int, ...] | None = None
    kernel: str = "tl"  # the forward kernel swept: "tl" (its tiles) or "gluon" (launches)
    gluon_roles: tuple[str, ...] | None = None  # None: every candidate role
    gluon_block_n: tuple[int, ...] | None = None  # None: each candidate's own
    gluon_stages: tuple[int, ...] | None = None
    budget_minutes: float | None = None
    save_best: bool = False
    min_gain_pct: float = 3.0  # --save-best keeps the heuristic below this gain
    rules: bool = True  # also measure each rule of thumb's tile
    tuning_cache: str | None = None
    compile_jobs: int | None = None  # None: sweep_compile.default_jobs for the device
    resume: Path | None = None  # finish this sweep folder's plan instead of a new one
    given: tuple[str, ...] = ()  # the flags given on the command line (--resume refuses most)
    argv: tuple[str, ...] | list[str] = ()
    # One config is one build and one kernel, and a sweep has hundreds: a hung one should
    # cost less than a run's case may.
    DEFAULT_TIMEOUT_S: ClassVar[float] = 300.0

    def space(self, device: str) -> SweepSpace:
        """The requested space; an axis not given takes the device's default."""
        default = CPU_SPACE if device == "cpu" else _SPACE
        axes = {a: getattr(self, a) or getattr(default, a) for a in SweepSpace.AXES}
        try:
            return SweepSpace(**axes)
        except ValueError as exc:  # SweepSpace's checks name the flag (--block-m 0)
            raise SweepInputError(str(exc)) from None


class SweepInputError(UsageError, ValueError):
    """Bad flag values: exit code 2 with the message."""


def _smem_limit(device: str, gpu: int | None) -> int | None:
    if device != "cuda":
        return None
    import torch

    from fa_bench.sweep.space import H200_SMEM_BYTES

    props = torch.cuda.get_device_properties(gpu or 0)
    return int(getattr(props, "shared_memory_per_block_optin", 0) or H200_SMEM_BYTES)


def check_device(req: SweepRequest, device: str) -> None:
    """No GPU and no --device cpu: refuse (exit 2). The sweep ranks tile configs by speed,
    and under Triton's CPU interpreter every program runs as numpy: the ranking says
    nothing about any GPU. `--device cpu` runs it anyway, as a check that it works."""
    if device == "cpu" and req.device != "cpu":
        raise SweepInputError(
            "no CUDA device is visible: a sweep ranks our Triton kernel's tile configs by "
            "speed, and on a CPU the kernel runs in Triton's interpreter (numpy), whose "
            "timings say nothing about any GPU. To check that the sweep works here, pass "
            "--device cpu: it sweeps a tiny space (--block-m 16,32 --block-n 16,32 --warps 4 "
            "--stages 1) over the smoke suite's shapes, a few minutes (docs/sweep.md)"
        )


def plan_points(
    req: SweepRequest, device: str
) -> tuple[list[Point], SweepSpace | GluonSpace, int | None]:
    """The sweep's points, its space and the shared-memory limit used for pruning."""
    from fa_bench import registry
    from fa_bench.commands import sweep_gluon
    from fa_bench.suite.expand import Overrides, load_suites
    from fa_bench.sweep.space import sweep_case, sweep_points

    bad = [m for m in req.modes if m not in SWEEP_MODES]
    if bad:
        raise SweepInputError(f"--mode {bad[0]}: valid sweep modes are {', '.join(SWEEP_MODES)}")
    req = replace(req, modes=sweep_gluon.check_flags(req))  # --kernel, the other's flags
    space = req.space(device)
    registry.load()
    overrides = Overrides.from_flags(req, impls=("triton",))
    names = list(req.suites) or ["standard" if device == "cuda" else "smoke"]
    suites = load_suites(
        names, overrides=overrides, known_impls=registry.names(), max_cases=req.max_cases
    )
    cases = list({c.id: sweep_case(c) for s in suites for c in s.cases}.values())
    variant = next((c for c in cases if c.is_variant), None)
    if variant is not None:
        # The sweep tunes the dense kernel's tiles; our kernel has no variants yet (issue 19).
        raise SweepInputError(
            f"sweep tunes dense attention only; {variant.id} is a variant case (window, "
            "alibi, softcap or varlen): give a suite without variant axes"
        )
    check_case_sizes(cases, device, req.gpu)
    capability = None
    if device == "cuda":
        import torch

        capability = torch.cuda.get_device_capability(req.gpu or 0)
    smem = _smem_limit(device, req.gpu)
    if req.kernel == "gluon":
        points_g, space_g = sweep_gluon.plan_gluon(req, cases, smem)
        return points_g, space_g, smem
    points = sweep_points(
        cases, space, capability=capability, smem_limit_bytes=smem, with_rules=req.rules
    )
    check_case_count(len(points), req.max_cases, "the cases × configs", "points")
    check_space_not_all_pruned(points, space, set(req.given))
    return points, space, smem


def _claim_out(out: Path, flag: str = "--out") -> FolderLock:
    """The output folder, checked before any config is built (not a sweep already, not a
    file or an unwritable place) and locked: one writer per folder, released when the lock
    is dropped (the command returns) or the process exits."""
    if flag == "--out":
        for name in (SWEEP_PLAN, "sweep.json"):
            if (out / name).exists():
                raise SweepInputError(
                    f"--out {out}: already holds a sweep ({name}); finish it with "
                    f"--resume {out}, or name another folder"
                )
    check_out_dir(out, flag)
    return FolderLock(out, flag).acquire()


def _new_plan(req: SweepRequest) -> tuple[SweepPlan, Path, FolderLock]:
    """Plan a new sweep, claim its folder and write sweep-plan.json there."""
    from fa_bench.commands import sweep_gluon
    from fa_bench.commands.run import resolve_device
    from fa_bench.run.plan import now_iso
    from fa_bench.sweep import tuning
    from fa_bench.sweep.precompile import default_jobs

    req = replace(req, modes=sweep_gluon.check_flags(req))  # flags first: they need no device
    device = resolve_device(req.device, req.gpu)
    if req.kernel == "gluon":  # a reason it cannot run here, before the suites are read
        sweep_gluon.check_gluon_device(req, device)
    else:
        check_device(req, device)
    points, space, smem = plan_points(req, device)
    cache_path = tuning.resolve_path(req.tuning_cache) if req.save_best else None
    if req.save_best and cache_path is None:
        raise SweepInputError("--save-best needs a tuning cache, but it is 'off'")
    timing = req.timing(device == "cpu", gpu_max_time_s=2.0)
    # No telemetry window: configs are ranked by latency alone, and the window would
    # add at least a second to every point.
    opts = RunOptions(device=device, gpu=req.gpu if device == "cuda" else None, timing=timing,
                      timeout_s=req.case_timeout_s, tuning_cache="off",
                      telemetry=False, cpu_threads=req.cpu_threads)  # fmt: skip
    out = req.out or _DEFAULT_OUT / f"{now_iso().replace(':', '')}-sweep"
    lock = _claim_out(out)
    jobs = default_jobs(device) if req.compile_jobs is None else req.compile_jobs
    # Absolute: a --resume from another folder saves to the same cache.
    cache = str(cache_path.absolute()) if cache_path else None
    run = {"started": now_iso(), "argv": list(req.argv), "device": device,
           "smem_limit_bytes": smem, "space": space.to_dict(), "rules": req.rules,
           "budget_minutes": req.budget_minutes, "save_best": req.save_best,
           "min_gain_pct": req.min_gain_pct, "compile_jobs": jobs, "tuning_cache": cache,
           "resumed": [], "kernel": req.kernel}  # fmt: skip
    plan = SweepPlan(run=run, options=opts, points=points)
    write_plan(out, plan)
    return plan, out, lock


def _resume_plan(req: SweepRequest) -> tuple[SweepPlan, Path, FolderLock]:
    """The interrupted sweep's own plan, its folder locked; any flag that would change
    what it measures is refused (exit 2)."""
    from fa_bench.run.plan import now_iso

    out = req.resume
    assert out is not None
    extra = [f for f in req.given if f not in _RESUME_FLAGS]
    if extra:
        raise SweepInputError(
            f"--resume takes the points and options of the interrupted sweep; drop "
            f"{', '.join(extra)} (only --budget-minutes may be given with it)"
        )
    plan = load_plan(out)
    if plan.options.device == "cuda":  # planned on a GPU: this machine must have it too
        from fa_bench.commands.run import resolve_device

        try:
            resolve_device("cuda", plan.options.gpu)
        except UsageError as exc:
            raise SweepInputError(f"--resume {out}: planned on GPU {plan.options.gpu or 0}, "
                                  f"but here {str(exc).split(': ', 1)[-1]}") from None  # fmt: skip
    lock = FolderLock(out, "--resume").acquire()
    if req.budget_minutes is not None:
        plan.run["budget_minutes"] = req.budget_minutes
    plan.run["resumed"].append(now_iso())
    write_plan(out, plan)
    return plan, out, lock


def sweep_command(req: SweepRequest, *, console: Console, err_console: Console) -> int:
    """Plan (or resume), measure with progress, write sweep.json, optionally save the best."""
    try:
        plan, out, lock = _resume_plan(req) if req.resume is not None else _new_plan(req)
    except UsageError as exc:
        return print_error(err_console, exc)
    try:
        with InterruptGuard() as guard:
            return _execute(plan, out, guard, console=console, err_console=err_console)
    finally:
        lock.release()


def _announce(plan: SweepPlan, out: Path, done: dict[str, dict], console: Console) -> list[Point]:
    """Say what the sweep measures and about how long it takes; returns the points left."""
    from fa_bench.sweep.precompile import compile_groups

    points, run = plan.points, plan.run
    left = [p for p in points if p.id not in done]
    measure = [p for p in left if not p.pruned]
    space = space_of(run)
    say = lambda line: console.print(line, markup=False, highlight=False, soft_wrap=True)  # noqa: E731
    if plan.options.device == "cpu":
        say("CPU: the kernel runs in Triton's interpreter; these timings check that the "
            "sweep works, they do not rank tiles for any GPU.")  # fmt: skip
    cases = plural(len({p.case.id for p in points}), "case")
    extra = ("the heuristic's launch" if isinstance(space, GluonSpace) else
             "the heuristic's and the rules of thumb's")  # fmt: skip
    say(f"{cases} × up to {plural(space.size, 'config')} (plus {extra} where the product lacks "
        f"them) = {plural(len(points), 'point')}: "
        f"{sum(not p.pruned for p in points)} to measure, {pruned_summary(points)} "
        f"→ {out}")  # fmt: skip
    if done:
        again = "" if measure else " (sweep.json is written again from them)"
        say(f"resuming: {plural(len(done), 'point')} already in the journal, {len(measure)} "
            f"to measure{again}")  # fmt: skip
    groups = len(compile_groups(left)) if run["compile_jobs"] else 0
    say(describe_estimate(len(measure), groups, run["compile_jobs"], plan.options,
                          run["budget_minutes"]))  # fmt: skip
    return left


def _execute(
    plan: SweepPlan, out: Path, guard: InterruptGuard, *, console: Console, err_console: Console
) -> int:
    """Build, measure, then write sweep.json (signals held meanwhile) and the page."""
    from fa_bench.sweep.execute import build_doc, execute_points, write_doc

    done, skipped = journal_rows(out, plan.points)
    if skipped:
        err_console.print(Text.assemble(("warning:", "yellow"), f" {out / JOURNAL}: "
                                        f"{plural(skipped, 'line')} skipped (torn or not this "
                                        "sweep's); their points are measured again"))  # fmt: skip
    left = _announce(plan, out, done, console)
    run = plan.run
    budget_s = run["budget_minutes"] * 60 if run["budget_minutes"] else None
    stop: str | None = None
    env: dict | None = None
    try:
        built, compiled = compile_phase(run["compile_jobs"], left, plan.options, budget_s,
                                         console, err_console)  # fmt: skip
    except KeyboardInterrupt:
        built, compiled, stop = {}, {"stopped": "interrupted"}, "interrupted"
    if budget_s is not None:
        budget_s = max(0.0, budget_s - compiled.get("wall_s", 0.0))
    measured = [p for p in plan.points if not p.pruned]
    if stop is None:
        already = sum(p.id in done for p in measured)
        with SweepProgress(console, total=len(measured), already_done=already) as progress:
            for row in done.values():
                progress.seen(row)
            new, env, stop = execute_points(left, out, plan.options, budget_s=budget_s,
                                            on_event=progress, built=built)  # fmt: skip
        done.update((r["id"], r) for r in new)
    guard.hold()  # from here a signal cannot cut sweep.json short
    rows = [done[p.id] for p in plan.points if p.id in done]  # plan order, each point once
    env = env or _earlier_env(out)
    doc_run = _doc_run(plan, rows, stop, compiled)
    doc = build_doc(doc_run, env or {}, run["space"], rows)
    path = write_doc(out, doc)
    show_best(doc, console)
    console.print(f"sweep: {path}", markup=False, soft_wrap=True)
    if stop != "interrupted":
        _write_page(doc, out / "sweep.html", console=console, err_console=err_console)
    if stop:
        err_console.print(Text.assemble(
            (guard.headline if stop == "interrupted" else f"stopped early ({stop})", "yellow"),
            f": {doc_run['measured']} of {len(measured)} configs measured, kept in {path}; "
            f"finish with: fa-bench sweep --resume {out}"))  # fmt: skip
    if run["tuning_cache"] is not None and stop != "interrupted":  # --save-best
        gpus = (env or {}).get("gpus") or []
        gpu = gpus[0]["name"] if plan.options.device == "cuda" and gpus else "cpu"
        cache = Path(run["tuning_cache"])
        if not _save_best(doc, gpu, path, cache, run["min_gain_pct"], console, err_console):
            return 2
    # 128 + the signal that stopped it: 130 Ctrl-C, 143 SIGTERM, 129 SIGHUP.
    return guard.exit_code if stop == "interrupted" else 0


def _doc_run(plan: SweepPlan, rows: list[dict], stop: str | None, compiled: dict) -> dict:
    """sweep.json's `run`: the plan's, with how this call ended."""
    from fa_bench.run.plan import now_iso

    run = plan.run
    return {"started": run["started"], "resumed": run["resumed"], "ended": now_iso(),
            "argv": run["argv"], "device": plan.options.device,
            "smem_limit_bytes": run["smem_limit_bytes"], "budget_minutes": run["budget_minutes"],
            "stopped": stop, "points": len(plan.points), "kernel": run.get("kernel", "tl"),
            "measured": sum(r["status"] != "pruned" for r in rows),
            "timing": plan.options.timing.__dict__, "compile_phase": compiled}  # fmt: skip


def _earlier_env(out: Path) -> dict | None:
    """The env of the sweep.json an earlier call wrote (a resume that measured nothing)."""
    from fa_bench.sweep.execute import SweepFileError, load_sweep

    try:
        return load_sweep(out / "sweep.json")["env"]
    except SweepFileError:
        return None


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
    console.print(f"tuning cache: {plural(len(entries), 'entry', 'entries')} saved to "
                  f"{cache_path}; {plural(len(stay), 'key')} keep the heuristic (best within "
                  f"{min_gain_pct:g}% of it, --min-gain)", markup=False)  # fmt: skip
    return True


def _write_page(doc: dict, out: Path, *, console: Console, err_console: Console) -> None:
    """The sweep's HTML page; sweep.json is already written, so a failure only warns."""
    from fa_bench.reports.build import write_report

    try:
        console.print(
            f"report: {write_report([], out, sweeps=[doc])}", markup=False, soft_wrap=True
        )
    except Exception as exc:  # the measurements are safe in sweep.json whatever happens here
        err_console.print(Text.assemble(("warning:", "yellow"), f" sweep page not written: {exc}"))
