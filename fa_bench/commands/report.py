"""`fa-bench report`: one self-contained HTML page from one or more results."""

from __future__ import annotations

import os
from pathlib import Path

from rich.console import Console
from rich.text import Text

from fa_bench.errors import UsageError, print_error
from fa_bench.words import plural


class ReportOutRequired(UsageError):
    """Several inputs merged into one page, and no --out to say where it goes."""


def report_command(
    *,
    inputs: list[str | os.PathLike],
    out: Path | None,
    baseline: str | None,
    title: str | None,
    plotlyjs: str,
    console: Console,
    err_console: Console,
) -> int:
    """Read the inputs, merge them, write the page; returns the exit code (2: bad input)."""
    from fa_bench.reports.build import write_report
    from fa_bench.results.inputs import load_many
    from fa_bench.sweep.execute import load_sweep

    try:
        out = out or _default_out(inputs)
        found = [(p, _sweep_file(p)) for p in inputs]
        result_paths = [p for p, sweep in found if sweep is None]
        sweeps = [load_sweep(sweep) for _, sweep in found if sweep is not None]
        docs = load_many(result_paths) if result_paths else []
        path = write_report(docs, out, title=title, baseline=baseline, plotlyjs=plotlyjs,
                            sweeps=sweeps)  # fmt: skip
    except UsageError as exc:
        return print_error(err_console, exc)
    except OSError as exc:
        return print_error(err_console, f"cannot write {out}: {exc}")
    size = path.stat().st_size / 2**20
    what = ", ".join(plural(n, noun) for n, noun in ((len(docs), "run"), (len(sweeps), "sweep"))
                     if n)  # fmt: skip
    console.print(f"report: {path} ({size:.1f} MiB, {what or 'no runs'})", highlight=False,
                  markup=False)  # fmt: skip
    return 0


def _sweep_file(path: str | os.PathLike) -> Path | None:
    """The sweep.json an input names (the file, or a sweep folder), else None."""
    p = Path(path)
    try:
        if p.is_dir():
            p = p / "sweep.json"
            return p if p.is_file() and not (p.parent / "results.json").exists() else None
        if p.suffix == ".json" and p.is_file():
            # A binary or non-UTF-8 file is no sweep: load_any then says what it is.
            with open(p, encoding="utf-8", errors="replace") as f:
                head = f.read(200)
            return p if '"fa-bench-sweep/' in head else None
    except OSError:
        return None  # unreadable: load_any names the path and the reason
    return None


def write_run_report(json_path: Path, *, console: Console, err_console: Console) -> Path | None:
    """`fa-bench run`'s report.html beside its results.json. The results are already on
    disk when this runs, so any failure here is a warning: the run keeps its exit code."""
    from fa_bench.reports.build import write_report
    from fa_bench.results.files import load_results

    out = Path(json_path).with_name("report.html")
    try:
        path = write_report([load_results(json_path)], out)
    except Exception as exc:
        why = (f" report not written ({type(exc).__name__}: {exc}); the results are intact: "
               f"fa-bench report {Path(json_path).parent}")  # fmt: skip
        err_console.print(Text.assemble(("warning:", "yellow"), why))  # data, not markup
        return None
    console.print(f"report:  {path}", highlight=False, markup=False)
    return path


def _default_out(inputs: list[str | os.PathLike]) -> Path:
    """report.html beside a single input (never over the page being read). Several inputs
    have no folder of their own: the page's place must be given (--out), not guessed."""
    if len(inputs) > 1:
        raise ReportOutRequired(
            f"report: {plural(len(inputs), 'input')} are merged into one page: say where to "
            "write it with --out/-o, e.g. -o compare.html"
        )
    first = Path(inputs[0])
    folder = first if first.is_dir() else first.parent
    out = folder / "report.html"
    if Path(first).resolve() == out.resolve():
        out = out.with_name("report-merged.html")
    return out
