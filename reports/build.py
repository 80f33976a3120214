"""Merge results documents into one comparison and render the report page.

Runs from different GPUs or nodes merge into one table of cases keyed by (case id, GPU):
each case gets a `gpu` label, so the same case measured on two cards stays two rows and the
figures draw one line per implementation and GPU. A case measured twice on the same GPU
keeps the later run's record (inputs are read in the order given).
"""

from __future__ import annotations

import html
import os
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from fa_bench.env import cudnn_version
from fa_bench.errors import UsageError
from fa_bench.reports.embed import embed_json

PLOTLYJS_CHOICES = ("inline", "cdn")
_DEFAULT_BASELINES = ("sdpa", "sdpa-cudnn", "sdpa-flash", "naive")


class ReportError(UsageError, ValueError):
    """Bad input for a report (an unknown baseline, no cases): maps to exit code 2."""


@dataclass
class Merged:
    """The docs as given, and their cases, each tagged with `gpu` and `run` (doc index)."""

    docs: list[dict]
    cases: list[dict]
    gpus: list[str]
    replaced: int = 0
    impls: list[str] = field(default_factory=list)
    label_doc: dict[str, int] = field(default_factory=dict)  # GPU label -> its run's index

    def labelled_docs(self) -> list[tuple[dict, str]]:
        """(results document, GPU label) for every GPU label, in order."""
        return [(self.docs[self.label_doc[label]], label) for label in self.gpus]


def gpu_label(doc: dict) -> str:
    """What the run ran on: the GPU's name, or 'CPU' for a CPU run."""
    env = doc.get("env") or {}
    if env.get("gpu_name"):
        return str(env["gpu_name"])
    gpus = env.get("gpus") or []
    if gpus and (doc.get("run") or {}).get("device") != "cpu":
        return str(gpus[0].get("name") or "GPU")
    return "CPU"


def _labels(docs: list[dict]) -> list[str]:
    """GPU labels, with the host added where two hosts have the same kind of GPU, so a
    merge of two nodes keeps both."""
    base = [gpu_label(d) for d in docs]
    hosts: dict[str, set[str]] = {}
    for label, doc in zip(base, docs, strict=True):
        hosts.setdefault(label, set()).add(str((doc.get("env") or {}).get("hostname")))
    return [
        f"{label} @ {(doc.get('env') or {}).get('hostname')}" if len(hosts[label]) > 1 else label
        for label, doc in zip(base, docs, strict=True)
    ]


def _case_label(case: dict, run_label: str, several_gpus: bool) -> str:
    """A run over several GPUs (`--gpus`, torchrun) tags each case with its own GPU and
    host: those cases keep apart, labelled 'NAME #index @ host'."""
    gpu = case.get("gpu")
    if not several_gpus or not isinstance(gpu, dict):
        return run_label
    label = f"{gpu.get('name') or run_label} #{gpu.get('index')}"
    return f"{label} @ {case['host']}" if case.get("host") else label


def _several_gpus(doc: dict) -> bool:
    seen = {
        (c.get("host"), c["gpu"].get("index"), c["gpu"].get("uuid"))
        for c in doc["cases"]
        if isinstance(c.get("gpu"), dict)
    }
    return len(seen) > 1


def merge(docs: list[dict]) -> Merged:
    if not docs:
        raise ReportError("no results documents to report on")
    run_labels = _labels(docs)
    by_key: dict[tuple[str, str], dict] = {}
    replaced = 0
    labels: list[str] = []
    label_doc: dict[str, int] = {}
    for run_index, (doc, run_label) in enumerate(zip(docs, run_labels, strict=True)):
        several = _several_gpus(doc)
        for case in doc["cases"]:
            label = _case_label(case, run_label, several)
            labels.append(label)
            label_doc.setdefault(label, run_index)
            key = (case["id"], label)
            replaced += key in by_key
            by_key[key] = {**case, "gpu": label, "run": run_index}
    cases = list(by_key.values())
    if not cases:
        raise ReportError("the results hold no cases")
    gpus = list(dict.fromkeys(labels))
    impls = list(dict.fromkeys(c["impl"] for c in cases))
    return Merged(
        docs=docs, cases=cases, gpus=gpus, replaced=replaced, impls=impls, label_doc=label_doc
    )


def choose_baseline(merged: Merged, requested: str | None) -> str:
    if requested is not None:
        if requested not in merged.impls:
            valid = ", ".join(merged.impls)
            raise ReportError(f"--baseline {requested!r} is not in the results (present: {valid})")
        return requested
    for name in _DEFAULT_BASELINES:
        if name in merged.impls:
            return name
    return merged.impls[0]


def _env_value(env: dict, key: str) -> str:
    if key == "cudnn":
        return cudnn_version(env.get(key))
    return "–" if env.get(key) is None else str(env[key])


def _env_rows(doc: dict, label: str) -> list[tuple[str, str]]:
    env = doc.get("env") or {}
    run = doc.get("run") or {}
    rows = [("GPU", label)]
    for key in ("hostname", "driver", "torch", "triton", "cuda", "cudnn", "python", "platform"):
        rows.append((key, _env_value(env, key)))
    rows.append(("fa-bench", f"{run.get('fa_bench', '–')} ({run.get('git_sha') or 'no git'})"))
    rows.append(("started", str(run.get("started") or "–")))
    rows.append(("ended", str(run.get("ended") or "–")))
    return rows


_WHERE_KEYS = ("hostname", "driver", "torch", "triton", "cuda", "cudnn")


def where_line(doc: dict, label: str) -> list[str]:
    """The header's 'where' items: the GPU and the software versions the run recorded."""
    env = doc.get("env") or {}
    items = [f"GPU {label}"]
    items += [f"{k} {_env_value(env, k)}" for k in _WHERE_KEYS if env.get(k) is not None]
    return items


def run_notes(doc: dict) -> list[str]:
    """What a reader should know about how the numbers were produced: a run resumed after
    a stop (its cases come from several sessions), an interrupted one (cases are missing)
    and code from a git tree with uncommitted changes (the sha alone does not pin it)."""
    run = doc.get("run") or {}
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


def _command(doc: dict) -> str:
    argv = (doc.get("run") or {}).get("argv") or []
    return " ".join(str(a) for a in argv) or "–"


def _suites(docs: list[dict]) -> list[dict]:
    seen: dict[str, dict] = {}
    for doc in docs:
        for s in (doc.get("run") or {}).get("suites") or []:
            seen.setdefault(str(s.get("name")), s)
    return list(seen.values())


def render(
    docs: list[dict],
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

    from fa_bench.reports import figures, summary, tables
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
    figs = figures.build_all(merged, base)
    labels = _labels(docs)
    runs = [
        {
            "label": lbl,
            "command": _command(d),
            "env": _env_rows(d, lbl),
            "where": where_line(d, lbl),
            "notes": run_notes(d),
            "raw_env": d.get("env"),
        }
        for d, lbl in zip(docs, labels, strict=True)
    ]
    return _template(plotlyjs).render(
        sweeps=sweep_sections,
        title=title,
        generated=generated or datetime.now(timezone.utc).isoformat(timespec="seconds"),
        runs=runs,
        suites=_suites(docs),
        gpus=merged.gpus,
        baseline=base,
        summary=summary.paragraph(merged, base),
        replaced=merged.replaced,
        figures=figs,  # the sweep heatmaps are drawn inside their own sections
        figures_json=jinja2.utils.markupsafe.Markup(figures.figures_json(figs + sweep_figs)),
        table=tables.case_rows(merged),
        columns=tables.CASE_COLUMNS,
        telemetry_note=tables.telemetry_note(merged),
        failures=tables.failure_rows(merged),
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

    from fa_bench.reports import figures

    return _template(plotlyjs).render(
        title=env_title,
        generated=generated or datetime.now(timezone.utc).isoformat(timespec="seconds"),
        runs=[], suites=[], gpus=[], baseline=None, replaced=0, table=[], columns=[],
        summary="Block-size sweep of our Triton kernel: every config timed with the run "
        "engine and checked for accuracy; a fast wrong config is a failure, not a winner.",
        figures=[], figures_json=jinja2.utils.markupsafe.Markup(figures.figures_json(figs)),
        telemetry_note=None, failures=[], telemetry_flags=[], sweeps=sweeps,
        results_json="",
    )  # fmt: skip


def write_report(
    docs: list[dict],
    out: str | os.PathLike,
    *,
    title: str | None = None,
    baseline: str | None = None,
    plotlyjs: str = "inline",
    sweeps: list[dict] | None = None,
) -> Path:
    """Render and write atomically (temp file, then rename); returns the page's path."""
    page = render(docs, title=title, baseline=baseline, plotlyjs=plotlyjs, sweeps=sweeps)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(page, encoding="utf-8")
    os.replace(tmp, out)
    return out
