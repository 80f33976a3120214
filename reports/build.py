"""The report page: one self-contained HTML file from merged results (and sweeps).

The cases come merged and labelled from fa_bench.reports.merge; the figures and tables
read them from there; this module lays the page out and writes it. Nothing imports it
back but the commands that write a page.
"""

from __future__ import annotations

import html
import os
from datetime import datetime, timezone
from pathlib import Path

from fa_bench.env import cudnn_version
from fa_bench.reports import (
    decode,
    figures,
    per_gpu,
    roofline,
    speedup,
    summary,
    tables,
    variants,
)
from fa_bench.reports.embed import embed_json
from fa_bench.reports.figures import Figure
from fa_bench.reports.merge import Merged, ReportError, choose_baseline, merge, run_labels
from fa_bench.results.record import ResultsDoc

PLOTLYJS_CHOICES = ("inline", "cdn")


def build_all(merged: Merged, baseline: str) -> list[Figure]:
    """The page's figures in page order, leaving out those with nothing to draw."""
    prefill = decode.without_decode(merged)  # decode has its own, bandwidth-first view
    built = [
        figures.tflops_figure(prefill),
        decode.decode_figure(merged),
        figures.memory_figure(prefill),
        variants.cost_figure(merged),  # issue 19: each variant against its dense case
        speedup.speedup_figure(merged, baseline),
        roofline.roofline_figure(merged),
        roofline.bandwidth_figure(merged),
        roofline.telemetry_figure(merged),
        per_gpu.per_gpu_figure(merged),
    ]
    figs = [f for f in built if f is not None]
    for f in figs:
        # The page's <h2> titles each figure: plotly's default 100 px top margin, kept
        # for a title it never draws, would leave a blank band above the plot.
        if f.figure.layout.margin.t is None:
            f.figure.update_layout(margin_t=24)
    return figs


def _env_value(env: dict, key: str) -> str:
    if key == "cudnn":
        return cudnn_version(env.get(key))
    return "–" if env.get(key) is None else str(env[key])


def _env_rows(doc: ResultsDoc, label: str) -> list[tuple[str, str]]:
    env, run = doc.env, doc.run
    rows = [("GPU", label)]
    for key in ("hostname", "driver", "torch", "triton", "cuda", "cudnn", "python", "platform"):
        rows.append((key, _env_value(env, key)))
    rows += peer_packages(env)
    if env.get("cpu_threads") is not None:  # the worker's (fa_bench/env.py cpu_threads)
        rows.append(("CPU threads", _threads(env)))
    rows.append(("fa-bench", f"{run.get('fa_bench', '–')} ({run.get('git_sha') or 'no git'})"))
    rows.append(("started", str(run.get("started") or "–")))
    rows.append(("ended", str(run.get("ended") or "–")))
    return rows


_WHERE_KEYS = ("hostname", "driver", "torch", "triton", "cuda", "cudnn")


def where_line(doc: ResultsDoc, label: str) -> list[str]:
    """The header's 'where' items: the GPU and the software versions the run recorded."""
    env = doc.env
    items = [f"GPU {label}"]
    items += [f"{k} {_env_value(env, k)}" for k in _WHERE_KEYS if env.get(k) is not None]
    if doc.run.get("device") == "cpu" and env.get("cpu_threads") is not None:
        items.append(f"CPU threads {_threads(env)}")  # CPU timings depend on it
    return items + [f"{name} {version}" for name, version in peer_packages(env)]


def _threads(env: dict) -> str:
    omp = env.get("omp_num_threads")
    return str(env["cpu_threads"]) + (f" (OMP_NUM_THREADS={omp})" if omp else "")


def peer_packages(env: dict) -> list[tuple[str, str]]:
    """The installed peers' packages the run recorded (env.packages: pip name -> version,
    null when not installed; fa_bench/env.py), as (name, version); an older results file
    has none, and anything but strings is left out rather than failing the page."""
    packages = env.get("packages")
    if not isinstance(packages, dict):
        return []
    return [(str(k), v) for k, v in packages.items() if isinstance(v, str) and v]


def run_notes(doc: ResultsDoc) -> list[str]:
    """What a reader should know about how the numbers were produced: a run resumed after
    a stop (its cases come from several sessions), an interrupted one (cases are missing)
    and code from a git tree with uncommitted changes (the sha alone does not pin it)."""
    run = doc.run
    notes = []
    resumed = run.get("resumed") or []
    if resumed:
        times = ", ".join(str(t) for t in resumed)
        notes.append(f"resumed {len(resumed)} time{'s' if len(resumed) != 1 else ''} ({times})")
    if run.get("interrupted"):
        notes.append("interrupted: the cases not run are missing")
    sha = str(run.get("git_sha") or "")
    if sha.endswith("+dirty"):
        short = sha.removesuffix("+dirty")[:12]
        notes.append(f"built from a git tree with uncommitted changes ({short}+dirty)")
    return notes


def _command(doc: ResultsDoc) -> str:
    argv = doc.run.get("argv") or []
    return " ".join(str(a) for a in argv) or "–"


def _suites(docs: list[ResultsDoc]) -> list[dict]:
    seen: dict[str, dict] = {}
    for doc in docs:
        for s in doc.run.get("suites") or []:
            seen.setdefault(str(s.get("name")), s)
    return list(seen.values())


def _runs(docs: list[ResultsDoc]) -> list[dict]:
    """The header's and the environment section's view of each run."""
    return [
        {
            "label": lbl,
            "command": _command(d),
            "env": _env_rows(d, lbl),
            "where": where_line(d, lbl),
            "notes": run_notes(d),
            "raw_env": d.env,
        }
        for d, lbl in zip(docs, run_labels(docs), strict=True)
    ]


def render(
    docs: list[ResultsDoc],
    *,
    title: str | None = None,
    baseline: str | None = None,
    plotlyjs: str = "inline",
    generated: str | None = None,
    sweeps: list[dict] | None = None,
) -> str:
    """The report page as one HTML string (self-contained unless plotlyjs='cdn').

    `sweeps` (sweep.json documents) add the block-size sweep sections; a page may hold
    only sweeps, without results."""
    import jinja2

    from fa_bench.reports.sweep_section import sweep_parts

    if plotlyjs not in PLOTLYJS_CHOICES:
        raise ReportError(f"--plotlyjs {plotlyjs!r} is not one of: {', '.join(PLOTLYJS_CHOICES)}")

    sweep_figs, sweep_sections = sweep_parts(sweeps or [])
    if not docs and sweep_sections:
        return _render_page(
            env_title=title or "fa-bench: block-size sweep",
            generated=generated, plotlyjs=plotlyjs, figs=sweep_figs, sweeps=sweep_sections,
        )  # fmt: skip
    merged = merge(docs)
    base = choose_baseline(merged, baseline)
    suite_names = [str(s.get("name")) for s in _suites(docs)]
    title = title or f"fa-bench: {', '.join(suite_names) or 'results'} on {', '.join(merged.gpus)}"
    figs = build_all(merged, base)
    case_rows = tables.case_rows(merged)
    columns = tables.case_columns(merged)  # decode cases add their cache, spread, fractions
    return _template(plotlyjs).render(
        sweeps=sweep_sections,
        title=title,
        generated=generated or datetime.now(timezone.utc).isoformat(timespec="seconds"),
        runs=_runs(docs),
        suites=_suites(docs),
        gpus=merged.gpus,
        baseline=base,
        summary=summary.paragraph(merged, base),
        replaced=merged.replaced,
        figures=figs,  # the sweep heatmaps are drawn inside their own sections
        figures_json=jinja2.utils.markupsafe.Markup(figures.figures_json(figs + sweep_figs)),
        table=case_rows,
        table_html=tables.case_rows_html(case_rows, columns.index("status")),  # escaped there
        columns=columns,
        telemetry_note=tables.telemetry_note(merged),
        failures=tables.failure_rows(merged),
        variant_cost=variants.cost_rows(merged),
        telemetry_flags=tables.throttle_rows(merged),
        results_json=jinja2.utils.markupsafe.Markup(embed_json(docs)),
    )


def _template(plotlyjs: str):
    import jinja2
    import plotly.offline

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("fa_bench.reports", "templates"),
        autoescape=True,  # every string from the data is escaped; plotly.js is marked safe
        undefined=jinja2.StrictUndefined,
    )
    if plotlyjs == "inline":
        script = jinja2.utils.markupsafe.Markup(
            "<script>" + plotly.offline.get_plotlyjs() + "</script>"
        )
    else:
        version = plotly.offline.get_plotlyjs_version()
        src = f"https://cdn.plot.ly/plotly-{version}.min.js"
        script = jinja2.utils.markupsafe.Markup(
            f'<script src="{html.escape(src)}" charset="utf-8"></script>'
        )
    template = env.get_template("report.html.j2")
    template.globals["plotly_script"] = script
    return template


def _render_page(*, env_title: str, generated: str | None, plotlyjs: str, figs: list,
                 sweeps: list[dict]) -> str:  # fmt: skip
    """A page with sweep sections only."""
    import jinja2

    return _template(plotlyjs).render(
        title=env_title,
        generated=generated or datetime.now(timezone.utc).isoformat(timespec="seconds"),
        runs=[], suites=[], gpus=[], baseline=None, replaced=0, table=[], table_html="", columns=[],
        summary="Block-size sweep of our Triton kernel: every config timed with the run "
        "engine and checked for accuracy; a fast wrong config is a failure, not a winner.",
        figures=[], figures_json=jinja2.utils.markupsafe.Markup(figures.figures_json(figs)),
        telemetry_note=None, failures=[], telemetry_flags=[], sweeps=sweeps, variant_cost=[],
        results_json="",
    )  # fmt: skip


def write_report(
    docs: list[ResultsDoc],
    out: str | os.PathLike,
    *,
    title: str | None = None,
    baseline: str | None = None,
    plotlyjs: str = "inline",
    sweeps: list[dict] | None = None,
) -> Path:
    """Render and write atomically (temp file, then rename); returns the page's path. The
    temp file never outlives the call: a failed write or rename removes it."""
    out = Path(out)
    if out.is_dir():  # before rendering: the page could never replace a folder
        raise ReportError(f"-o {out}: is a folder; name the page, e.g. -o {out / 'report.html'}")
    if out.exists() and not out.is_file():  # a FIFO, a device: the rename would replace it
        raise ReportError(f"-o {out}: not a regular file (a device, FIFO or socket); name a page")
    page = render(docs, title=title, baseline=baseline, plotlyjs=plotlyjs, sweeps=sweeps)
    out.parent.mkdir(parents=True, exist_ok=True)
    # Per process, beside the page (a rename stays on one file system); not mkstemp, whose
    # 0600 mode the page would keep.
    tmp = out.with_name(f"{out.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(page, encoding="utf-8")
        os.replace(tmp, out)
    except BaseException:  # a full disk, a folder created meanwhile, Ctrl-C: no leftovers
        tmp.unlink(missing_ok=True)
        raise
    return out
