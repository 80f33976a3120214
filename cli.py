"""The `fa-bench` command line: thin Typer commands over the fa_bench core."""

from __future__ import annotations

import importlib
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.panel import Panel
from rich.table import Table

from fa_bench.case import DType, Mode

app = typer.Typer(
    name="fa-bench",
    help="Benchmark and profile attention implementations: latency with its noise, TFLOP/s, "
    "model HBM bandwidth, peak memory and accuracy against a float64 reference.",
    context_settings={"help_option_names": ["-h", "--help"]},
    no_args_is_help=True,
    rich_markup_mode="rich",
    pretty_exceptions_enable=False,
)
# Commands that live in their own modules; each module exposes register(app).
_COMMAND_MODULES: tuple[str, ...] = (
    "fa_bench.commands.sweep",
    "fa_bench.commands.report",
    "fa_bench.commands.compare",
)
console = Console()
err_console = Console(stderr=True, soft_wrap=True)


class DeviceChoice(str, Enum):
    AUTO = "auto"
    CUDA = "cuda"
    CPU = "cpu"


def _fail(message: str, code: int = 2) -> typer.Exit:
    err_console.print(f"[bold red]error:[/] {message}", highlight=False)
    return typer.Exit(code)


@app.command()
def run(
    suite: Annotated[
        list[str] | None,
        typer.Option(
            "--suite",
            "-s",
            help="Built-in suite name or TOML file; repeatable. "
            "Default: 'standard' on a GPU, 'smoke' on a CPU-only machine.",
            rich_help_panel="Cases",
        ),
    ] = None,
    impl: Annotated[
        list[str] | None,
        typer.Option(
            "--impl",
            "-i",
            help="Implementation(s) to run (see `fa-bench list impls`); overrides the suite.",
            rich_help_panel="Cases",
        ),
    ] = None,
    mode: Annotated[
        list[Mode] | None,
        typer.Option(
            "--mode", "-m", help="fwd, bwd or fwd_bwd; repeatable.", rich_help_panel="Cases"
        ),
    ] = None,
    dtype: Annotated[
        list[DType] | None,
        typer.Option("--dtype", help="fp32, fp16 or bf16; repeatable.", rich_help_panel="Cases"),
    ] = None,
    seqlen: Annotated[
        list[int] | None,
        typer.Option(
            "--seqlen", help="Sequence length (query = key); repeatable.", rich_help_panel="Cases"
        ),
    ] = None,
    head_dim: Annotated[
        list[int] | None,
        typer.Option("--head-dim", help="Head dimension; repeatable.", rich_help_panel="Cases"),
    ] = None,
    batch: Annotated[
        list[int] | None,
        typer.Option(
            "--batch",
            help="Batch size; repeatable (replaces the suite's batch or tokens).",
            rich_help_panel="Cases",
        ),
    ] = None,
    heads: Annotated[
        list[int] | None,
        typer.Option("--heads", help="Query heads; repeatable.", rich_help_panel="Cases"),
    ] = None,
    kv_heads: Annotated[
        list[int] | None,
        typer.Option(
            "--kv-heads",
            help="Key/value heads (GQA/MQA when fewer than --heads); repeatable.",
            rich_help_panel="Cases",
        ),
    ] = None,
    causal: Annotated[
        bool | None,
        typer.Option(
            "--causal/--no-causal",
            help="Only causal, or only non-causal cases (default: the suite's).",
            rich_help_panel="Cases",
        ),
    ] = None,
    device: Annotated[
        DeviceChoice,
        typer.Option(
            "--device",
            help="auto (CUDA when present, else CPU), cuda or cpu.",
            rich_help_panel="Where and output",
        ),
    ] = DeviceChoice.AUTO,
    gpu: Annotated[
        int | None,
        typer.Option(
            "--gpu",
            help="GPU index to run on (default 0).",
            min=0,
            rich_help_panel="Where and output",
        ),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            "-o",
            help="Output folder (default: a new folder under ./fa-bench-out/).",
            rich_help_panel="Where and output",
        ),
    ] = None,
    resume: Annotated[
        Path | None,
        typer.Option(
            "--resume",
            help="Finish an interrupted run in this folder, with its own cases and options.",
            rich_help_panel="Where and output",
        ),
    ] = None,
    timeout: Annotated[
        float,
        typer.Option(
            "--timeout",
            help="Seconds one case may take (compilation included) before it is killed.",
            min=1,
            rich_help_panel="Measurement",
        ),
    ] = 600.0,
    target_noise: Annotated[
        float,
        typer.Option(
            "--target-noise",
            help="Stop timing a case once the relative standard error of its mean latency "
            "is at most this.",
            min=1e-4,
            max=0.5,
            rich_help_panel="Measurement",
        ),
    ] = 0.01,
    min_samples: Annotated[
        int,
        typer.Option(
            "--min-samples", help="Samples to take at least.", min=2, rich_help_panel="Measurement"
        ),
    ] = 10,
    max_time: Annotated[
        float | None,
        typer.Option(
            "--max-time",
            help="Seconds of timing per case at most (default 3 on GPU, 1 on CPU).",
            min=0.01,
            rich_help_panel="Measurement",
        ),
    ] = None,
    warmup: Annotated[
        float | None,
        typer.Option(
            "--warmup",
            help="Milliseconds of back-to-back untimed calls before a case's samples "
            "(default 500 on GPU, so a power-capped clock has settled; 20 on CPU). "
            "See docs/measurement.md.",
            min=0.0,
            rich_help_panel="Measurement",
        ),
    ] = None,
    l2_flush: Annotated[
        bool,
        typer.Option(
            "--l2-flush/--no-l2-flush",
            help="Flush the GPU's L2 between timed calls.",
            rich_help_panel="Measurement",
        ),
    ] = True,
    cuda_graph: Annotated[
        bool,
        typer.Option(
            "--cuda-graph",
            help="Time CUDA-graph replays (forward cases only).",
            rich_help_panel="Measurement",
        ),
    ] = False,
    seed: Annotated[
        int,
        typer.Option("--seed", help="Seed for the random inputs.", rich_help_panel="Measurement"),
    ] = 0,
    plugin: Annotated[
        list[str] | None,
        typer.Option(
            "--plugin",
            help="Module or .py file that registers more implementations; repeatable.",
            rich_help_panel="Cases",
        ),
    ] = None,
    gpus: Annotated[
        str | None,
        typer.Option(
            "--gpus",
            help="Run on several GPUs at once: 'all' or indices like 0,3,5 (one worker each).",
            rich_help_panel="Several GPUs or nodes",
        ),
    ] = None,
    spread: Annotated[
        bool | None,
        typer.Option(
            "--spread/--replicate",
            help="With --gpus or under torchrun/srun: share the cases among GPUs (--spread) "
            "or run the whole suite on each to compare them (--replicate, the default).",
            rich_help_panel="Several GPUs or nodes",
        ),
    ] = None,
    merge_timeout: Annotated[
        float,
        typer.Option(
            "--merge-timeout",
            help="Under torchrun/srun: seconds rank 0 waits for the other ranks' results.",
            min=0,
            rich_help_panel="Several GPUs or nodes",
        ),
    ] = 3600.0,
    telemetry: Annotated[
        bool,
        typer.Option(
            "--telemetry/--no-telemetry",
            help="NVML telemetry per case (HBM GB/s, SM/tensor activity, clocks, power, energy) "
            "in a >= 1 s window after timing; on a machine without it, recorded as unavailable.",
            rich_help_panel="Measurement",
        ),
    ] = True,
    tuning_cache: Annotated[
        str | None,
        typer.Option(
            "--tuning-cache",
            help="Tuning cache for `triton` (written by `fa-bench sweep --save-best`), or "
            "'off'. Default: $FA_BENCH_TUNING_CACHE, else ~/.cache/fa-bench/tuning.json.",
            rich_help_panel="Measurement",
        ),
    ] = None,
    report: Annotated[
        bool,
        typer.Option(
            "--report/--no-report",
            help="Write report.html (self-contained interactive page) beside results.json.",
            rich_help_panel="Where and output",
        ),
    ] = True,
) -> None:
    """Run benchmark suites and write results.json, results.csv and report.html."""
    from fa_bench.commands.run import RunRequest, run_command

    code = run_command(
        RunRequest(
            suites=tuple(suite or ()), impls=tuple(impl or ()),
            modes=tuple(m.value for m in mode or ()),
            dtypes=tuple(d.value for d in dtype or ()), seqlens=tuple(seqlen or ()),
            head_dims=tuple(head_dim or ()), batch=tuple(batch or ()), heads=tuple(heads or ()),
            kv_heads=tuple(kv_heads or ()), causal=causal, device=device.value, gpu=gpu, out=out,
            resume=resume, timeout_s=timeout, target_noise=target_noise, min_samples=min_samples,
            max_time_s=max_time, warmup_ms=warmup, l2_flush=l2_flush, cuda_graph=cuda_graph,
            seed=seed, plugins=tuple(plugin or ()), argv=["fa-bench", *sys.argv[1:]],
            tuning_cache=tuning_cache, telemetry=telemetry,
            gpus=gpus, spread=spread, merge_timeout_s=merge_timeout, report=report,
        ),
        console=console, err_console=err_console,
    )  # fmt: skip
    raise typer.Exit(code)


@app.command("list")
def list_(
    what: Annotated[str, typer.Argument(help="suites or impls")],
    plugin: Annotated[
        list[str] | None, typer.Option("--plugin", help="Extra implementation module or file.")
    ] = None,
) -> None:
    """List the built-in suites or the registered implementations."""
    if what == "suites":
        from fa_bench.suite.expand import builtin_suites

        t = Table("suite", "description")
        for name, desc in builtin_suites().items():
            t.add_row(name, desc)
        console.print(t)
    elif what == "impls":
        from fa_bench import registry

        try:
            impls = registry.load(plugin or ())
        except registry.PluginError as exc:
            raise _fail(str(exc)) from None
        t = Table("impl", "modes", "dtypes", "devices", "description")
        for name, im in impls.items():
            t.add_row(name, ", ".join(m.value for m in Mode if m in im.modes),
                      ", ".join(d.value for d in DType if d in im.dtypes),
                      ", ".join(sorted(im.devices)), im.description)  # fmt: skip
        console.print(t)
    else:
        raise _fail(f"fa-bench list: {what!r} is not one of: suites, impls")


@app.command()
def env(
    plugin: Annotated[
        list[str] | None, typer.Option("--plugin", help="Extra implementation module or file.")
    ] = None,
) -> None:
    """Show this machine: GPUs, driver, versions, and which implementations can run."""
    from fa_bench import registry
    from fa_bench.env import collect_env, cudnn_version

    info = collect_env()
    t = Table("", "", show_header=False, box=None)
    for key in ("hostname", "platform", "python", "fa_bench", "torch", "triton", "cuda", "cudnn",
                "driver"):  # fmt: skip
        value = info.get(key)
        shown = cudnn_version(value) if key == "cudnn" else str(value)
        t.add_row(key, shown if value is not None else "–")
    if info.get("driver_note"):
        t.add_row("driver note", info["driver_note"])
    console.print(Panel(t, title="environment"))
    if info["gpus"]:
        g = Table(
            "index", "name", "uuid", "memory GiB", "SMs", "capability", "L2 MiB", title="GPUs"
        )
        for d in info["gpus"]:
            mem_gib, l2_mib = d["memory_bytes"] / 2**30, (d["l2_bytes"] or 0) / 2**20
            g.add_row(str(d["index"]), d["name"], str(d["uuid"]), f"{mem_gib:.1f}",
                      str(d["sm_count"]), d["compute_capability"], f"{l2_mib:.0f}")  # fmt: skip
        console.print(g)
    else:
        console.print("[yellow]No CUDA GPU visible: runs use the CPU (not GPU performance).[/]")
    from fa_bench.telemetry.env import support_report, support_table

    console.print(support_table(support_report()))
    try:
        impls = registry.load(plugin or ())
    except registry.PluginError as exc:
        raise _fail(str(exc)) from None
    a = Table("impl", "available here", title="implementations")
    for name, im in impls.items():
        why = im.unavailable_reason()
        a.add_row(name, "[green]yes[/]" if why is None else f"[yellow]no[/]: {why}")
    console.print(a)


for _module in _COMMAND_MODULES:
    importlib.import_module(_module).register(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
