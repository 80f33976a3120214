"""What `fa-bench run` will run: the request, a new plan (or the one `--resume` finishes)
and its parts (the one folder, one per `--gpus` GPU, or this rank's). commands/run.py runs
them; sweep.py shares `resolve_device`."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from rich.console import Console
from rich.text import Text

from fa_bench import registry
from fa_bench.case import Case
from fa_bench.commands.flags import CaseFlags, MeasureFlags
from fa_bench.run import plugin_files
from fa_bench.run.distributed import Rank, part_dir
from fa_bench.run.limits import check_case_sizes, check_out_dir
from fa_bench.run.multi import Part, fake_gpus, load_layout, parse_gpus, save_layout, split
from fa_bench.run.plan import Plan, PlanError, default_out_dir, load_plan, new_plan, now_iso
from fa_bench.run.preflight import cannot_run
from fa_bench.run.runner import RunOptions
from fa_bench.sweep import tuning
from fa_bench.words import plural


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


def plan_new(req: RunRequest, console: Console) -> tuple[Plan, Path]:
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


def warn_cannot_run(plan: Plan, err_console: Console) -> None:
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


def split_new(req: RunRequest, plan: Plan, out: Path, rank: Rank) -> tuple[str, bool, list]:
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


def resume_plan(
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
