"""`fa-bench sweep`: time our Triton kernel over its tiling space (docs/sweep.md)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from fa_bench.case import DType
from fa_bench.commands.flags import CaseFlags, MeasureFlags
from fa_bench.errors import UsageError

_DEFAULT_OUT = Path("fa-bench-out")


@dataclass(frozen=True)
class SweepRequest(CaseFlags, MeasureFlags):
    modes: tuple[str, ...] = ("fwd", "bwd")
    block_m: str = "32,64,128,256"
    block_n: str = "32,64,128,256"
    warps: str = "4,8"
    stages: str = "2,3,4,5"
    budget_minutes: float | None = None
    save_best: bool = False
    min_gain_pct: float = 3.0  # --save-best keeps the heuristic below this gain
    rules: bool = True  # also measure each rule of thumb's tile
    tuning_cache: str | None = None
    timeout_s: float = 300.0
    compile_jobs: int | None = None  # None: sweep_compile.default_jobs for the device
    argv: tuple[str, ...] = ()


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


def plan_points(req: SweepRequest, device: str) -> tuple[list, object, int | None]:
    """The sweep's points, its space and the shared-memory limit used for pruning."""
    from fa_bench import registry
    from fa_bench.suite.expand import Overrides, load_suites
    from fa_bench.sweep.space import SWEEP_MODES, SweepSpace, sweep_case, sweep_points

    bad = [m for m in req.modes if m not in SWEEP_MODES]
    if bad:
        raise SweepInputError(f"--mode {bad[0]}: valid sweep modes are {', '.join(SWEEP_MODES)}")
    space = SweepSpace(
        block_m=parse_int_list("--block-m", req.block_m),
        block_n=parse_int_list("--block-n", req.block_n),
        warps=parse_int_list("--warps", req.warps),
        stages=parse_int_list("--stages", req.stages),
    )
    registry.load()
    overrides = Overrides.from_flags(req, impls=("triton",))
    names = list(req.suites) or ["standard" if device == "cuda" else "smoke"]
    suites = load_suites(names, overrides=overrides, known_impls=registry.names())
    cases = list({c.id: sweep_case(c) for s in suites for c in s.cases}.values())
    capability = None
    if device == "cuda":
        import torch

        capability = torch.cuda.get_device_capability(req.gpu or 0)
    smem = _smem_limit(device, req.gpu)
    points = sweep_points(
        cases, space, capability=capability, smem_limit_bytes=smem, with_rules=req.rules
    )
    return points, space, smem


def sweep_command(req: SweepRequest, *, console: Console, err_console: Console) -> int:
    """Plan, measure with a progress bar, write sweep.json, optionally save the best."""
    from fa_bench.commands.run import resolve_device
    from fa_bench.console import RunProgress
    from fa_bench.registry import PluginError, UnknownImpl
    from fa_bench.run.plan import PlanError, now_iso
    from fa_bench.run.runner import RunOptions
    from fa_bench.suite.expand import SuiteError
    from fa_bench.sweep import tuning
    from fa_bench.sweep.execute import best_entries, build_doc, execute_points, write_doc

    try:
        device = resolve_device(req.device, req.gpu)
        points, space, smem = plan_points(req, device)
        cache_path = tuning.resolve_path(req.tuning_cache) if req.save_best else None
        if req.save_best and cache_path is None:
            raise SweepInputError("--save-best needs a tuning cache, but it is 'off'")
    except (SweepInputError, PlanError, SuiteError, UnknownImpl, PluginError, ValueError) as exc:
        err_console.print(f"[bold red]error:[/] {exc}", highlight=False)
        return 2
    on_cpu = device == "cpu"
    timing = req.timing(on_cpu, gpu_max_time_s=2.0)
    # No telemetry window: configs are ranked by latency alone, and the window would
    # add at least a second to every point.
    opts = RunOptions(device=device, gpu=req.gpu if device == "cuda" else None, timing=timing,
                      timeout_s=req.timeout_s, tuning_cache="off", telemetry=False)  # fmt: skip
    out = req.out or _DEFAULT_OUT / f"{now_iso().replace(':', '')}-sweep"
    if (out / "sweep.json").exists():
        err_console.print(f"[bold red]error:[/] --out {out}: already holds a sweep.json")
        return 2
    todo = [p for p in points if not p.pruned]
    console.print(f"{len({p.case.id for p in points})} cases × up to {space.size} configs "
                  "(plus the heuristic's and the rules of thumb's where the product lacks them): "
                  f"{len(todo)} to measure, {len(points) - len(todo)} pruned → {out}")  # fmt: skip
    started = now_iso()
    budget_s = req.budget_minutes * 60 if req.budget_minutes else None
    built, compiled = _compile_phase(req, points, device, budget_s, console, err_console)
    if budget_s is not None:
        budget_s = max(0.0, budget_s - compiled["wall_s"])
    with RunProgress(console, total=len(todo)) as progress:

        def on_event(event: str, point: object, row: dict | None) -> None:
            progress(event, point.case, row)
            if event == "start":
                progress.progress.update(
                    progress.task, description=f"{point.case.label} {point.id.split('#')[1]}"
                )

        rows, env, stop = execute_points(
            points, out, opts, budget_s=budget_s, on_event=on_event, built=built
        )
    run = {"started": started, "ended": now_iso(), "argv": list(req.argv), "device": device,
           "smem_limit_bytes": smem, "budget_minutes": req.budget_minutes, "stopped": stop,
           "points": len(points), "measured": sum(r["status"] != "pruned" for r in rows),
           "timing": timing.__dict__, "compile_phase": compiled}  # fmt: skip
    doc = build_doc(run, env or {}, space.to_dict(), rows)
    path = write_doc(out, doc)
    console.print(best_table(doc))
    console.print(f"sweep: {path}")
    _write_page(doc, out / "sweep.html", console=console, err_console=err_console)
    if stop:
        err_console.print(f"[yellow]stopped early ({stop})[/]: {run['measured']} of "
                          f"{len(todo)} configs measured; sweep.json keeps them")  # fmt: skip
    if req.save_best:
        gpus = (env or {}).get("gpus") or []
        gpu = gpus[0]["name"] if device == "cuda" and gpus else "cpu"
        try:
            entries, stay = best_entries(doc, gpu, str(path), now_iso(), req.min_gain_pct / 100)
            tuning.write_cache(cache_path, entries, remove=stay)
        except (tuning.TuningCacheError, OSError) as exc:
            err_console.print(f"[bold red]error:[/] --save-best: {exc}", highlight=False)
            return 2
        console.print(f"tuning cache: {len(entries)} entries saved to {cache_path}; "
                      f"{len(stay)} keys keep the heuristic (best within "
                      f"{req.min_gain_pct:g}% of it, --min-gain)")  # fmt: skip
    return 130 if stop == "interrupted" else 0


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
            deadline_s=_compile_deadline(budget_s, req.timeout_s, n, jobs),
            on_progress=lambda done, _: bar.update(task, completed=done),
        )  # fmt: skip
    console.print(f"compiled {summary.get('built', 0)} configs ({n} groups) with {jobs} "
                  f"processes in {summary['wall_s']:.0f} s; {summary.get('failed', 0)} "
                  "failed and are left to the timing worker")  # fmt: skip
    if summary["stopped"]:
        err_console.print(f"[yellow]warning:[/] compile phase stopped early "
                          f"({summary['stopped']}); the timing worker builds the rest",
                          highlight=False)  # fmt: skip
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
        console.print(f"report: {write_report([], out, sweeps=[doc])}")
    except Exception as exc:  # the measurements are safe in sweep.json whatever happens here
        err_console.print(f"[yellow]warning:[/] sweep page not written: {exc}", highlight=False)


def best_table(doc: dict) -> Table:
    t = Table(title="Best config per case")
    for col in ("case", "best", "TFLOP/s", "default", "TFLOP/s", "gain", "ok/failed/pruned"):
        t.add_column(col)
    for c in doc["cases"]:
        n = c["counts"]
        failed = sum(v for k, v in n.items() if k not in ("ok", "pruned"))
        gain = c["gain_over_default"]
        t.add_row(
            c["case_id"], c["best"] or "–", _f(c["best_tflops"]), c["default"] or "–",
            _f(c["default_tflops"]), "–" if gain is None else f"{gain:+.1%}",
            f"{n.get('ok', 0)}/{failed}/{n.get('pruned', 0)}",
        )  # fmt: skip
    return t


def _f(x: float | None) -> str:
    return "–" if x is None else f"{x:.4g}"


def sweep(
    suite: Annotated[list[str] | None, typer.Option("--suite", "-s", help="Suite name or TOML "
                     "file to sweep (its triton cases); default standard / smoke (CPU).")] = None,
    mode: Annotated[list[str] | None, typer.Option("--mode", "-m", help="fwd and/or bwd.")] = None,
    dtype: Annotated[list[DType] | None, typer.Option("--dtype", help="Repeatable.")] = None,
    seqlen: Annotated[list[int] | None, typer.Option("--seqlen", help="Repeatable.")] = None,
    head_dim: Annotated[list[int] | None, typer.Option("--head-dim", help="Repeatable.")] = None,
    batch: Annotated[list[int] | None, typer.Option("--batch", help="Repeatable.")] = None,
    heads: Annotated[list[int] | None, typer.Option("--heads", help="Repeatable.")] = None,
    kv_heads: Annotated[list[int] | None, typer.Option("--kv-heads", help="Repeatable.")] = None,
    causal: Annotated[bool | None, typer.Option("--causal/--no-causal")] = None,
    block_m: Annotated[str, typer.Option("--block-m", help="Comma list.")] = "32,64,128,256",
    block_n: Annotated[str, typer.Option("--block-n", help="Comma list.")] = "32,64,128,256",
    warps: Annotated[str, typer.Option("--warps", help="Comma list of num_warps.")] = "4,8",
    stages: Annotated[str, typer.Option("--stages", help="Comma list of num_stages.")] = "2,3,4,5",
    rules: Annotated[bool, typer.Option("--rules/--no-rules", help="Also measure each rule of "
                     "thumb's square tile the product lacks (docs/sweep.md).")] = True,
    budget_minutes: Annotated[float | None, typer.Option("--budget-minutes", min=0.01,
                              help="Stop cleanly after this long, keeping the results.")] = None,
    save_best: Annotated[bool, typer.Option("--save-best", help="Write each case's best config "
                         "to the tuning cache (used by `run` and flash_attention).")] = False,
    min_gain: Annotated[float, typer.Option("--min-gain", min=0.0, help="With --save-best: "
                        "save a case's best only if it beats the heuristic by this many "
                        "percent; below it the heuristic stays (its older entry is removed). "
                        "Smaller gains were within run-to-run noise on the H200.")] = 3.0,
    tuning_cache: Annotated[str | None, typer.Option("--tuning-cache", help="Cache file; default "
                            "$FA_BENCH_TUNING_CACHE, else ~/.cache/fa-bench/tuning.json.")] = None,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Output folder.")] = None,
    device: Annotated[str, typer.Option("--device", help="auto, cuda or cpu.")] = "auto",
    gpu: Annotated[int | None, typer.Option("--gpu", help="GPU index.", min=0)] = None,
    timeout: Annotated[float, typer.Option("--timeout", min=1, help="Seconds per config.")] = 300.0,
    target_noise: Annotated[float, typer.Option("--target-noise", min=1e-4, max=0.5)] = 0.01,
    min_samples: Annotated[int, typer.Option("--min-samples", min=2)] = 10,
    max_time: Annotated[float | None, typer.Option("--max-time", min=0.01,
                        help="Timing seconds per config at most (2 on GPU, 1 on CPU).")] = None,
    compile_jobs: Annotated[int | None, typer.Option("--compile-jobs", min=0, help="Processes "
                            "that build every config before timing starts (default: up to 8 "
                            "on GPU, 0 on CPU; 0 = build each config as it is timed).")] = None,
    warmup: Annotated[float | None, typer.Option("--warmup", min=0.0, help="Milliseconds of "
                      "back-to-back untimed calls before each config's samples (default 500 "
                      "on GPU, 20 on CPU; see docs/measurement.md).")] = None,
) -> None:  # fmt: skip
    """Time our Triton kernel over BLOCK_M × BLOCK_N × warps × stages; write sweep.json.

    Every config is built first (in parallel on a GPU), checked against the float64
    reference, then timed like `run`; pruned, failing and inaccurate configs are rows with
    their reason. Compile time is reported per row, never timed. Example:

        fa-bench sweep -s standard --dtype bf16 --head-dim 128 --seqlen 4096 --mode fwd
        --budget-minutes 10 --save-best
    """
    import sys

    if device not in ("auto", "cuda", "cpu"):
        Console(stderr=True).print(f"[bold red]error:[/] --device {device}: valid: auto, cuda, cpu")
        raise typer.Exit(2)
    req = SweepRequest(
        suites=tuple(suite or ()), modes=tuple(mode or ("fwd", "bwd")),
        dtypes=tuple(d.value for d in dtype or ()), seqlens=tuple(seqlen or ()),
        head_dims=tuple(head_dim or ()), batch=tuple(batch or ()), heads=tuple(heads or ()),
        kv_heads=tuple(kv_heads or ()), causal=causal, block_m=block_m, block_n=block_n,
        warps=warps, stages=stages, rules=rules, budget_minutes=budget_minutes, save_best=save_best,
        min_gain_pct=min_gain, tuning_cache=tuning_cache, out=out, device=device, gpu=gpu,
        timeout_s=timeout,
        target_noise=target_noise, min_samples=min_samples, max_time_s=max_time,
        warmup_ms=warmup, compile_jobs=compile_jobs, argv=("fa-bench", *sys.argv[1:]),
    )  # fmt: skip
    code = sweep_command(req, console=Console(), err_console=Console(stderr=True, soft_wrap=True))
    raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    app.command("sweep")(sweep)
