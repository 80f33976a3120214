"""The core of `fa-bench run`, behind the thin Typer command in cli.py."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterable
from contextvars import ContextVar
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TextIO

from rich.console import Console
from rich.panel import Panel
from rich.text import Text

from fa_bench import registry
from fa_bench.case import Case
from fa_bench.commands.flags import CaseFlags, MeasureFlags
from fa_bench.commands.run_summary import summary_doc, write_summary
from fa_bench.console import make_progress, print_summary
from fa_bench.errors import UsageError, print_error
from fa_bench.part_progress import MergeWait, parts_progress
from fa_bench.results.files import (
    JOURNAL,
    WRITE_ERROR_EXIT,
    JournalWriteError,
    read_journal,
    scan_journal,
    write_results,
)
from fa_bench.run import plugin_files
from fa_bench.run.distributed import (
    Merged,
    Rank,
    detect,
    part_dir,
    tie_to_launcher,
    wait_and_merge,
)
from fa_bench.run.folder_lock import FolderLock
from fa_bench.run.interrupts import InterruptGuard
from fa_bench.run.limits import check_case_sizes, check_out_dir, estimate_s, human_duration
from fa_bench.run.multi import (
    Part,
    fake_gpus,
    load_layout,
    parse_gpus,
    run_parts,
    save_layout,
    split,
)
from fa_bench.run.plan import (
    Plan,
    PlanError,
    default_out_dir,
    exit_code,
    finish,
    load_plan,
    new_plan,
    now_iso,
    ordered_records,
)
from fa_bench.run.preflight import cannot_run
from fa_bench.run.runner import RunOptions
from fa_bench.sweep import tuning
from fa_bench.words import plural

# --json: the real stdout, while sys.stdout points at stderr (run_command)
_JSON_OUT: ContextVar[TextIO | None] = ContextVar("run_json_out", default=None)


@dataclass(frozen=True)
class RunRequest(CaseFlags, MeasureFlags):
    impls: tuple[str, ...] = ()
    resume: Path | None = None  # finish this run folder's plan instead of a new one
    l2_flush: bool = True
    cuda_graph: bool = False
    seed: int = 0
    plugins: tuple[str, ...] = ()
    argv: tuple[str, ...] | list[str] = ()
    gpus: str | None = None  # "all" or "0,3,5": one worker per GPU
    spread: bool | None = None  # share the cases among GPUs/ranks; default: replicate
    merge_timeout_s: float = 3600.0  # rank 0 waits this long for the other ranks
    tuning_cache: str | None = None  # path or "off"; None: $FA_BENCH_TUNING_CACHE / default
    telemetry: bool = True  # NVML per case; recorded as unavailable (with why) where it is not
    report: bool = True  # report.html beside results.json (--no-report: skip)
    json: bool = False  # the summary as JSON on stdout, the human output on stderr

    @property
    def selects_cases(self) -> bool:
        axes = (self.suites, self.impls, self.modes, self.dtypes, self.seqlens, self.head_dims,
                self.batch, self.heads, self.kv_heads, self.seqlens_q, self.seqlens_k,
                self.page_sizes, self.ctx_spreads, self.windows, self.softcaps,
                self.varlens)  # fmt: skip
        return any(axes) or self.causal is not None or self.alibi is not None


def resolve_device(requested: str, gpu: int | None) -> str:
    import torch

    if requested == "cpu":
        if gpu is not None:
            raise PlanError("--gpu needs a CUDA device, but --device cpu was given")
        return "cpu"
    has_cuda = torch.cuda.is_available()
    if requested == "cuda" and not has_cuda:
        raise PlanError(
            "--device cuda: no CUDA device is visible (torch.cuda.is_available() is False)"
        )
    if has_cuda:
        count = torch.cuda.device_count()
        if gpu is not None and gpu >= count:
            seen = plural(count, "GPU")
            raise PlanError(f"--gpu {gpu}: only {seen} visible (valid: 0..{count - 1})")
        return "cuda"
    if gpu is not None:
        raise PlanError(f"--gpu {gpu}: no CUDA device is visible")
    return "cpu"


def interleave_impls(cases: Iterable[Case]) -> list[Case]:
    """De-duplicate, then order shape by shape with every implementation of a shape back
    to back (in suite order), so peers are timed under the same conditions and an
    interrupted run holds complete comparisons."""
    unique = list({c.id: c for c in cases}.values())
    first: dict[tuple, int] = {}
    for i, c in enumerate(unique):
        first.setdefault(_without_impl(c), i)
    return sorted(unique, key=lambda c: first[_without_impl(c)])


def _without_impl(c: Case) -> tuple:
    d = c.to_dict()
    d.pop("impl")
    return tuple(d.values())


def _plan_new(req: RunRequest, console: Console) -> tuple[Plan, Path]:
    from fa_bench.suite.expand import Overrides, load_suites

    impls = registry.load(req.plugins)
    plugins = plugin_files.absolute(req.plugins)  # the worker runs in the output folder
    device = resolve_device(req.device, req.gpu)
    suite_names = list(req.suites)
    if not suite_names:
        suite_names = ["standard" if device == "cuda" else "smoke"]
        where = "a GPU" if device == "cuda" else "no GPU (CPU only)"
        console.print(
            f"No --suite given: running [bold]{suite_names[0]}[/], the default on {where}."
        )
    overrides = Overrides.from_flags(req)
    suites = load_suites(suite_names, overrides=overrides, known_impls=list(impls),
                         max_cases=req.max_cases)  # fmt: skip
    cases = interleave_impls(c for s in suites for c in s.cases)
    check_case_sizes(cases, device, req.gpu)
    on_cpu = device == "cpu"
    timing = req.timing(on_cpu, gpu_max_time_s=3.0, flush_l2=req.l2_flush,
                        cuda_graph=req.cuda_graph)  # fmt: skip
    missing = tuning.explicit_missing(req.tuning_cache)
    if missing:
        raise PlanError(f"{missing} (a file `fa-bench sweep --save-best` wrote, or 'off')")
    options = RunOptions(
        device=device, gpu=req.gpu if device == "cuda" else None, timing=timing,
        timeout_s=req.case_timeout_s, seed=req.seed, plugins=plugins,
        plugin_dir=plugin_files.module_dir(plugins),  # where module plugins are found
        # Pinned absolute: the plan records the cache it ran with, for --resume too.
        tuning_cache=tuning.pin(req.tuning_cache), telemetry=req.telemetry,
        cpu_threads=req.cpu_threads,
    )  # fmt: skip
    described = [{"name": s.name, "description": s.description, "source": s.source} for s in suites]
    plan = new_plan(cases, options, described, list(req.argv))
    plan.run[plugin_files.KEY] = plugin_files.record(plugins)  # checked by --resume
    plan.run[plugin_files.PACKAGES_KEY] = plugin_files.packages()  # what code ran
    out = req.out or default_out_dir(suite_names)
    if (out / "plan.json").exists() or (out / "layout.json").exists():
        raise PlanError(f"--out {out}: already holds a run; use --resume {out} or another folder")
    check_out_dir(out)
    return plan, out


def _warn_cannot_run(plan: Plan, err_console: Console) -> None:
    """A warning per chosen implementation that will run none of its cases here; a plan
    in which no case can run is refused (exit 2, README: nothing would be measured,
    and a CI job would pass on an empty run)."""
    found = cannot_run(plan.cases, plan.options.device, plan.options.gpu)
    if found and sum(f.cases for f in found) == len(plan.cases):
        why = "; ".join(f"{f.impl}: {f.reason}" for f in found)
        raise PlanError(f"no case of this plan can run on {plan.options.device} ({why}); "
                        "`fa-bench list impls` shows what runs here")  # fmt: skip
    for f in found:
        err_console.print(Text.assemble(("warning:", "yellow"), " ", f.line), soft_wrap=True)


def _split_new(req: RunRequest, plan: Plan, out: Path, rank: Rank) -> tuple[str, bool, list]:
    """(kind, spread, parts) for a new run: one part, one per --gpus GPU, or this rank's."""
    import torch

    several = rank.distributed or req.gpus is not None
    spread = bool(req.spread) if several else False
    if rank.distributed:
        if req.gpus is not None:
            raise PlanError("--gpus: under torchrun/srun each rank runs on its own local GPU")
        if req.out is None:
            raise PlanError(f"{rank.launcher}: --out must name a folder shared by all ranks")
        # A launcher that pins one GPU per task (srun --gpus-per-task) leaves one visible.
        visible = torch.cuda.device_count() if plan.options.device == "cuda" else 0
        gpu = req.gpu if req.gpu is not None else (0 if visible == 1 else rank.local_rank)
        if plan.options.device == "cuda" and gpu >= visible:
            raise PlanError(f"rank {rank.rank}: local GPU {gpu} is not visible ({visible} are)")
        parts = split(plan, out, "rank", range(rank.world_size), spread)
        part = parts[rank.rank]
        if plan.options.device == "cuda":
            part.plan.options = replace(part.plan.options, gpu=gpu)
        return "rank", spread, [part]
    if req.gpus is not None:
        fake = fake_gpus(plan.options.device)  # tests only: CPU "GPUs" (run/multi.py)
        if (plan.options.device != "cuda" and not fake) or req.gpu is not None:
            raise PlanError("--gpus needs CUDA devices and replaces --gpu")
        indices = parse_gpus(req.gpus, fake or torch.cuda.device_count())
        parts = split(plan, out, "gpu", indices, spread)
        save_layout(out, "gpu", parts, spread)
        return "gpu", spread, parts
    return "single", False, [Part(0, plan, out)]


def _resume(
    req: RunRequest, rank: Rank, out: Path, console: Console
) -> tuple[str, bool, list[Part], Path]:
    if req.selects_cases or req.out or req.gpus is not None:
        raise PlanError(
            "--resume takes the cases and options of the interrupted run; "
            "drop --suite/--impl/.../--gpus and --out"
        )
    layout = load_layout(out)
    if layout is not None:
        kind, spread, parts = layout
    elif rank.distributed:
        folder = part_dir(out, "rank", rank.rank)
        kind, spread, parts = "rank", False, [Part(rank.rank, load_plan(folder), folder)]
        spread = parts[0].plan.run.get("part", {}).get("mode") == "spread"
    else:
        kind, spread, parts = "single", False, [Part(0, load_plan(out), out)]

    def say(line: str) -> None:  # soft wrap: a path is not folded mid-name
        console.print(line, markup=False, highlight=False, soft_wrap=True)

    for i, part in enumerate(parts):
        # Said and checked before any plugin code runs; the parts share their plugins.
        plugin_files.check_resume(part.plan.run, part.plan.options.plugins, req.plugins,
                                  say if i == 0 else lambda line: None,
                                  search=part.plan.options.plugin_dir)  # fmt: skip
    for part in parts:
        registry.load(part.plan.options.plugins, search=part.plan.options.plugin_dir)
        # An older plan may hold a relative file plugin: the worker runs in the run folder.
        absolute = plugin_files.absolute(part.plan.options.plugins)
        part.plan.options = replace(part.plan.options, plugins=absolute)
        part.plan.run["resumed"].append(now_iso())
    return kind, spread, parts, out


def _announce(
    parts: list[Part], kind: str, spread: bool, rank: Rank, out: Path, console: Console
) -> tuple[int, int]:
    """Say where the cases run and how many are left; returns (total, already done)."""
    if parts[0].plan.options.device == "cpu":
        # soft_wrap=False: wrapped inside its box, also on the soft-wrap stderr console
        console.print(Panel("Running on the CPU: these timings show that the cases run and are "
                            "correct; they say nothing about GPU performance.",
                            style="yellow", title="CPU run"), soft_wrap=False)  # fmt: skip
    total = sum(len(p.plan.cases) for p in parts)
    done = sum(
        len({r.id for r in read_journal(p.out)} & {c.id for c in p.plan.cases}) for p in parts
    )
    where = {"single": "", "gpu": f" on GPUs {', '.join(str(p.index) for p in parts)}",
             "rank": f" as rank {rank.rank} of {rank.world_size}"}[kind]  # fmt: skip
    mode = f" ({'spread' if spread else 'replicate'})" if kind != "single" else ""
    console.print(f"{plural(total, 'case')} ({done} already done){where}{mode} → {out}",
                  markup=False)  # fmt: skip
    opts, longest = parts[0].plan.options, max(len(p.plan.cases) for p in parts)  # in parallel
    guess = estimate_s(
        min(longest, total - done), opts.timing, opts.telemetry and opts.device == "cuda"
    )
    console.print(f"estimate: at most about {human_duration(guess)} (docs/suites.md)", markup=False)
    return total, done


def run_command(req: RunRequest, *, console: Console, err_console: Console) -> int:
    """Plan (or resume), execute with progress, write results; returns the exit code."""
    if not req.json:
        return _run(req, console=console, err_console=err_console)
    # stdout holds only the JSON summary: the human output, and anything a plugin prints
    # while it loads or is checked here, goes to stderr meanwhile.
    token = _JSON_OUT.set(sys.stdout)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            return _run(req, console=err_console, err_console=err_console)
    finally:
        _JSON_OUT.reset(token)


def _run(req: RunRequest, *, console: Console, err_console: Console) -> int:
    try:
        rank = detect()
        tie_to_launcher(rank)  # a rank stops (exit 143) when torchrun dies
        if req.resume:
            kind, spread, parts, out = _resume(req, rank, req.resume, console)
        else:
            plan, out = _plan_new(req, console)
            _warn_cannot_run(plan, err_console)
            kind, spread, parts = _split_new(req, plan, out, rank)
        plugin_files.warn_broken(err_console)  # a broken package plugin: the rest runs
        # One writer per folder: a rank owns its part folder, the others the whole one.
        lock = FolderLock(parts[0].out if kind == "rank" else out,
                          "--resume" if req.resume else "--out")  # fmt: skip
        with lock, InterruptGuard() as guard:
            return _execute(req, kind, spread, parts, rank, out, guard,
                            console=console, err_console=err_console)  # fmt: skip
    except UsageError as exc:
        return print_error(err_console, exc)
    except JournalWriteError as exc:
        print_error(err_console, f"{exc.strerror}; every case journaled before it is kept; "
                    f"fix that, then finish with: fa-bench run --resume {out}")  # fmt: skip
        return WRITE_ERROR_EXIT


def _execute(
    req: RunRequest,
    kind: str,
    spread: bool,
    parts: list[Part],
    rank: Rank,
    out: Path,
    guard: InterruptGuard,
    *,
    console: Console,
    err_console: Console,
) -> int:
    """Run the parts, write the results (Ctrl-C held meanwhile) and the report."""
    for p in parts:
        warning = scan_journal(p.out).warning(p.out / JOURNAL)
        if warning:
            err_console.print(Text.assemble(("warning:", "yellow"), " ", warning))
    total, done = _announce(parts, kind, spread, rank, out, console)
    progress = (
        make_progress(console, total=total, already_done=done)
        if kind == "single"
        else parts_progress(console, parts, kind)
    )  # a row or line per GPU / rank
    with progress:
        outcomes = run_parts(parts, progress)
    guard.hold()  # from here a Ctrl-C cannot cut results.json or results.csv short
    written = [
        finish(p.plan, p.out, env, intr) for p, (env, intr) in zip(parts, outcomes, strict=True)
    ]
    interrupted = any(intr for _, intr in outcomes)
    missing: list[int] = []
    if kind == "single":
        json_path, csv_path = written[0]
        records = ordered_records(parts[0].plan, out)
        env = parts[0].plan.run.get("env")  # finish() put the worker's there
    elif kind == "rank" and rank.rank != 0:
        console.print(f"rank {rank.rank}: results in {parts[0].out}; rank 0 merges", markup=False)
        if interrupted:  # a stop signal: this rank's finished cases are kept, say how to go on
            err_console.print(Text(f"interrupted ({guard.reason}); {_resume_hint(kind, out)}",
                                   style="yellow"))  # fmt: skip
            return guard.exit_code
        return exit_code(ordered_records(parts[0].plan, parts[0].out))
    else:
        merged = _merge(req, kind, spread, parts, rank, out, guard, interrupted, console)
        if merged is None:
            err_console.print(Text(f"interrupted while merging; this part's results are in "
                                   f"{parts[0].out}", style="yellow"))  # fmt: skip
            return guard.exit_code
        missing = merged.missing
        json_path, csv_path = write_results(out, merged.doc)
        records = merged.doc.cases
        env = merged.doc.env  # each part's under env.parts, for its own records
    print_summary(console, records, env)
    console.print(f"results: {json_path}\n         {csv_path}", markup=False,  # paths: not markup
                  soft_wrap=True)  # fmt: skip
    if missing:
        err_console.print(f"[red]missing {kind}s[/]: {missing} did not finish in time")
    # A signal beyond the one that stopped the cases came while the results were written.
    extra = guard.count - (1 if interrupted else 0) > 0
    interrupted = interrupted or extra
    report = None
    if req.report:
        report = _report(json_path, guard, extra, console=console, err_console=err_console)
    if interrupted:
        kept = f": {len(records)} of {plural(total, 'case')} kept; {_resume_hint(kind, out)}"
        err_console.print(Text.assemble((guard.headline, "yellow"), kept))
        code = guard.exit_code  # 128 + the signal: 130 Ctrl-C, 143 SIGTERM, 129 SIGHUP
    else:
        code = 1 if missing else exit_code(records)
    if req.json:
        files = {"results_json": json_path, "results_csv": csv_path, "report_html": report}
        doc = summary_doc(records, out=out, total=total, written=files, exit_code=code,
                          interrupted=interrupted, missing=missing, env=env)  # fmt: skip
        write_summary(_JSON_OUT.get() or sys.stdout, doc)
    return code


def _resume_hint(kind: str, out: Path) -> str:
    if kind == "rank":  # every rank finishes its own part: relaunch them all
        return f"finish with the same launcher (torchrun/srun) running: fa-bench run --resume {out}"
    return f"finish with: fa-bench run --resume {out}"


def _merge(
    req: RunRequest, kind: str, spread: bool, parts: list[Part], rank: Rank, out: Path,
    guard: InterruptGuard, interrupted: bool, console: Console,
) -> Merged | None:  # fmt: skip
    """The parts merged, or None when a stop signal ended the wait for the other ranks
    (which can be long: unlike the writing of results, it may be interrupted). Rank 0
    says whom it waits for; once stopped itself, it merges what has ended, without waiting."""
    indices = [p.index for p in parts] if kind == "gpu" else range(rank.world_size)
    folders = [(i, part_dir(out, kind, i)) for i in indices]
    timeout = req.merge_timeout_s if kind == "rank" and not interrupted else 0.0
    on_wait = MergeWait(console, dict(folders), timeout)
    guard.allow()
    try:
        return wait_and_merge(out, folders, mode="spread" if spread else "replicate",
                              timeout_s=timeout, on_wait=on_wait)  # fmt: skip
    except KeyboardInterrupt:
        return None
    finally:
        guard.hold()


def _report(json_path: Path, guard: InterruptGuard, skip: bool, *, console: Console,
            err_console: Console) -> Path | None:  # fmt: skip
    """report.html (its path), unless Ctrl-C was pressed again meanwhile: the results are written,
    so the page is what gives way (`fa-bench report` writes it later)."""
    from fa_bench.commands.report import write_run_report

    skipped = Text(f"report skipped ({guard.reason}); write it with: fa-bench report {json_path}",
                   style="yellow")  # fmt: skip
    if skip:
        err_console.print(skipped)
        return None
    guard.allow()
    try:
        return write_run_report(json_path, console=console, err_console=err_console)
    except KeyboardInterrupt:
        err_console.print(skipped)
        return None
    finally:
        guard.hold()
