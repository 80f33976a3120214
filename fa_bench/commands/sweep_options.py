"""The options of `fa-bench sweep` alone; the ones it shares with `run` are in options.py.

Split off to keep each file one screenful of related flags.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from fa_bench.commands.lists import INTS
from fa_bench.commands.options import WEEK_S, WHERE, opt

# --- sweep only ------------------------------------------------------------------------

# Repeatable and comma lists alike (--block-m 64,128 = --block-m 64 --block-m 128); None:
# the default space (the GPU's, or the CPU interpreter's tiny one: docs/sweep.md).
BlockM = Annotated[
    list[str] | None,
    opt("--block-m", metavar=INTS, help="BLOCK_M values; repeatable or a comma list."),
]
BlockN = Annotated[
    list[str] | None,
    opt("--block-n", metavar=INTS, help="BLOCK_N values; repeatable or a comma list."),
]
Warps = Annotated[
    list[str] | None,
    opt("--warps", metavar=INTS, help="num_warps values; repeatable or a comma list."),
]
Stages = Annotated[
    list[str] | None,
    opt("--stages", metavar=INTS, help="num_stages values; repeatable or a comma list."),
]
SweepKernel = Annotated[
    str,
    opt(
        "--kernel",
        metavar="tl|gluon",
        help="The forward kernel to sweep: tl (its tiles, the default) or gluon (the Gluon "
        "forward's launches on an sm_90 GPU; --mode fwd).",
    ),
]
GluonRoles = Annotated[
    list[str] | None,
    opt(
        "--gluon-role",
        metavar="ROLES",
        help="With --kernel gluon: the candidate launches to time (ws, ws-nopp, ws-persist, "
        "ws-persist-q2, ws-shallow, ws-c3, pipelined; default all); repeatable or a comma list.",
    ),
]
GluonBlockN = Annotated[
    list[str] | None,
    opt(
        "--gluon-block-n",
        metavar=INTS,
        help="With --kernel gluon: keys per step laid over each candidate (default its own).",
    ),
]
GluonStages = Annotated[
    list[str] | None,
    opt(
        "--gluon-stages",
        metavar=INTS,
        help="With --kernel gluon: K/V ring depths laid over each candidate (default its own).",
    ),
]
SweepResume = Annotated[
    Path | None,
    opt(
        "--resume",
        panel=WHERE,
        help="Finish an interrupted sweep in this folder, with its own points and options "
        "(only --budget-minutes may be given with it).",
    ),
]
Rules = Annotated[
    bool,
    opt(
        "--rules/--no-rules",
        help="Also measure each rule of thumb's square tile the product lacks (docs/sweep.md).",
    ),
]
BudgetMinutes = Annotated[
    float | None,
    opt(
        "--budget-minutes",
        min=0.01,
        max=WEEK_S / 60,
        help="Stop cleanly after this long, keeping the results.",
    ),
]
SaveBest = Annotated[
    bool,
    opt(
        "--save-best",
        help="Write each case's best config to the tuning cache (used by `run`'s triton).",
    ),
]
MinGain = Annotated[
    float,
    opt(
        "--min-gain",
        min=0.0,
        max=1000.0,
        help="With --save-best: save a case's best only if it beats the heuristic by this many "
        "percent; below it the heuristic stays (its older entry is removed). "
        "Smaller gains were within run-to-run noise on the H200.",
    ),
]
CompileJobs = Annotated[
    int | None,
    opt(
        "--compile-jobs",
        min=0,
        max=1024,
        help="Processes that build every config before timing starts (default: up to 8 "
        "on GPU, 0 on CPU; 0 = build each config as it is timed).",
    ),
]
