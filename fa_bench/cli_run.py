"""The core of `fa-bench run`, behind the thin Typer command in cli.py."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.panel import Panel

from fa_bench import registry
from fa_bench.case import Case
from fa_bench.console import RunProgress, failures_table, summary_table
from fa_bench.plan import (
    Plan,
    PlanError,
    default_out_dir,
    exit_code,
    finish,
    load_plan,
    new_plan,
    now_iso,
    ordered_records,
    run_plan,
)
from fa_bench.results import read_journal
from fa_bench.runner import RunOptions
from fa_bench.timing import TimingConfig


@dataclass(frozen=True)
class RunRequest:
    suites: tuple[str, ...] = ()
    impls: tuple[str, ...] = ()
    modes: tuple[str, ...] = ()
    dtypes: tuple[str, ...] = ()
    seqlens: tuple[int, ...] = ()
    head_dims: tuple[int, ...] = ()
    batch: tuple[int, ...] = ()
    heads: tuple[int, ...] = ()
    kv_heads: tuple[int, ...] = ()
    causal: bool | None = None
    device: str = "auto"
    gpu: int | None = None
    out: Path | None = None
    resume: Path | None = None
    timeout_s: float = 600.0
    target_noise: float = 0.01
    min_samples: int = 10
    max_time_s: float | None = None
    l2_flush: bool = True
    cuda_graph: bool = False
    seed: int = 0
    plugins: tuple[str, ...] = ()
    argv: tuple[str, ...] | list[str] = ()

    @property
    def selects_cases(self) -> bool:
        axes = (self.suites, self.impls, self.modes, self.dtypes, self.seqlens, self.head_dims,
                self.batch, self.heads, self.kv_heads)  # fmt: skip
        return any(axes) or self.causal is not None


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
            raise PlanError(f"--gpu {gpu}: only {count} GPU(s) visible (valid: 0..{count - 1})")
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
    from fa_bench.suite import Overrides, load_suites

    impls = registry.load(req.plugins)
    device = resolve_device(req.device, req.gpu)
    suite_names = list(req.suites)
    if not suite_names:
        suite_names = ["standard" if device == "cuda" else "smoke"]
        where = "a GPU" if device == "cuda" else "no GPU (CPU only)"
        console.print(
            f"No --suite given: running [bold]{suite_names[0]}[/], the default on {where}."
        )
    overrides = Overrides(
        impls=req.impls or None, modes=req.modes or None, dtypes=req.dtypes or None,
        seqlens=req.seqlens or None, head_dims=req.head_dims or None, batch=req.batch or None,
        heads=req.heads or None, kv_heads=req.kv_heads or None, causal=req.causal,
    )  # fmt: skip
    suites = load_suites(suite_names, overrides=overrides, known_impls=list(impls))
    cases = interleave_impls(c for s in suites for c in s.cases)
    on_cpu = device == "cpu"
    timing = TimingConfig(
        target_noise=req.target_noise,
        min_samples=req.min_samples,
        min_time_s=0.05 if not on_cpu else 0.02,
        max_time_s=req.max_time_s or (1.0 if on_cpu else 3.0),
        flush_l2=req.l2_flush,
        cuda_graph=req.cuda_graph,
    )
    options = RunOptions(
        device=device, gpu=req.gpu if device == "cuda" else None, timing=timing,
        timeout_s=req.timeout_s, seed=req.seed, plugins=req.plugins,
    )  # fmt: skip
    described = [{"name": s.name, "description": s.description, "source": s.source} for s in suites]
    plan = new_plan(cases, options, described, list(req.argv))
    out = req.out or default_out_dir(suite_names)
    if (out / "plan.json").exists():
        raise PlanError(f"--out {out}: already holds a run; use --resume {out} or another folder")
    return plan, out


def run_command(req: RunRequest, *, console: Console, err_console: Console) -> int:
    """Plan (or resume), execute with progress, write results; returns the exit code."""
    from fa_bench.suite import SuiteError

    try:
        if req.resume:
            if req.selects_cases or req.out:
                raise PlanError("--resume takes the cases and options of the interrupted run; "
                                "drop --suite/--impl/... and --out")  # fmt: skip
            out = req.resume
            plan = load_plan(out)
            registry.load(plan.options.plugins)
            plan.run["resumed"].append(now_iso())
        else:
            plan, out = _plan_new(req, console)
    except (PlanError, SuiteError, registry.UnknownImpl, registry.PluginError, ValueError) as exc:
        err_console.print(f"[bold red]error:[/] {exc}", highlight=False)
        return 2

    if plan.options.device == "cpu":
        console.print(Panel("Running on the CPU: these timings show that the cases run and are "
                            "correct; they say nothing about GPU performance.",
                            style="yellow", title="CPU run"))  # fmt: skip
    done = (
        len({r["id"] for r in read_journal(out)} & {c.id for c in plan.cases}) if req.resume else 0
    )
    console.print(f"{len(plan.cases)} cases ({done} already done) → {out}")
    with RunProgress(console, total=len(plan.cases), already_done=done) as progress:
        env, interrupted = run_plan(plan, out, progress)
    json_path, csv_path = finish(plan, out, env, interrupted)
    records = ordered_records(plan, out)
    console.print(summary_table(records))
    failures = failures_table(records)
    if failures is not None:
        console.print(failures)
    console.print(f"results: {json_path}\n         {csv_path}")
    if interrupted:
        kept = f"{len(records)} of {len(plan.cases)} cases kept"
        err_console.print(
            f"[yellow]interrupted[/]: {kept}; finish with: fa-bench run --resume {out}"
        )
        return 130
    return exit_code(records)
