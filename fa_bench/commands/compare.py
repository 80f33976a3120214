"""`fa-bench compare`: the CI regression gate over two results (README "Comparing runs")."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from rich.console import Console

from fa_bench.compare.core import CaseFilter, FailOn, Metric, compare_docs, thresholds_from
from fa_bench.errors import UsageError, print_error


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
    except UsageError as exc:
        return print_error(err_console, exc)
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
            return print_error(err_console, f"{flag} {path}: {exc}")
    console.print(terminal(cmp, width=console.width))
    for flag, path, _ in outputs:  # after the verdicts: the last lines of a CI log
        what = "Markdown summary" if flag == "--markdown" else "verdicts (JSON)"
        console.print(f"{what}: {path}", markup=False, highlight=False, soft_wrap=True)
    return cmp.exit_code
