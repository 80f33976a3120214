"""The `fa-bench` command line: the one Typer surface, thin commands over fa_bench.commands.

Options are declared in fa_bench/commands/options.py; each command here maps them onto
a keyword-only core that returns the exit code. A `UsageError` escaping a core is the
user's mistake (exit 2); any other exception is a bug (exit 1, traceback under --debug).
"""

from __future__ import annotations

import os
import sys
import traceback
from typing import Any

import typer
from rich.console import Console
from typer.core import TyperGroup

from fa_bench.case import DType, Mode
from fa_bench.commands import options as o
from fa_bench.commands import sweep_options as so
from fa_bench.commands import variant_options as vo
from fa_bench.commands import view_options as v
from fa_bench.commands.compare import compare_command
from fa_bench.commands.flags import CaseFlags, MeasureFlags
from fa_bench.commands.lists import (
    choice_items,
    float_items,
    int_items,
    page_size_items,
    split_items,
)
from fa_bench.commands.report import report_command
from fa_bench.commands.run import RunRequest, run_command
from fa_bench.commands.surface import is_usage_error, tidy_params, usage_error_message
from fa_bench.commands.sweep import SweepRequest, sweep_command
from fa_bench.compare.core import FailOn
from fa_bench.errors import BUG_EXIT, UsageError, print_error
from fa_bench.results.files import WRITE_ERROR_EXIT, JournalWriteError

console = Console()
err_console = Console(stderr=True, soft_wrap=True)
_ARGV, _DEBUG = "fa_bench.argv", "fa_bench.debug"  # keys in click's shared ctx.meta


class _Group(TyperGroup):
    """Keeps the arguments it parsed (for results' run.argv) and maps what escapes a
    command to an exit code."""

    def make_context(
        self, info_name: str | None, args: list[str], parent: Any = None, **extra: Any
    ) -> Any:  # fmt: skip
        argv = ["fa-bench", *args]  # copied before click consumes the list
        try:
            ctx = super().make_context(info_name, args, parent=parent, **extra)
        except Exception as exc:  # `fa-bench --bogus`: click's usage error, in our style
            if is_usage_error(exc):
                raise typer.Exit(print_error(err_console, usage_error_message(exc))) from None
            raise
        ctx.meta[_ARGV] = argv
        return ctx

    def get_params(self, ctx: Any) -> list[Any]:
        params = super().get_params(ctx)
        tidy_params(params)  # the help's placeholders (commands/surface.py)
        return params  # type: ignore[no-any-return]

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        command = super().get_command(ctx, cmd_name)
        if command is not None:
            tidy_params(command.get_params(ctx))  # its help option too (click caches it)
        return command

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except UsageError as exc:
            raise typer.Exit(print_error(err_console, exc)) from None
        except BrokenPipeError:  # `fa-bench list impls | head`: click's quiet exit, no "bug"
            raise
        except JournalWriteError as exc:  # `run` says more itself; here `sweep` and the rest
            print_error(err_console, f"{exc.strerror}; what was written before it is kept")
            raise typer.Exit(WRITE_ERROR_EXIT) from None
        except Exception as exc:
            # Exit, Abort and usage errors are click's own flow (typer may vendor click as
            # typer._click, so match them by module, not by class).
            if is_usage_error(exc):  # a subcommand's flag: one plain line, exit 2
                message = usage_error_message(exc, ctx.invoked_subcommand)
                raise typer.Exit(print_error(err_console, message)) from None
            if type(exc).__module__.split(".")[0] in ("click", "typer"):
                raise
            if ctx.meta.get(_DEBUG):
                err_console.print(traceback.format_exc(), markup=False, highlight=False)
            what = f"{type(exc).__name__}: {exc}"  # print_error shows it as plain text
            print_error(err_console, f"internal error (a bug in fa-bench): {what}; rerun with "
                        "`fa-bench --debug ...` for the traceback")  # fmt: skip
            raise typer.Exit(BUG_EXIT) from None


app = typer.Typer(
    name="fa-bench",
    cls=_Group,
    help="Benchmark and profile attention implementations: latency with its noise, TFLOP/s, "
    "model HBM bandwidth, peak memory and accuracy against a float64 reference.",
    context_settings={"help_option_names": ["-h", "--help"]},
    no_args_is_help=True,
    rich_markup_mode="rich",
    pretty_exceptions_enable=False,
)


@app.callback()
def _global(
    ctx: typer.Context, debug: o.Debug = False,
    version: o.Version = False,  # its callback prints the version and exits
) -> None:  # fmt: skip
    ctx.meta[_DEBUG] = debug


def parsed_argv(ctx: typer.Context) -> list[str]:
    """`fa-bench` and the arguments the app parsed (not sys.argv: in-process it is the
    caller's)."""
    return list(ctx.meta[_ARGV])


def _axes(
    mode: list[str] | None, dtype: list[str] | None, seqlen: list[str] | None,
    head_dim: list[str] | None, batch: list[str] | None, heads: list[str] | None,
    kv_heads: list[str] | None, *, modes: tuple[str, ...] = (),
) -> dict[str, Any]:  # fmt: skip
    """The case axes `run` and `sweep` share, each flag repeated or a comma list (or both);
    a bad element is exit 2 naming the flag (commands/lists.py). `modes`: the default."""
    return {
        "modes": choice_items("--mode", mode, Mode) or modes,
        "dtypes": choice_items("--dtype", dtype, DType),
        "seqlens": int_items("--seqlen", seqlen), "head_dims": int_items("--head-dim", head_dim),
        "batch": int_items("--batch", batch), "heads": int_items("--heads", heads),
        "kv_heads": int_items("--kv-heads", kv_heads),
    }  # fmt: skip


def _decode_axes(
    seqlen_q: list[str] | None, seqlen_k: list[str] | None, page_size: list[str] | None,
    ctx_spread: list[str] | None,
) -> dict[str, Any]:  # fmt: skip
    """run's axes for decode (query and key lengths apart, page sizes, spreads); their
    ranges are the suite's checks, which name the flag."""
    return {
        "seqlens_q": int_items("--seqlen-q", seqlen_q),
        "seqlens_k": int_items("--seqlen-k", seqlen_k),
        "page_sizes": page_size_items("--page-size", page_size),
        "ctx_spreads": float_items("--ctx-spread", ctx_spread),
    }


def given_flags(ctx: typer.Context) -> tuple[str, ...]:
    """The options given on the command line, not left at their defaults (long names)."""
    # By name: typer vendors its own click, whose ParameterSource is not click's.
    given = ("COMMANDLINE", "ENVIRONMENT")
    source = lambda name: getattr(ctx.get_parameter_source(name), "name", "")  # noqa: E731
    return tuple(max(p.opts, key=len) for p in ctx.command.params
                 if p.name and source(p.name) in given)  # fmt: skip


@app.command()
def run(
    ctx: typer.Context, suite: o.Suites = None, impl: o.Impls = None, mode: o.Modes = None,
    dtype: o.DTypes = None, seqlen: o.Seqlens = None, head_dim: o.HeadDims = None,
    batch: o.Batches = None, heads: o.Heads = None, kv_heads: o.KvHeads = None,
    causal: o.Causal = None, seqlen_q: o.SeqlensQ = None, seqlen_k: o.SeqlensK = None,
    page_size: o.PageSizes = None, ctx_spread: o.CtxSpreads = None,
    window: vo.Windows = None, alibi: vo.Alibi = None, softcap: vo.Softcaps = None,
    varlen: vo.Varlens = None,
    device: o.Device = o.DeviceChoice.AUTO, gpu: o.Gpu = None,
    out: o.Out = None, resume: o.Resume = None, timeout: o.Timeout = None,
    target_noise: o.TargetNoise = MeasureFlags.target_noise,
    min_samples: o.MinSamples = MeasureFlags.min_samples, max_time: o.MaxTime = None,
    warmup: o.Warmup = None, l2_flush: o.L2Flush = True, cuda_graph: o.CudaGraph = False,
    seed: o.Seed = 0, plugin: o.Plugins = None, gpus: o.GpuList = None, spread: o.Spread = None,
    merge_timeout: o.MergeTimeout = 3600.0, telemetry: o.Telemetry = True,
    tuning_cache: o.TuningCache = None, report: o.WriteReport = True,
    max_cases: o.MaxCases = CaseFlags.max_cases, cpu_threads: o.CpuThreads = None,
    json_summary: o.RunJson = False,
) -> None:  # fmt: skip
    """Run benchmark suites and write results.json, results.csv and report.html."""
    code = run_command(
        RunRequest(
            suites=tuple(suite or ()), impls=split_items("--impl", impl),
            **_axes(mode, dtype, seqlen, head_dim, batch, heads, kv_heads), causal=causal,
            **_decode_axes(seqlen_q, seqlen_k, page_size, ctx_spread),
            **vo.variant_axes(window, alibi, softcap, varlen),
            device=device.value, gpu=gpu, out=out,
            resume=resume, timeout_s=timeout, target_noise=target_noise, min_samples=min_samples,
            max_time_s=max_time, warmup_ms=warmup, l2_flush=l2_flush, cuda_graph=cuda_graph,
            seed=seed, plugins=tuple(plugin or ()), argv=parsed_argv(ctx),
            tuning_cache=tuning_cache, telemetry=telemetry,
            gpus=gpus, spread=spread, merge_timeout_s=merge_timeout, report=report,
            max_cases=max_cases, cpu_threads=cpu_threads, json=json_summary,
        ),
        console=console, err_console=err_console,
    )  # fmt: skip
    raise typer.Exit(code)


@app.command()
def sweep(
    ctx: typer.Context, suite: o.Suites = None, mode: o.Modes = None, dtype: o.DTypes = None,
    seqlen: o.Seqlens = None, head_dim: o.HeadDims = None, batch: o.Batches = None,
    heads: o.Heads = None, kv_heads: o.KvHeads = None, causal: o.Causal = None,
    block_m: so.BlockM = None, block_n: so.BlockN = None, warps: so.Warps = None,
    stages: so.Stages = None, kernel: so.SweepKernel = SweepRequest.kernel,
    gluon_role: so.GluonRoles = None, gluon_block_n: so.GluonBlockN = None,
    gluon_stages: so.GluonStages = None, resume: so.SweepResume = None,
    rules: so.Rules = True, budget_minutes: so.BudgetMinutes = None, save_best: so.SaveBest = False,
    min_gain: so.MinGain = SweepRequest.min_gain_pct, tuning_cache: o.TuningCache = None,
    out: o.Out = None, device: o.Device = o.DeviceChoice.AUTO, gpu: o.Gpu = None,
    timeout: o.Timeout = None, target_noise: o.TargetNoise = MeasureFlags.target_noise,
    min_samples: o.MinSamples = MeasureFlags.min_samples, max_time: o.MaxTime = None,
    compile_jobs: so.CompileJobs = None, warmup: o.Warmup = None,
    max_cases: o.MaxCases = CaseFlags.max_cases, cpu_threads: o.CpuThreads = None,
) -> None:  # fmt: skip
    """Time our Triton kernel over BLOCK_M × BLOCK_N × warps × stages; write sweep.json.

    `--kernel gluon` times the Gluon forward's launches instead (sm_90; docs/sweep.md).

    Every config is built first (in parallel on a GPU), checked against the float64
    reference, then timed like `run`; pruned, failing and inaccurate configs are rows with
    their reason. Compile time is reported per row, never timed. Example:

        fa-bench sweep -s standard --dtype bf16 --head-dim 128 --seqlen 4096 --mode fwd
        --budget-minutes 10 --save-best
    """
    req = SweepRequest(
        suites=tuple(suite or ()),
        **_axes(mode, dtype, seqlen, head_dim, batch, heads, kv_heads, modes=SweepRequest.modes),
        causal=causal, block_m=int_items("--block-m", block_m) or None,
        block_n=int_items("--block-n", block_n) or None, warps=int_items("--warps", warps) or None,
        stages=int_items("--stages", stages) or None, kernel=kernel,
        gluon_roles=split_items("--gluon-role", gluon_role) or None,
        gluon_block_n=int_items("--gluon-block-n", gluon_block_n) or None,
        gluon_stages=int_items("--gluon-stages", gluon_stages) or None,
        resume=resume, given=given_flags(ctx),
        rules=rules, budget_minutes=budget_minutes, save_best=save_best,
        min_gain_pct=min_gain, tuning_cache=tuning_cache, out=out, device=device.value, gpu=gpu,
        timeout_s=timeout, target_noise=target_noise, min_samples=min_samples,
        max_time_s=max_time, warmup_ms=warmup, compile_jobs=compile_jobs, argv=parsed_argv(ctx),
        max_cases=max_cases, cpu_threads=cpu_threads,
    )  # fmt: skip
    raise typer.Exit(sweep_command(req, console=console, err_console=err_console))


@app.command()
def report(
    results: v.ReportInputs, out: v.ReportOut = None, baseline: v.Baseline = None,
    title: v.Title = None, plotlyjs: v.PlotlyJsOpt = v.PlotlyJs.INLINE,
) -> None:  # fmt: skip
    """Build one self-contained interactive HTML report from one or more runs."""
    code = report_command(inputs=list(results), out=out, baseline=baseline, title=title,
                          plotlyjs=plotlyjs.value, console=console,
                          err_console=err_console)  # fmt: skip
    raise typer.Exit(code)


@app.command()
def compare(
    baseline: v.CompareBaseline, current: v.CompareCurrent, threshold: v.Thresholds = None,
    preset: v.PresetOpt = v.Preset.default,  # type: ignore[attr-defined]
    metric: v.MetricOpt = v.Metric.LATENCY, markdown: v.MarkdownOut = None,
    json_out: v.JsonOut = None, fail_on: v.FailOnOpt = None, filter_: v.CaseFilterOpt = None,
    allow_env_mismatch: v.AllowEnvMismatch = False,
) -> None:  # fmt: skip
    """Compare two runs case by case and fail (exit 1) when a case got slower beyond the
    noise and the threshold, or its status regressed."""
    code = compare_command(
        baseline=baseline, current=current, metric=metric, preset=preset.value,
        thresholds=tuple(threshold or ()), case_filter=filter_,
        fail_on=tuple(FailOn(v) for v in choice_items("--fail-on", fail_on, FailOn)),
        markdown_out=markdown, json_out=json_out, allow_env_mismatch=allow_env_mismatch,
        console=_wide_console(), err_console=err_console,
    )  # fmt: skip
    raise typer.Exit(code)


def _wide_console() -> Console:
    """Rich assumes 80 columns when stdout is not a terminal, which folds every case id in
    a CI log; logs take long lines, so use 160 there unless COLUMNS says otherwise."""
    wide = not sys.stdout.isatty() and "COLUMNS" not in os.environ
    return Console(width=160 if wide else None)


@app.command("list")
def list_(what: v.ListWhat, plugin: o.Plugins = None, json_out: v.InfoJson = False) -> None:
    """List the built-in suites or the registered implementations (and whether each can
    run here)."""
    from fa_bench import registry
    from fa_bench.commands import info

    if what == v.ListKind.SUITES:
        suites = info.suite_rows()
        if json_out:
            info.print_json(suites)
        else:
            info.print_suites(console, suites)
        return
    impls = registry.load(plugin or ())  # a PluginError is the user's: exit 2 (_Group)
    rows = info.impl_rows(impls, registry.broken_packages())
    if json_out:
        info.print_json(rows)
    else:
        info.print_impls(console, rows)


@app.command()
def env(plugin: o.Plugins = None, json_out: v.InfoJson = False) -> None:
    """Show this machine: GPUs, driver, versions, and which implementations can run."""
    from fa_bench import registry
    from fa_bench.commands import info

    # Plugins first: one that cannot be imported is an error before anything is shown.
    impls = registry.load(plugin or ())  # a PluginError is the user's: exit 2 (_Group)
    doc = info.env_doc(impls, registry.broken_packages())
    if json_out:
        info.print_json(doc)
    else:
        info.print_env(console, doc)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
