"""The report: merge, figures, summary, escaping, embedded JSON, `fa-bench report`, inputs."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
from report_fixture import EVIL, GIB, _env, _run, clone, document, make_case, two_gpu_docs
from typer.testing import CliRunner

from fa_bench.cli import app
from fa_bench.reports import figures, roofline, speedup, summary
from fa_bench.reports.axes import log_ticks
from fa_bench.reports.build import build_all, render
from fa_bench.reports.embed import extract_results
from fa_bench.reports.merge import ReportError, choose_baseline, merge
from fa_bench.results.inputs import load_any
from fa_bench.results.record import ResultsDoc, ResultsError

H200, A100 = "NVIDIA H200", "NVIDIA A100"


@pytest.fixture(scope="module")
def docs() -> list[ResultsDoc]:
    return two_gpu_docs()


@pytest.fixture(scope="module")
def page(docs: list[ResultsDoc]) -> str:
    return render(docs, plotlyjs="cdn", generated="2026-11-29T12:00:00+00:00")


def fixed_token_docs(tokens: int = 16384) -> list[ResultsDoc]:
    """One GPU, the standard suite's layout: batch = tokens / N, so batch falls as N rises,
    over two (mode, dtype, d, masking) groups; sdpa at 1 ms, triton a bit slower, naive far
    slower."""
    cases = []
    for causal in (False, True):
        for n in (512, 1024, 2048, 4096, 8192, 16384):
            for impl, median in (("sdpa", 1.0), ("triton", 1.0 / 0.7), ("naive", 30.0)):
                c = make_case(impl, n, median=median)
                c["batch"] = tokens // n
                c["causal"] = causal
                c["id"] += "/causal" if causal else ""
                c["peak_mem_bytes"] = c["batch"] * 16 * n * n * 4 if impl == "naive" else 2**26
                cases.append(c)
    return [document(_run("t"), _env("NVIDIA H200", "node-a", 141), cases)]


def _figure_specs(page: str) -> dict:
    found = re.search(r'id="fa-bench-figures">(.*?)</script>', page, re.S)
    assert found
    return json.loads(found.group(1))


def test_merge_keys_by_id_and_gpu(docs: list[ResultsDoc]) -> None:
    merged = merge(docs)
    assert merged.gpus == [H200, A100]
    assert len(merged.cases) == 12  # the same ids on two GPUs stay apart
    again = merge([*docs, docs[0]])  # a repeated run replaces, not duplicates
    assert len(again.cases) == 12 and again.replaced == 6


def test_same_gpu_on_two_hosts_stays_apart(docs: list[ResultsDoc]) -> None:
    other = clone(docs[0])
    other.env["hostname"] = "node-c"
    merged = merge([docs[0], other])
    assert merged.gpus == [f"{H200} @ node-a", f"{H200} @ node-c"]


def test_tflops_traces(docs: list[ResultsDoc]) -> None:
    fig = figures.tflops_figure(merge(docs)).figure
    names = {t.name: t for t in fig.data}
    lines = {f"{impl} · {gpu}" for impl in ("sdpa", "triton") for gpu in (H200, A100)}
    assert set(names) == lines | {"out of memory", "failed (error/timeout/mismatch)"}
    # ok cases only on the lines; the OOM and the mismatch are marked, not dropped
    assert list(names[f"triton · {H200}"].x) == [1024, 16384]
    assert list(names[f"triton · {A100}"].x) == [1024, 4096]
    assert list(names["out of memory"].x) == [16384]
    assert list(names["failed (error/timeout/mismatch)"].x) == [4096]
    tflops = [c.tflops for c in docs[0].cases if c.impl == "sdpa"]
    assert list(names[f"sdpa · {H200}"].y) == pytest.approx(tflops)
    hover = names[f"sdpa · {H200}"].text[0]
    assert "p20–p80" in hover and "TFLOP/s" in hover and "peak memory" in hover


def test_memory_marks_oom_at_device_memory(docs: list[ResultsDoc]) -> None:
    fig = figures.memory_figure(merge(docs)).figure
    oom = next(t for t in fig.data if t.name == "out of memory")
    assert list(oom.y) == [80.0]  # the A100's 80 GiB
    assert fig.layout.yaxis.type == "log"
    peak = next(t for t in fig.data if t.name == f"sdpa · {H200}")
    assert list(peak.y) == pytest.approx([n * 1000 / GIB for n in (1024, 4096, 16384)])


def test_speedup_vs_baseline(docs: list[ResultsDoc]) -> None:
    merged = merge(docs)
    rows = speedup.speedups(merged, "sdpa")
    # A100 medians: sdpa 2.0 / 8.0, triton 1.6 / 4.0 (16k was an OOM, so not compared)
    assert sorted(r for _, r in rows[f"triton · {A100}"]) == pytest.approx([2.0 / 1.6, 2.0])
    assert sorted(r for _, r in rows[f"triton · {H200}"]) == pytest.approx([1.6, 2.0])
    fig = speedup.speedup_figure(merged, "sdpa").figure
    assert list(fig.data[0].x) == [f"triton · {H200}", f"triton · {A100}"]
    assert [row[0] for row in fig.data[0].text] == ["2.00×", "", "1.60×"]  # 4k: no "null"
    with pytest.raises(ReportError, match="present: sdpa, triton"):
        choose_baseline(merged, "naive")


def test_summary_paragraph(docs: list[ResultsDoc]) -> None:
    text = summary.paragraph(merge(docs), "sdpa")
    assert "12 cases of sdpa, triton on NVIDIA H200 and NVIDIA A100" in text
    assert "1 out of memory" in text and "1 failed" in text
    assert f"triton is 1.80× sdpa on {H200} on median over 2 bf16 forward cases" in text
    assert "1 triton case ran out of memory at N ≥ 16k" in text


def test_roofline_ceilings_say_where_they_come_from(docs: list[ResultsDoc]) -> None:
    merged = merge(docs)
    ceil = roofline.ceilings(merged)
    assert ceil[H200]["gbps"] == 4239.0 and ceil[H200]["gbps_source"] == "measured (gbps_copy)"
    best = max(c.tflops for c in docs[1].cases if c.tflops)
    assert ceil[A100]["tflops"] == best
    assert ceil[A100]["tflops_source"] == "best achieved in this data"
    fig = roofline.roofline_figure(merged)
    assert {t.name for t in fig.figure.data} >= {f"ceiling · {H200}", f"ceiling · {A100}"}
    assert "best achieved in this data" in fig.caption


def test_telemetry_panels_only_when_present(docs: list[ResultsDoc]) -> None:
    merged = merge(docs)
    tel = roofline.telemetry_figure(merged).figure
    assert {t.name for t in tel.data} == {f"sdpa · {H200}", f"triton · {H200}"}
    bw = roofline.bandwidth_figure(merged).figure
    assert f"sdpa · {H200}" in {t.name for t in bw.data}
    without = merge([docs[1]])  # the A100 run: telemetry unavailable everywhere
    assert roofline.telemetry_figure(without) is None
    assert roofline.bandwidth_figure(without) is None


def test_hostile_strings_are_escaped(page: str) -> None:
    assert EVIL not in page
    escaped = "&lt;script&gt;alert(1)&lt;/script&gt;"
    assert escaped in page.split('id="fa-bench-results"')[0]  # header and failures table
    assert len(re.findall(r"<script\b", page)) == 4  # results, figures, plotly.js, ours
    hover = json.dumps(_figure_specs(page)["tflops"])
    assert escaped in hover and EVIL not in hover


def test_sections_and_round_trip(page: str, docs: list[ResultsDoc], tmp_path: Path) -> None:
    for section in (
        "tflops",
        "memory",
        "speedup",
        "roofline",
        "bandwidth",
        "telemetry",
        "throttling",
        "failures",
        "cases",
        "environment",
    ):
        assert f'id="section-{section}"' in page, section
    assert extract_results(page) == docs
    (tmp_path / "report.html").write_text(page, encoding="utf-8")
    assert load_any(tmp_path / "report.html") == docs
    assert load_any(tmp_path) == docs  # a folder with only a page


def test_load_any_inputs(docs: list[ResultsDoc], tmp_path: Path) -> None:
    (tmp_path / "results.json").write_text(json.dumps(docs[0].to_json()), encoding="utf-8")
    assert load_any(tmp_path) == [docs[0]]
    both = [d.to_json() for d in docs]
    (tmp_path / "both.json").write_text(json.dumps(both), encoding="utf-8")
    assert load_any(tmp_path / "both.json") == docs
    (tmp_path / "bad.json").write_text('{"schema": "other"}', encoding="utf-8")
    for path, match in (
        (tmp_path / "bad.json", "bad.json: schema"),
        (tmp_path / "missing.json", "missing.json: no such file"),
        (tmp_path / "empty", "neither results.json nor report.html"),
    ):
        if path.name == "empty":
            path.mkdir()
        with pytest.raises(ResultsError, match=match):
            load_any(path)


def test_cli_report(docs: list[ResultsDoc], tmp_path: Path) -> None:
    for i, doc in enumerate(docs):
        (tmp_path / f"r{i}.json").write_text(json.dumps(doc.to_json()), encoding="utf-8")
    out = tmp_path / "merged.html"
    runner = CliRunner()
    args = ["report", str(tmp_path / "r0.json"), str(tmp_path / "r1.json"), "--plotlyjs", "cdn"]
    result = runner.invoke(app, [*args, "--out", str(out), "--title", "T <i>"])
    assert result.exit_code == 0, result.output
    assert load_any(out) == docs
    assert "<title>T &lt;i&gt;</title>" in out.read_text(encoding="utf-8")
    bad = runner.invoke(app, [*args, "--baseline", "flex", "--out", str(out)])
    assert bad.exit_code == 2
    assert "flex" in bad.output and "present: sdpa, triton" in bad.output
    missing = runner.invoke(app, ["report", str(tmp_path / "nope.json")])
    assert missing.exit_code == 2 and "nope.json" in missing.output


def test_run_report_failure_keeps_results(
    docs: list[ResultsDoc], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rich.console import Console

    from fa_bench.commands import report as cli_report
    from fa_bench.reports import build

    (tmp_path / "results.json").write_text(json.dumps(docs[0].to_json()), encoding="utf-8")
    quiet = Console(file=open(tmp_path / "out.txt", "w"))
    err = Console(file=open(tmp_path / "err.txt", "w"), width=200)
    assert cli_report.write_run_report(tmp_path / "results.json", console=quiet, err_console=err)
    assert load_any(tmp_path / "report.html") == [docs[0]]

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("figure bug")

    monkeypatch.setattr(build, "write_report", broken)
    (tmp_path / "report.html").unlink()
    result = cli_report.write_run_report(tmp_path / "results.json", console=quiet, err_console=err)
    err.file.close()
    assert result is None and not (tmp_path / "report.html").exists()
    assert "report not written (RuntimeError: figure bug)" in (tmp_path / "err.txt").read_text()


@pytest.mark.slow
def test_run_no_report(tiny_suite, tmp_path: Path) -> None:
    from conftest import FAST

    suite = tiny_suite(["naive"], seqlens=[16])
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["run", "-s", str(suite), "--out", str(out), "--no-report",
                                      "--device", "cpu", *FAST])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert (out / "results.json").is_file() and not (out / "report.html").exists()


def test_multi_gpu_run_keeps_each_gpu_and_flags_a_slow_one() -> None:
    from fa_bench.reports.per_gpu import peer_ratios, per_gpu_figure

    def on_gpu(case: dict, index: int, median: float) -> dict:
        scaled = {**case["latency_ms"], "median": median}
        return {**case, "gpu": {"index": index, "uuid": f"u{index}", "name": "NVIDIA H200"},
                "host": "node-a", "tflops": case["flops"] / (median * 1e9),
                "latency_ms": scaled}  # fmt: skip

    base = make_case("triton", 4096, median=4.0)
    cases = [on_gpu(base, 0, 4.0), on_gpu(base, 1, 4.04), on_gpu(base, 2, 4.6)]  # GPU 2 slow
    doc = document({"id": "m", "argv": []}, {"hostname": "node-a"}, cases)
    merged = merge([doc])
    assert merged.gpus == ["NVIDIA H200 #0 @ node-a", "NVIDIA H200 #1 @ node-a",
                           "NVIDIA H200 #2 @ node-a"]  # fmt: skip
    assert merged.replaced == 0  # one case on three GPUs is three points, not one
    flagged = [r["gpu"] for r in peer_ratios(merged) if r["outlier"]]
    assert flagged == ["NVIDIA H200 #2 @ node-a"]
    fig = per_gpu_figure(merged)
    assert fig is not None and len(fig.figure.data) == 3
    assert "#2 @ node-a: 1 case" in fig.caption


def test_cudnn_version_is_dotted() -> None:
    from fa_bench.env import cudnn_version

    assert cudnn_version(91900) == "9.19.0"  # cuDNN 9: major*10000 + minor*100 + patch
    assert cudnn_version(90100) == "9.1.0"
    assert cudnn_version(8907) == "8.9.7"  # before 9: major*1000 + minor*100 + patch
    assert cudnn_version(None) == "–" and cudnn_version("9.2.1") == "9.2.1"


def _header(page: str) -> str:
    return page[page.index("<header>") : page.index("</header>")]


def test_header_where_line_and_run_notes(docs: list[ResultsDoc]) -> None:
    header = _header(render(docs[:1], plotlyjs="cdn"))
    where = re.search(r"<dt>where</dt><dd>(.*?)</dd>", header).group(1)
    assert where.endswith("cudnn 9.19.0")  # dotted, and no separator left dangling
    assert "run-notes" not in header  # a clean, uninterrupted run has nothing to flag
    doc = clone(docs[0])
    doc.run.update(resumed=["2026-11-29T10:30:00+00:00"], git_sha="41a6d13a977c+dirty")
    notes = re.search(r'class="run-notes">(.*?)</dd>', _header(render([doc], plotlyjs="cdn")))
    assert "resumed 1 time (2026-11-29T10:30:00+00:00)" in notes.group(1)
    assert "uncommitted changes (41a6d13a977c+dirty)" in notes.group(1)


def test_telemetry_note_says_off_or_unavailable(docs: list[ResultsDoc]) -> None:
    from fa_bench.reports.tables import telemetry_note
    from fa_bench.telemetry.session import DISABLED

    assert telemetry_note(merge(docs[:1])) is None  # the H200 run has telemetry
    assert telemetry_note(merge(docs)) == (
        f"NVML telemetry on {A100}: unavailable: NVML not installed."
    )
    off = clone(docs[1])
    off.run["options"] = {"telemetry": False}
    for c in off.cases:
        c.telemetry = {"available": False, "reason": DISABLED}
    assert telemetry_note(merge([off])) == "NVML telemetry: off (--no-telemetry)."
    assert "NVML telemetry: off (--no-telemetry).</p>" in render([off], plotlyjs="cdn")


def test_speedup_heatmap_labels_every_case_in_seqlen_order() -> None:
    fig = speedup.speedup_figure(merge(fixed_token_docs()), "sdpa").figure
    heat = fig.data[0]
    labels = list(heat.y)
    assert len(labels) == 12 and list(heat.x) == ["triton", "naive"]
    # within a group N rises (while batch falls), as along the throughput plot's x axis
    assert [lab.split(" N=")[1].split()[0] for lab in labels[:6]] == [
        "512", "1024", "2048", "4096", "8192", "16384",
    ]  # fmt: skip
    assert "full" in labels[0] and "causal" in labels[6]
    # every case gets a drawn label and a row tall enough for it and its in-cell text
    assert fig.layout.yaxis.tickmode == "array" and list(fig.layout.yaxis.tickvals) == labels
    assert heat.texttemplate == "%{text}"
    assert fig.layout.height >= speedup.ROW_PX * len(labels)


def test_speedup_colour_range_follows_the_data() -> None:
    log2 = math.log2
    assert speedup.colour_range([log2(0.6), log2(0.95)]) == pytest.approx(-log2(0.6))
    assert speedup.colour_range([log2(1.01)]) == pytest.approx(log2(1.25))  # the floor
    assert speedup.colour_range([log2(0.03), log2(0.9)]) == 2.0  # capped at 4×
    vals, text = speedup.colorbar_ticks(2.0, log2(0.03), log2(0.9))
    assert (vals[0], vals[-1]) == (-2.0, 2.0) and 0.0 in vals
    assert text[0] == "≤0.25×" and text[-1] == "4×"  # only the clipped end says so
    fig = speedup.speedup_figure(merge(fixed_token_docs()), "sdpa").figure
    assert (fig.data[0].zmin, fig.data[0].zmax) == (-2.0, 2.0)  # naive at 1/30 is past the cap


def _full_number(text: str) -> float:
    return float(text[:-1]) * {"k": 1e3, "M": 1e6}[text[-1]] if text[-1] in "kM" else float(text)


def _assert_full_log_ticks(axis: object) -> None:
    """Every label of a log axis is the whole value of its tick, not a bare mantissa."""
    assert axis.type == "log" and axis.tickmode == "array" and len(axis.tickvals) >= 3
    for val, text in zip(axis.tickvals, axis.ticktext, strict=True):
        assert _full_number(text) == pytest.approx(val), (val, text)


def test_log_ticks_print_full_numbers() -> None:
    assert log_ticks([12, 664])["ticktext"] == [
        "10", "20", "30", "50", "100", "200", "300", "500", "1000",
    ]  # fmt: skip
    wide = log_ticks([1e-3, 1e5])["ticktext"]  # many decades: powers of ten only
    assert wide == ["0.001", "0.01", "0.1", "1", "10", "100", "1000", "10k", "100k"]
    assert log_ticks([]) == {"type": "log"}


def test_roofline_and_memory_axes_label_full_values(docs: list[ResultsDoc]) -> None:
    roof = roofline.roofline_figure(merge(docs)).figure
    _assert_full_log_ticks(roof.layout.xaxis)
    _assert_full_log_ticks(roof.layout.yaxis)
    assert roof.layout.margin.t is None  # build_all trims plotly's 100 px title margin
    built = {f.id: f.figure for f in build_all(merge(docs), "sdpa")}
    assert built["roofline"].layout.margin.t < 50
    memory = figures.memory_figure(merge(fixed_token_docs())).figure
    for axis in ("yaxis", "yaxis2"):
        _assert_full_log_ticks(memory.layout[axis])


def test_memory_caption_says_how_the_sweep_scales(docs: list[ResultsDoc]) -> None:
    fixed_tokens = figures.memory_figure(merge(fixed_token_docs())).caption
    assert "quadratic in N at a fixed batch, linear in N at a fixed token count" in fixed_tokens
    assert "Here the token count is fixed" in fixed_tokens
    assert "grows as N²" not in fixed_tokens
    fixed_batch = figures.memory_figure(merge(docs)).caption
    assert "Here the batch is fixed" in fixed_batch
    assert "score matrix for every" not in fixed_batch  # no naive implementation here


def test_overlapping_lines_stay_distinguishable() -> None:
    fig = figures.memory_figure(merge(fixed_token_docs())).figure
    panel = [t for t in fig.data if t.xaxis == "x" and t.mode == "lines+markers"]
    marks = [(t.marker.symbol, t.marker.size, t.line.width) for t in panel if t.y[0] is not None]
    assert len(marks) == 3 and len({m[0] for m in marks}) == 3  # sdpa, triton, naive
    assert len({m[1] for m in marks}) == 3  # nested sizes: equal values show every mark


def _grid_docs() -> list[ResultsDoc]:
    """16 panels (mode x dtype x head dim x masking), two implementations."""
    cases = []
    for mode in ("fwd", "bwd"):
        for dtype in ("bf16", "fp16"):
            for d in (64, 128):
                for causal in (False, True):
                    for impl, median in (("sdpa", 1.0), ("triton", 0.8)):
                        for n in (1024, 4096):
                            c = make_case(impl, n, median=median)
                            c.update(mode=mode, dtype=dtype, head_dim=d, causal=causal)
                            c["id"] = f"{impl}/{mode}/{dtype}/{n}/{d}/{causal}"
                            cases.append(c)
    return [document(_run("g"), _env("NVIDIA H200", "node-a", 141), cases)]


def test_throughput_grid_keeps_a_legend_in_reach() -> None:
    fig = figures.tflops_figure(merge(_grid_docs())).figure
    assert fig.layout.height < 1300  # 16 panels in four rows of four, not eight of two
    assert fig.layout.legend.orientation == "h" and fig.layout.legend.y == 1
    # the same entries again below the panels, toggling the same legend groups
    copies = [t for t in fig.data if t.legend == "legend2"]
    assert sorted(t.legendgroup for t in copies) == ["sdpa", "triton"]
    assert fig.layout.legend2.y == 0 and fig.layout.legend2.yanchor == "bottom"
    # one y rule for every panel: all from 0
    axes = [fig.layout[k] for k in fig.layout if k.startswith("yaxis")]
    assert len(axes) == 16 and all(a.rangemode == "tozero" for a in axes)
    small = figures.tflops_figure(merge(two_gpu_docs())).figure
    assert not [t for t in small.data if t.legend == "legend2"]  # short: one legend is enough
