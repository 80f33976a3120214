"""The report's rough edges of issue 15 (items 2 and 9): cases stopped at their time limit
above the noise target are flagged; the legend lists each series once, each in its own
style; every memory panel has its y label; two runs of the same cases show side by side."""

from __future__ import annotations

import json
import re

from report_fixture import _env, document, make_case

from fa_bench.reports import figures, summary, tables
from fa_bench.reports.build import render
from fa_bench.reports.merge import merge
from fa_bench.results.record import CaseRecord, ResultsDoc


def _case(impl: str, mode: str, hq: int, hkv: int, n: int, causal: bool, **kw: object) -> dict:
    c = make_case(impl, n, **kw)  # type: ignore[arg-type]
    mask = "causal" if causal else "full"
    c.update(mode=mode, heads_q=hq, heads_kv=hkv, causal=causal, device="cpu", dtype="fp32",
             id=f"{impl}/{mode}/fp32/b2-hq{hq}-hkv{hkv}-sq{n}-sk{n}-d128/{mask}")  # fmt: skip
    return c


def _cpu_doc(cases: list[dict], out: str = "runA", run_id: str = "a1") -> ResultsDoc:
    run = {"id": run_id, "started": "2026-11-30T10:00:00+00:00", "device": "cpu",
           "argv": ["fa-bench", "run", "--out", f"/tmp/x/{out}"], "suites": []}  # fmt: skip
    env = {**_env("unused", "host-a", 1), "gpus": [], "gpu_name": None}
    return document(run, env, cases)


def _smoke_like() -> list[dict]:
    """The smoke suite's shape: MHA full and causal, one GQA case beside it (causal)."""
    cases = []
    for impl in ("naive", "sdpa"):
        for n in (128, 256):
            cases += [
                _case(impl, "fwd", 2, 2, n, False),
                _case(impl, "fwd", 2, 2, n, True),
                _case(impl, "fwd", 4, 1, n, True),
            ]
    return cases


def _legend(fig) -> list:
    return [t for t in fig.data if t.showlegend is not False and t.legend in (None, "legend")]


def test_legend_lists_each_series_once_in_its_own_style() -> None:
    fig = figures.tflops_figure(merge([_cpu_doc(_smoke_like())])).figure
    entries = _legend(fig)
    names = [t.name for t in entries]
    assert len(names) == len(set(names))
    # one name per series in every panel: not `naive` in one and `naive · H..` in the next
    assert sorted(names) == sorted(
        f"{impl} · Hq={hq} Hkv={hkv}" for impl in ("naive", "sdpa") for hq, hkv in ((2, 2), (4, 1))
    )
    styles = [(t.line.color, t.marker.symbol, t.line.dash) for t in entries]
    assert len(set(styles)) == len(styles), styles
    # colour per implementation
    colors = {t.name.split(" · ")[0]: set() for t in entries}
    for t in entries:
        colors[t.name.split(" · ")[0]].add(t.line.color)
    assert all(len(c) == 1 for c in colors.values()) and len(
        {next(iter(c)) for c in colors.values()}
    ) == len(colors)
    # every trace of one name draws in that name's style, in every panel
    by_name: dict[str, set] = {}
    for t in fig.data:
        if t.mode == "lines+markers":
            by_name.setdefault(t.name, set()).add((t.line.color, t.marker.symbol, t.line.dash))
    assert all(len(s) == 1 for s in by_name.values())


def test_one_head_count_per_panel_needs_no_head_label() -> None:
    cases = [_case("naive", "fwd", 2, 2, n, causal) for n in (128, 256) for causal in (False, True)]
    cases += [_case("naive", "bwd", 4, 4, n, False) for n in (128, 256)]
    fig = figures.tflops_figure(merge([_cpu_doc(cases)])).figure
    assert [t.name for t in _legend(fig)] == ["naive"]


def test_every_memory_panel_has_its_y_label() -> None:
    cases = []
    for mode in ("fwd", "bwd", "fwd_bwd"):
        for causal in (False, True):
            for impl in ("sdpa", "triton"):
                cases += [_case(impl, mode, 16, 16, n, causal) for n in (1024, 4096)]
    doc = document(
        {"id": "g", "device": "cuda", "argv": []}, _env("NVIDIA H200", "node-a", 141), cases
    )
    fig = figures.memory_figure(merge([doc])).figure
    layout = fig.layout.to_plotly_json()
    axes = [k for k in layout if re.fullmatch(r"yaxis\d*", k)]
    assert len(axes) == 6
    assert all(fig.layout[k].title.text == "peak memory (GiB)" for k in axes), [
        (k, fig.layout[k].title.text) for k in axes
    ]


def test_two_runs_of_the_same_cases_show_side_by_side() -> None:
    cases = _smoke_like()
    slower = json.loads(json.dumps(cases))
    for c in slower:
        c["latency_ms"]["median"] *= 2
    a, b = _cpu_doc(cases, "runA", "a1"), _cpu_doc(slower, "runB", "b2")
    merged = merge([a, b])
    assert merged.gpus == ["CPU (runA)", "CPU (runB)"]
    assert len(merged.cases) == 2 * len(cases) and merged.replaced == 0
    medians = {(c.gpu, c.record.id): c.record.median_ms for c in merged.cases}
    one = cases[0]["id"]
    assert medians[("CPU (runB)", one)] == 2 * medians[("CPU (runA)", one)]
    names = {t.name for t in _legend(figures.tflops_figure(merged).figure)}
    assert "naive · CPU (runA) · Hq=2 Hkv=2" in names
    assert "naive · CPU (runB) · Hq=2 Hkv=2" in names
    rows = tables.case_rows(merged)
    assert {r["cells"][0]["text"] for r in rows} == {"CPU (runA)", "CPU (runB)"}
    assert "CPU timings show" in summary.paragraph(merged, "naive")
    page = render([a, b], plotlyjs="cdn")
    assert "CPU (runA)" in page and "CPU (runB)" in page
    # A run given twice is one run: its cases are not doubled.
    again = merge([a, a])
    assert again.gpus == ["CPU"] and again.replaced == len(cases)


def test_runs_of_different_cases_on_one_machine_stay_one_series() -> None:
    cases = _smoke_like()
    a = _cpu_doc([c for c in cases if c["impl"] == "naive"], "runA", "a1")
    b = _cpu_doc([c for c in cases if c["impl"] == "sdpa"], "runB", "b2")
    assert merge([a, b]).gpus == ["CPU"]


def _limited(noise: float, reason: str = "time-limit") -> dict:
    c = _case("naive", "fwd", 2, 2, 128, False)
    c["latency_ms"]["noise"] = noise
    c["timing"] = {"method": "perf_counter", "stop_reason": reason, "target_noise": 0.01,
                   "max_time_s": 1.0, "warmup_calls": 3, "l2_flush": False}  # fmt: skip
    return c


def test_noisy_at_limit_property() -> None:
    assert CaseRecord.from_json(_limited(0.05)).noisy_at_limit
    assert not CaseRecord.from_json(_limited(0.005)).noisy_at_limit  # under the target
    assert not CaseRecord.from_json(_limited(0.05, "noise")).noisy_at_limit
    assert not CaseRecord.from_json(_case("naive", "fwd", 2, 2, 128, False)).noisy_at_limit
    failed = _case("naive", "fwd", 2, 2, 128, False, status="error", error="boom")
    assert not CaseRecord.from_json(failed).noisy_at_limit


def test_time_limited_case_is_flagged_in_the_report() -> None:
    flagged = _limited(0.053)
    calm = _case("naive", "fwd", 2, 2, 256, False)
    doc = _cpu_doc([flagged, calm])
    merged = merge([doc])
    note = "stopped at the time limit (1 s) with noise 5.3% above the 1.0% target"
    sk = tables.CASE_COLUMNS.index("Sk")
    messages = {r["cells"][sk]["text"]: r["cells"][-1]["text"] for r in tables.case_rows(merged)}
    assert note in messages["128"] and messages["256"] == "–"
    assert "1 case stopped at the time limit" in summary.paragraph(merged, "naive")
    hovers = [h for t in figures.tflops_figure(merged).figure.data for h in (t.text or ())]
    assert sum(note in h for h in hovers) == 1
    page = render([doc], plotlyjs="cdn")
    assert note in page and "1 case stopped at the time limit" in page


def test_cpu_run_header_names_its_threads() -> None:
    doc = _cpu_doc([_case("naive", "fwd", 2, 2, 128, False)])
    doc.env.update(cpu_threads=1, omp_num_threads="1")
    page = render([doc], plotlyjs="cdn")
    assert "CPU threads 1 (OMP_NUM_THREADS=1)" in page
