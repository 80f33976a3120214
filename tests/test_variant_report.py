"""The report and terminal for issue 19's variants (item 5): variant cases as their own
facets, table column and speedup/fastest keys, the "cost of the variant" view (each
variant's time against the dense case of the same shape), the terminal's cost lines, and
pages without variants (an older H200 results file, decode cases) unchanged.

Synthetic records only: each is a CaseRecord of a contract Case with a chosen median, its
TFLOP/s the FLOP model (attended pairs) ÷ that median, as the run computes it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console

from fa_bench import console as fa_console
from fa_bench import models
from fa_bench.case import Case, Mode, Status
from fa_bench.reports import axes, build, decode, figures, speedup, summary, tables, variants
from fa_bench.reports.merge import merge
from fa_bench.results.files import load_results
from fa_bench.results.record import CaseRecord, Latency, ResultsDoc
from fa_bench.variant_cost import SAME_SHAPE, SAME_TOKENS, cost_lines, variant_costs

OLD_RESULTS = Path(__file__).parent.parent / "docs/data/refactor-ab-h200-2026-11-30-before.json"
ENV = {"hostname": "node", "gpu_name": "NVIDIA H200", "gpus": [{"name": "NVIDIA H200"}]}
WIN = {"window_left": 1024, "window_right": 0}


def case(impl: str, n: int, *, batch: int = 1, **variant: object) -> Case:
    return Case(impl, Mode.FWD, "bf16", batch, 8, 8, n, n, 128, True, **variant)


def record(c: Case, median_ms: float | None, status: Status = Status.OK) -> CaseRecord:
    r = CaseRecord.for_case(c, "cuda", status, error=None if median_ms else "no kernel")
    if median_ms is not None:
        r.latency_ms = Latency(median_ms, median_ms, median_ms, median_ms, median_ms,
                               median_ms, 0.0, 3, [median_ms] * 3)  # fmt: skip
        r.tflops = models.tflops(r.flops or 0.0, median_ms)
        r.gbps_model = models.gbps(r.bytes_model or 0.0, median_ms)
    return r


def doc_of(recs: list[CaseRecord], env: dict | None = None) -> ResultsDoc:
    doc = {"schema": "fa-bench/1", "run": {"id": "r", "device": "cuda"}, "env": env or ENV,
           "cases": [r.to_json() for r in recs]}  # fmt: skip
    return ResultsDoc.from_json(json.loads(json.dumps(doc)))


# (impl, N) -> dense median, window median: the window's time falls with its pairs.
DENSE = {("flex", 4096): 2.0, ("flex", 8192): 8.0, ("sdpa", 4096): 3.0, ("sdpa", 8192): 12.0}
WINDOWED = {("flex", 4096): 0.8, ("flex", 8192): 1.6, ("sdpa", 4096): 2.5, ("sdpa", 8192): 9.0}
PACKED = "list:1000,3000"  # 4000 tokens: the dense b1 N=4096 case is within 25%


def variant_doc() -> ResultsDoc:
    recs = [record(case(i, n), ms) for (i, n), ms in DENSE.items()]
    recs += [record(case(i, n, **WIN), ms) for (i, n), ms in WINDOWED.items()]
    recs.append(record(case("flex", 4096, alibi=True), 2.2))
    recs.append(record(case("flex", 2048, softcap=50.0), 0.5))  # no dense case at 2048
    recs.append(record(case("flex", 3000, batch=2, varlen=PACKED), 1.5))
    recs.append(record(case("triton", 4096, **WIN), None, Status.UNSUPPORTED))
    return doc_of(recs)


def test_variant_cases_are_their_own_facets_in_the_line_figures() -> None:
    merged = merge([variant_doc()])
    keys = axes.facet_keys(merged.cases)
    assert ("fwd", "bf16", 128, True, "") in keys and (
        "fwd",
        "bf16",
        128,
        True,
        "win1024.0",
    ) in keys
    assert axes.facet_title(("fwd", "bf16", 128, True, "win1024.0")).endswith("causal · win1024.0")
    fig = figures.tflops_figure(merged)
    assert fig is not None
    flex = [t for t in fig.figure.data if t.name == "flex" and t.mode == "lines+markers"]
    # flex: dense, window, alibi, softcap and packed each a line of its own panel.
    assert len(flex) == 5
    dense_line = next(t for t in flex if list(t.x) == [4096, 8192] and "window" not in t.text[0])
    win_line = next(t for t in flex if t is not dense_line and list(t.x) == [4096, 8192])
    assert "window 1024/0" in win_line.text[0]  # the hover names the variant
    assert list(dense_line.y) == pytest.approx(
        [models.tflops(models.case_flops(case("flex", n)), DENSE["flex", n]) for n in (4096, 8192)]
    )
    assert list(win_line.y) != list(dense_line.y)
    titles = [a.text for a in fig.figure.layout.annotations]
    assert "fwd · bf16 · d=128 · causal · win1024.0" in titles


def test_the_cases_table_gets_a_variant_column_only_with_variants() -> None:
    merged = merge([variant_doc()])
    columns = tables.case_columns(merged)
    assert columns[columns.index("causal") + 1] == "variant"
    rows = tables.case_rows(merged)
    assert all(len(r["cells"]) == len(columns) for r in rows)
    col = columns.index("variant")
    cells = {c.record.id: r["cells"][col]["text"] for r, c in zip(rows, merged.cases, strict=True)}
    assert cells["flex/fwd/bf16/b1-hq8-hkv8-sq4096-sk4096-d128/causal"] == "–"
    assert cells["flex/fwd/bf16/b1-hq8-hkv8-sq4096-sk4096-d128/causal/win1024.0"] == (
        "window 1024/0"
    )
    packed = next(i for i in cells if i.endswith(case("flex", 3000, batch=2, varlen=PACKED).id))
    assert cells[packed] == "packed list of 2"
    status = columns.index("status")
    assert all(r["cells"][status]["text"] == r["status"] for r in rows)


def test_speedup_and_fastest_per_shape_match_a_variant_only_with_its_own() -> None:
    merged = merge([variant_doc()])
    rows = speedup.speedups(merged, "sdpa")
    ratios = {speedup.shape_label(s): r for s, r in rows["flex"]}
    assert ratios["fwd bf16 d128 causal N=4096 B=1 H=8"] == pytest.approx(3.0 / 2.0)
    assert ratios["fwd bf16 d128 causal N=4096 B=1 H=8 win1024.0"] == pytest.approx(2.5 / 0.8)
    assert len(ratios) == 4  # dense and windowed at 4k and 8k; alibi etc. have no sdpa case
    assert "in 4 of 4 shapes compared" in summary.paragraph(merged, "sdpa")


def test_cost_of_the_variant_ratios_and_controls() -> None:
    merged = merge([variant_doc()])
    costs = {c.variant.id: c for c in variants.costs(merged)}
    assert len(costs) == 8  # every variant case, with or without a control
    for (impl, n), ms in WINDOWED.items():
        cost = costs[case(impl, n, **WIN).id]
        assert cost.control == SAME_SHAPE and cost.dense.id == case(impl, n).id
        assert cost.ratio == pytest.approx(ms / DENSE[impl, n])
    alibi = costs[case("flex", 4096, alibi=True).id]
    assert alibi.ratio == pytest.approx(2.2 / 2.0)
    cap = costs[case("flex", 2048, softcap=50.0).id]
    assert cap.ratio is None and cap.note == "no dense control of the same shape"
    packed = costs[case("flex", 3000, batch=2, varlen=PACKED).id]
    assert packed.control == SAME_TOKENS and packed.dense.id == case("flex", 4096).id
    assert packed.ratio == pytest.approx(1.5 / 2.0)
    triton = costs[case("triton", 4096, **WIN).id]
    assert triton.ratio is None and triton.note == "variant unsupported"
    # Of several dense cases of about its tokens, the one of its mean document length
    # (2000 here): 2 × 2048, not 1 × 4096 or 4 × 1024; none beyond 25% of its tokens.
    recs = [record(case("flex", n, batch=4096 // n), 1.0) for n in (4096, 2048, 1024)]
    recs += [record(case("flex", 3000, batch=2, varlen=PACKED), 1.0)]
    assert variant_costs((r, "g") for r in recs)[0].dense.case.batch == 2
    recs = [record(case("flex", 4096, batch=2), 1.0), record(case("flex", 1024, batch=2), 1.0),
            recs[-1]]  # fmt: skip
    assert variant_costs((r, "g") for r in recs)[0].dense is None
    # A control that did not run is named as such.
    recs = [record(case("flex", 4096), None, Status.OOM), record(case("flex", 4096, **WIN), 1.0)]
    (only,) = variant_costs((r, "g") for r in recs)
    assert only.ratio is None and only.note == "dense control oom"
    recs += [record(case("flex", 8192), 4.0), record(case("flex", 8192, **WIN), 2.0),
             record(case("flex", 2048, **WIN), None, Status.OOM)]  # fmt: skip
    assert cost_lines(variant_costs((r, "g") for r in recs)) == [
        "flex win1024.0: 0.50× the dense time (median of 1); 2 without a ratio "
        "(1 dense control oom, 1 variant oom)"
    ]


def test_cost_figure_and_table_show_time_ratios_and_both_tflops() -> None:
    merged = merge([variant_doc()])
    fig = variants.cost_figure(merged)
    assert fig is not None and fig.id == "variant-cost"
    ratio_traces = [t for t in fig.figure.data if t.xaxis == "x" and t.name == "flex"]
    ratios = sorted(x for t in ratio_traces for x in t.x)
    expected = [0.8 / 2.0, 1.6 / 8.0, 2.2 / 2.0, 1.5 / 2.0]
    assert ratios == pytest.approx(sorted(expected))
    win8k = case("flex", 8192, **WIN)
    tflops_traces = [t for t in fig.figure.data if t.xaxis == "x2" and t.name == "flex"]
    filled, open_ = tflops_traces
    i = list(filled.y).index("win1024.0 · fwd bf16 d128 causal N=8192 B=1 H=8")
    assert filled.x[i] == pytest.approx(models.tflops(models.case_flops(win8k), 1.6))
    assert open_.x[i] == pytest.approx(models.tflops(models.case_flops(case("flex", 8192)), 8.0))
    rows = {(r["impl"], r["shape"], r["variant"]): r for r in variants.cost_rows(merged)}
    assert rows["sdpa", "fwd bf16 d128 causal N=4096 B=1 H=8", "window 1024/0"]["ratio"] == (
        f"{2.5 / 3.0:.3g}×"
    )
    packed = next(r for r in rows.values() if r["variant"] == "packed list of 2")
    assert packed["control"] == SAME_TOKENS and packed["note"] == (
        f"control {case('flex', 4096).id}: 4096 tokens, the packed batch 4000"
    )
    page = build.render([variant_doc()], plotlyjs="cdn", generated="2026-11-30T00:00:00+00:00")
    assert "8 variant cases: median time ÷ the dense case" in page
    assert 'id="section-variant-cost"' in page and 'id="variant-cost"' in page
    assert "no dense control of the same shape" in page
    # The table right under its figure; with no ratio to draw, the table alone.
    after = page[page.index('id="section-variant-cost"') :]
    assert after.index("<section", 10) == after.index('<section id="section-variant-cost-table"')
    alone = doc_of([record(case("flex", 2048, softcap=50.0), 0.5)])
    assert variants.cost_figure(merge([alone])) is None
    page = build.render([alone], plotlyjs="cdn", generated="x")
    assert 'id="section-variant-cost-table"' in page and 'id="section-variant-cost"' not in page


def test_a_page_without_variants_is_unchanged() -> None:
    merged = merge([load_results(OLD_RESULTS)])
    assert tables.case_columns(merged) == tables.CASE_COLUMNS
    assert variants.cost_figure(merged) is None and variants.cost_rows(merged) == []
    assert variants.summary_sentences(merged) == []
    assert all(k[4] == "" for k in axes.facet_keys(merged.cases))
    fig = figures.tflops_figure(merged)
    assert fig is not None
    mode, dtype, d, causal = "fwd", "bf16", 128, True  # the titles as before variants
    assert f"{mode} · {dtype} · d={d} · {'causal' if causal else 'full'}" in [
        a.text for a in fig.figure.layout.annotations
    ]
    assert all(not s[-1] for pairs in speedup.speedups(merged, "sdpa").values() for s, _ in pairs)
    page = build.render([load_results(OLD_RESULTS)], plotlyjs="cdn", generated="x")
    assert "variant-cost" not in page and "Cost of the variant" not in page


def test_decode_cases_are_unaffected_beside_variants() -> None:
    dec = Case("triton", Mode.DECODE, "bf16", 4, 8, 8, 1, 4096, 128, True, page_size=64)
    doc = doc_of([record(dec, 0.1), *variant_doc().cases])
    merged = merge([doc])
    assert variants.costs(merged)[0].variant.id != dec.id
    assert all(c.variant.case.mode is not Mode.DECODE for c in variants.costs(merged))
    columns = tables.case_columns(merged)
    after = columns[columns.index("causal") + 1 : columns.index("causal") + 4]
    assert after == ("variant", "cache", "spread")
    rows = tables.case_rows(merged)
    assert all(len(r["cells"]) == len(columns) for r in rows)
    cells = dict(zip(columns, (x["text"] for x in rows[0]["cells"]), strict=True))
    assert cells["variant"] == "–" and cells["cache"] == "page64"
    assert decode.decode_figure(merged) is not None


def test_terminal_prints_the_cost_lines_and_keeps_variants_apart() -> None:
    doc = variant_doc()
    con = Console(width=220, record=True)
    fa_console.print_summary(con, doc.cases, doc.env)
    text = con.export_text()
    assert "Cost of the variant (time ÷ the dense case of the same shape)" in text
    assert "flex win1024.0: 0.30× the dense time (median of 2, 0.20–0.40×)" in text
    assert "flex var-l2.8e1eaa71: 0.75× the dense time (median of 1; 1 against equal" in text
    # The cases without a ratio in one line: a softcap with no dense case, a triton window
    # that did not run.
    assert (
        "no ratio for 2 more: 1 no dense control of the same shape, 1 variant unsupported" in text
    )
    assert "flex cap50" not in text.split("Cost of the variant")[1]
    assert "B1 H8 N4096 D128 causal win1024.0" in text
    # Beyond the per-case limit the grouped table keeps each variant in its own row.
    many = [record(case("flex", 64 * (i + 1)), 1.0) for i in range(41)]
    many.append(record(case("flex", 64, **WIN), 1.0))
    grouped = fa_console.summary(many, 220)
    impls = [str(cell) for cell in grouped[0].columns[0]._cells]
    assert impls == ["flex", "flex win1024.0"]
    # A run without variants prints no cost lines.
    plain = Console(width=220, record=True)
    fa_console.print_summary(plain, many[:41], doc.env)
    assert "Cost of the variant" not in plain.export_text()
    assert fa_console.variant_lines(many[:41]) == []


@pytest.mark.slow
def test_a_cpu_run_of_the_variants_suite_reports_the_cost_of_each_variant(tmp_path: Path) -> None:
    """The variants suite at CPU sizes (forward, naive and sdpa, a window and its dense
    control): the summary's cost lines, and the page's figure and table with a ratio for
    every window case, from the run's own records."""
    from typer.testing import CliRunner

    import fa_bench.cli as cli

    out = tmp_path / "run"
    args = ["run", "-s", "variants", "--device", "cpu", "--dtype", "fp32", "--mode", "fwd",
            "--impl", "naive,sdpa", "--seqlen", "64", "--batch", "2", "--heads", "4",
            "--kv-heads", "2", "--head-dim", "32", "--window", "16,0", "--window", "none",
            "--softcap", "0", "--varlen", "none", "--max-time", "0.05", "--min-samples", "3",
            "--out", str(out)]  # fmt: skip
    result = CliRunner().invoke(cli.app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "Cost of the variant (time ÷ the dense case of the same shape)" in result.output
    doc = load_results(out / "results.json")
    merged = merge([doc])
    costs = variants.costs(merged)
    windows = [c for c in costs if c.variant.case.has_window and not c.variant.case.alibi]
    assert {c.variant.impl for c in windows} == {"naive", "sdpa"}
    for c in windows:
        assert c.control == SAME_SHAPE and c.dense.id == c.variant.id.rsplit("/", 1)[0]
        assert c.ratio == pytest.approx(c.variant.latency_ms.median / c.dense.latency_ms.median)
    page = (out / "report.html").read_text()
    assert 'id="section-variant-cost"' in page and 'id="section-variant-cost-table"' in page


def test_every_variant_of_the_variants_suite_has_a_dense_control() -> None:
    """The built-in suite as the H200 will run it: each variant case finds its control
    (packed batches: the equal-length case of the group's mean length and about its
    tokens), so no ratio there is missing for want of a pairing."""
    from fa_bench.suite.expand import Overrides, load_suite

    impls = ("naive", "sdpa", "sdpa-math", "sdpa-efficient", "sdpa-cudnn", "flex", "triton", "fa4")
    cases = load_suite("variants", Overrides(), known_impls=impls).cases
    costs = variant_costs((record(c, 1.0), "H200") for c in cases)
    assert len(costs) == sum(c.is_variant for c in cases) > 0
    assert all(c.dense is not None for c in costs)
    packed = [c for c in costs if c.variant.case.varlen]
    assert packed and all(c.control == SAME_TOKENS for c in packed)
    assert {c.dense.case.seqlen_q for c in packed} == {2048}
