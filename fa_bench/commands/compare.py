"""`fa-bench compare`: the CI regression gate over two results (README "Comparing runs")."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from fa_bench.compare.core import (
    PRESETS,
    CaseFilter,
    CompareError,
    FailOn,
    Metric,
    compare_docs,
    thresholds_from,
)
from fa_bench.results.files import ResultsError

Preset = Enum("Preset", {name: name for name in PRESETS}, type=str)  # the presets' names


def compare_command(
    *,
    baseline: Path,
    current: Path,
    metric: Metric = Metric.LATENCY,
    preset: str = "default",
    thresholds: Sequence[str] = (),
    fail_on: Sequence[FailOn] = (),
    case_filter: str | None = None,
    markdown_out: Path | None = None,
    json_out: Path | None = None,
    allow_env_mismatch: bool = False,
    console: Console,
    err_console: Console,
) -> int:
    """Compare, print the verdicts, write the summaries; returns the exit code
    (0 gate passed, 1 gate failed, 2 unusable input)."""
    from fa_bench.compare.output import markdown, terminal, to_json
    from fa_bench.results.inputs import load_any

    try:
        th = thresholds_from(preset, thresholds, metric)
        flt = CaseFilter.parse(case_filter) if case_filter is not None else None
        base_docs, cur_docs = load_any(baseline), load_any(current)
        cmp = compare_docs(base_docs, cur_docs, metric=metric, thresholds=th, fail_on=fail_on,
                           case_filter=flt, allow_env_mismatch=allow_env_mismatch)  # fmt: skip
    except (CompareError, ResultsError) as exc:
        err_console.print(f"[bold red]error:[/] {exc}", highlight=False)
        return 2
    outputs = []
    if markdown_out is not None:
        text = markdown(cmp, baseline=str(baseline), current=str(current))
        outputs.append(("--markdown", markdown_out, text))
    if json_out is not None:
        text = to_json(cmp, baseline=[str(baseline)], current=[str(current)])
        outputs.append(("--json", json_out, text))
    for flag, path, text in outputs:
        try:
            path.write_text(text, encoding="utf-8")
        except OSError as exc:
            err_console.print(f"[bold red]error:[/] {flag} {path}: {exc}", highlight=False)
            return 2
    console.print(terminal(cmp))
    return cmp.exit_code


def compare(
    baseline: Annotated[
        Path,
        typer.Argument(help="Baseline: results.json, report.html, or a folder holding either."),
    ],
    current: Annotated[
        Path, typer.Argument(help="Current run: results.json, report.html, or a folder.")
    ],
    threshold: Annotated[
        list[str] | None,
        typer.Option(
            "--threshold",
            "-t",
            help="Smallest change that counts: '5%' or '0.05' for --metric, or METRIC=5% for "
            "one metric; repeatable. Overrides the preset.",
        ),
    ] = None,
    preset: Annotated[
        Preset,
        typer.Option(
            "--preset",
            help="Thresholds: default (5%, alpha 0.01), strict (2%, alpha 0.05), "
            "permissive (10%, alpha 0.001).",
        ),
    ] = Preset.default,  # type: ignore[attr-defined]
    metric: Annotated[
        Metric, typer.Option("--metric", "-m", help="What to compare.")
    ] = Metric.LATENCY,
    markdown: Annotated[
        Path | None,
        typer.Option(
            "--markdown", help="Write a Markdown summary (pull-request comment, step summary)."
        ),
    ] = None,
    json_out: Annotated[
        Path | None, typer.Option("--json", help="Write the verdicts as JSON.")
    ] = None,
    fail_on: Annotated[
        list[FailOn] | None,
        typer.Option(
            "--fail-on",
            help="Also fail (exit 1) on these verdicts; repeatable. slower and status "
            "(ok → mismatch, ok → oom, ...) always fail.",
        ),
    ] = None,
    filter_: Annotated[
        str | None,
        typer.Option(
            "--filter",
            help="Only cases matching key=glob terms, comma-separated, '|' between "
            "alternatives, e.g. 'impl=triton|sdpa-cudnn,mode=fwd'; a bare glob matches the id.",
        ),
    ] = None,
    allow_env_mismatch: Annotated[
        bool,
        typer.Option("--allow-env-mismatch", help="Compare even when the GPU models differ."),
    ] = False,
) -> None:
    """Compare two runs case by case and fail (exit 1) when a case got slower beyond the
    noise and the threshold, or its status regressed."""
    code = compare_command(
        baseline=baseline, current=current, metric=metric, preset=preset.value,
        thresholds=tuple(threshold or ()), fail_on=tuple(fail_on or ()), case_filter=filter_,
        markdown_out=markdown, json_out=json_out, allow_env_mismatch=allow_env_mismatch,
        console=_console(), err_console=Console(stderr=True, soft_wrap=True),
    )  # fmt: skip
    raise typer.Exit(code)


def _console() -> Console:
    """Rich assumes 80 columns when stdout is not a terminal, which folds every case id in
    a CI log; logs take long lines, so use 160 there unless COLUMNS says otherwise."""
    wide = not sys.stdout.isatty() and "COLUMNS" not in os.environ
    return Console(width=160 if wide else None)


def register(app: typer.Typer) -> None:
    app.command("compare")(compare)
