"""The command line's vocabulary: every Typer option of cli.py, declared once.

`run` and `sweep` select cases, place them and time them with the same flags, so those
aliases (and their one default each) are shared; the rest belong to one command but live
here too, so that cli.py reads as a list of commands. Closed choices are str Enums, so a
bad value is Typer's usage error (exit 2, naming the choices).
"""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from fa_bench.case import DType, Mode
from fa_bench.commands.lists import INTS, metavar
from fa_bench.commands.surface import print_version

CASES, WHERE, MEASURE, GPUS = "Cases", "Where and output", "Measurement", "Several GPUs or nodes"


class DeviceChoice(str, Enum):
    AUTO = "auto"
    CUDA = "cuda"
    CPU = "cpu"


def opt(*names: str, help: str, panel: str | None = None, **kw: object) -> typer.models.OptionInfo:
    return typer.Option(*names, help=help, rich_help_panel=panel, **kw)  # type: ignore[arg-type]


# --- the app's own ---------------------------------------------------------------------

Debug = Annotated[bool, opt("--debug", help="On an internal error (exit 1), print its traceback.")]
Version = Annotated[
    bool,
    opt(
        "--version",
        "-V",
        is_eager=True,
        callback=print_version,
        help="Print the version (fa-bench X.Y.Z) and exit.",
    ),
]

# --- shared by run and sweep: which cases ----------------------------------------------

Suites = Annotated[
    list[str] | None,
    opt(
        "--suite",
        "-s",
        panel=CASES,
        metavar="NAME|FILE",
        help="Built-in suite name or TOML file; repeatable (sweep takes its triton cases). "
        "Default: 'standard' on a GPU, 'smoke' on a CPU-only machine.",
    ),
]
# The list-valued axes take strings: each value may be a comma list (`--seqlen 512,1024`
# = `--seqlen 512 --seqlen 1024`), converted and checked by commands/lists.py in cli.py.
Modes = Annotated[
    list[str] | None,
    opt(
        "--mode",
        "-m",
        panel=CASES,
        metavar=metavar(Mode),
        help="fwd, bwd, fwd_bwd or decode; repeatable or a comma list (sweep: fwd and/or "
        "bwd, default both).",
    ),
]
DTypes = Annotated[
    list[str] | None,
    opt(
        "--dtype",
        panel=CASES,
        metavar=metavar(DType),
        help="fp32, fp16, bf16 or fp8_e4m3 (forward only); repeatable or a comma list.",
    ),
]
Seqlens = Annotated[
    list[str] | None,
    opt(
        "--seqlen",
        panel=CASES,
        metavar=INTS,
        help="Sequence length (query = key); repeatable or a comma list.",
    ),
]
SeqlensQ = Annotated[
    list[str] | None,
    opt(
        "--seqlen-q",
        panel=CASES,
        metavar=INTS,
        help="Query length alone (decode: new tokens per sequence, 1-16); keeps the suite's "
        "key lengths; repeatable or a comma list.",
    ),
]
SeqlensK = Annotated[
    list[str] | None,
    opt(
        "--seqlen-k",
        panel=CASES,
        metavar=INTS,
        help="Key length alone (decode: the context, the cache's capacity); keeps the "
        "suite's query lengths; repeatable or a comma list.",
    ),
]
PageSizes = Annotated[
    list[str] | None,
    opt(
        "--page-size",
        panel=CASES,
        metavar="none|N[,...]",
        help="Decode: tokens per page of the KV cache (16-256, a multiple of 16), or none "
        "(or 0) for a contiguous cache; repeatable or a comma list.",
    ),
]
CtxSpreads = Annotated[
    list[str] | None,
    opt(
        "--ctx-spread",
        panel=CASES,
        metavar="F[,F...]",
        help="Decode: context lengths spread evenly from --seqlen-k down to F times it "
        "(0 < F <= 1; 1 = equal lengths); repeatable or a comma list.",
    ),
]
HeadDims = Annotated[
    list[str] | None,
    opt(
        "--head-dim", panel=CASES, metavar=INTS, help="Head dimension; repeatable or a comma list."
    ),
]
Batches = Annotated[
    list[str] | None,
    opt(
        "--batch",
        panel=CASES,
        metavar=INTS,
        help="Batch size; repeatable or a comma list (replaces the suite's batch or tokens).",
    ),
]
Heads = Annotated[
    list[str] | None,
    opt("--heads", panel=CASES, metavar=INTS, help="Query heads; repeatable or a comma list."),
]
KvHeads = Annotated[
    list[str] | None,
    opt(
        "--kv-heads",
        panel=CASES,
        metavar=INTS,
        help="Key/value heads (GQA/MQA when fewer than --heads); repeatable or a comma list.",
    ),
]
Causal = Annotated[
    bool | None,
    opt(
        "--causal/--no-causal",
        panel=CASES,
        help="Only causal, or only non-causal cases (default: the suite's).",
    ),
]

MaxCases = Annotated[
    int,
    opt(
        "--max-cases",
        panel=CASES,
        min=1,
        help="Refuse a plan of more cases than this (sweep: cases × configs) before it "
        "starts; raise it to run a larger one.",
    ),
]

# --- shared by run and sweep: where, and how timed -------------------------------------

# Ceilings for the time flags, far past any sensible value: a range without a max accepts
# inf (and NaN); with one, Click refuses both. MeasureFlags.check_values backs it up.
DAY_S = 86_400.0
WEEK_S = 7 * DAY_S

Device = Annotated[
    DeviceChoice,
    opt("--device", panel=WHERE, help="auto (CUDA when present, else CPU), cuda or cpu."),
]
Gpu = Annotated[
    int | None, opt("--gpu", panel=WHERE, min=0, help="GPU index to run on (default 0).")
]
Out = Annotated[
    Path | None,
    opt(
        "--out",
        "-o",
        panel=WHERE,
        help="Output folder (default: a new folder under ./fa-bench-out/).",
    ),
]
# The two defaults live in commands/flags.py (RunRequest, SweepRequest), with the why.
Timeout = Annotated[
    float | None,
    opt(
        "--timeout",
        panel=MEASURE,
        min=1,
        max=WEEK_S,
        help="Seconds one case may take (compilation included) before it is killed. Default: "
        "600 for run; 300 for sweep, whose configs are each one build and one kernel.",
    ),
]
TargetNoise = Annotated[
    float,
    opt(
        "--target-noise",
        panel=MEASURE,
        min=1e-4,
        max=0.5,
        help="Stop timing a case once the relative standard error of its mean latency "
        "is at most this.",
    ),
]
# At most a million: past that, --max-time ends the timing first on any device.
MinSamples = Annotated[
    int,
    opt("--min-samples", panel=MEASURE, min=2, max=1_000_000, help="Samples to take at least."),
]
CpuThreads = Annotated[
    int | None,
    opt(
        "--cpu-threads",
        panel=MEASURE,
        min=1,
        max=4096,
        help="Threads torch and OpenMP use in the worker (default 1 on CPU: more threads "
        "spin-wait and skew short calls; torch's own default on a GPU). Recorded in results.json.",
    ),
]
MaxTime = Annotated[
    float | None,
    opt(
        "--max-time",
        panel=MEASURE,
        min=0.01,
        max=DAY_S,
        help="Seconds of timing per case at most (default 3 on GPU, 2 per sweep config; 1 on CPU).",
    ),
]
Warmup = Annotated[
    float | None,
    opt(
        "--warmup",
        panel=MEASURE,
        min=0.0,
        max=DAY_S * 1000,
        help="Milliseconds of back-to-back untimed calls before a case's samples "
        "(default 500 on GPU, so a power-capped clock has settled; 20 on CPU). "
        "See docs/measurement.md.",
    ),
]
TuningCache = Annotated[
    str | None,
    opt(
        "--tuning-cache",
        panel=MEASURE,
        metavar="FILE|off",
        help="Tuning cache for `triton`, `triton-deterministic` and `triton-onepass` (written by "
        "`fa-bench sweep --save-best`), or "
        "'off'. Default: $FA_BENCH_TUNING_CACHE, else ~/.cache/fa-bench/tuning.json.",
    ),
]
Plugins = Annotated[
    list[str] | None,
    opt(
        "--plugin",
        panel=CASES,
        metavar="MODULE|FILE",
        help="Module or .py file that registers more implementations; repeatable.",
    ),
]

# --- run only --------------------------------------------------------------------------

Impls = Annotated[
    list[str] | None,
    opt(
        "--impl",
        "-i",
        panel=CASES,
        metavar="NAME[,NAME...]",
        help="Implementation(s) to run (see `fa-bench list impls`); repeatable or a comma "
        "list; overrides the suite.",
    ),
]
Resume = Annotated[
    Path | None,
    opt(
        "--resume",
        panel=WHERE,
        help="Finish an interrupted run in this folder, with its own cases and options.",
    ),
]
L2Flush = Annotated[
    bool,
    opt("--l2-flush/--no-l2-flush", panel=MEASURE, help="Flush the GPU's L2 between timed calls."),
]
CudaGraph = Annotated[
    bool, opt("--cuda-graph", panel=MEASURE, help="Time CUDA-graph replays (forward cases only).")
]
Seed = Annotated[int, opt("--seed", panel=MEASURE, help="Seed for the random inputs.")]
GpuList = Annotated[
    str | None,
    opt(
        "--gpus",
        panel=GPUS,
        metavar="all|N[,N...]",
        help="Run on several GPUs at once: 'all' or indices like 0,3,5 (one worker each).",
    ),
]
Spread = Annotated[
    bool | None,
    opt(
        "--spread/--replicate",
        panel=GPUS,
        help="With --gpus or under torchrun/srun: share the cases among GPUs (--spread) "
        "or run the whole suite on each to compare them (--replicate, the default).",
    ),
]
MergeTimeout = Annotated[
    float,
    opt(
        "--merge-timeout",
        panel=GPUS,
        min=0,
        max=WEEK_S,
        help="Under torchrun/srun: seconds rank 0 waits for the other ranks' results.",
    ),
]
Telemetry = Annotated[
    bool,
    opt(
        "--telemetry/--no-telemetry",
        panel=MEASURE,
        help="NVML telemetry per case (HBM GB/s, SM/tensor activity, clocks, power, energy) "
        "in a >= 1 s window after timing; on a machine without it, recorded as unavailable.",
    ),
]
WriteReport = Annotated[
    bool,
    opt(
        "--report/--no-report",
        panel=WHERE,
        help="Write report.html (self-contained interactive page) beside results.json.",
    ),
]
RunJson = Annotated[
    bool,
    opt(
        "--json",
        panel=WHERE,
        help="Print the run's summary as JSON on stdout (files written, counts by status, "
        "each case; the resume command if interrupted); the rest of the output goes to stderr.",
    ),
]
