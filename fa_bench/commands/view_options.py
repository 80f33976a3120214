"""The options of the commands that read results: list, env, report and compare.

Declared like fa_bench/commands/options.py (run's and sweep's); split off to keep each
file one screenful of related flags.
"""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from fa_bench.commands.lists import metavar
from fa_bench.commands.options import opt
from fa_bench.compare.core import PRESETS, FailOn, Metric


class PlotlyJs(str, Enum):
    INLINE = "inline"
    CDN = "cdn"


Preset = Enum("Preset", {name: name for name in PRESETS}, type=str)  # type: ignore[misc]


# --- list, env, report -----------------------------------------------------------------


class ListKind(str, Enum):
    SUITES = "suites"
    IMPLS = "impls"


ListWhat = Annotated[ListKind, typer.Argument(help="What to list: suites or impls.")]
InfoJson = Annotated[
    bool, opt("--json", help="Print it as JSON on stdout (for scripts), not as tables.")
]
ReportInputs = Annotated[
    list[str],
    typer.Argument(
        help="results.json files, run folders holding one, or report.html pages "
        "(several are merged into one comparison).",
        show_default=False,
    ),
]
ReportOut = Annotated[
    Path | None,
    opt(
        "--out",
        "-o",
        help="Page to write: report.html beside a single input by default; required when "
        "several inputs are merged.",
    ),
]
Baseline = Annotated[
    str | None,
    opt(
        "--baseline",
        "-b",
        help="Implementation the speedups are relative to "
        "(default: sdpa, else sdpa-cudnn, sdpa-flash, naive, else the first).",
    ),
]
Title = Annotated[str | None, opt("--title", help="Page title.")]
PlotlyJsOpt = Annotated[
    PlotlyJs,
    opt(
        "--plotlyjs",
        help="inline: embed plotly.js (self-contained, ~5 MB, opens offline); "
        "cdn: load it from cdn.plot.ly (small file, needs network).",
    ),
]

# --- compare ---------------------------------------------------------------------------

CompareBaseline = Annotated[
    Path, typer.Argument(help="Baseline: results.json, report.html, or a folder holding either.")
]
CompareCurrent = Annotated[
    Path, typer.Argument(help="Current run: results.json, report.html, or a folder.")
]
Thresholds = Annotated[
    list[str] | None,
    opt(
        "--threshold",
        "-t",
        help="Smallest change that counts: '5%' or '0.05' for --metric, or METRIC=5% for "
        "one metric; repeatable. Overrides the preset.",
    ),
]
PresetOpt = Annotated[
    Preset,
    opt(  # type: ignore[valid-type]
        "--preset",
        help="Thresholds: default (5%, alpha 0.01), strict (2%, alpha 0.05), "
        "permissive (10%, alpha 0.001).",
    ),
]
# No short flag: `-m` is --mode in run and sweep (one meaning per letter in the whole CLI).
MetricOpt = Annotated[Metric, opt("--metric", help="What to compare.")]
MarkdownOut = Annotated[
    Path | None,
    opt("--markdown", help="Write a Markdown summary (pull-request comment, step summary)."),
]
JsonOut = Annotated[Path | None, opt("--json", help="Write the verdicts as JSON.")]
FailOnOpt = Annotated[
    list[str] | None,
    opt(
        "--fail-on",
        metavar=metavar(FailOn),
        help="Also fail (exit 1) on these verdicts; repeatable or a comma list. slower and status "
        "(ok → mismatch, ok → oom, ...) always fail.",
    ),
]
CaseFilterOpt = Annotated[
    str | None,
    opt(
        "--filter",
        help="Only cases matching key=glob terms, comma-separated, '|' between "
        "alternatives, e.g. 'impl=triton|sdpa-cudnn,mode=fwd'; a bare glob matches the id.",
    ),
]
AllowEnvMismatch = Annotated[
    bool, opt("--allow-env-mismatch", help="Compare even when the GPU models differ.")
]
