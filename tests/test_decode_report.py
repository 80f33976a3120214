"""Decode's measurement and report (issue 20 item 4): the bandwidth fractions derived from
the run's env, results.csv's fraction columns, the terminal's bandwidth-first summary and
progress line, and the report's decode view beside prefill figures that leave decode out.

Synthetic records only: each is a CaseRecord of a decode Case with a chosen median, its
GB/s the byte model ÷ that median, as the run computes it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from report_fixture import make_case
from rich.console import Console

from fa_bench import console as fa_console
from fa_bench import models
from fa_bench.case import Case, Mode, Status
from fa_bench.progress import PlainProgress
from fa_bench.reports import build, decode, figures, speedup
from fa_bench.reports.merge import merge
from fa_bench.results.bandwidth import Ceilings, ceilings, fractions
from fa_bench.results.files import load_results, to_frame
from fa_bench.results.record import CaseRecord, Latency, ResultsDoc

# A results file of prefill cases, written before decode existed (an H200 run).
OLD_RESULTS = Path(__file__).parent.parent / "docs/data/refactor-ab-h200-2026-11-30-before.json"
COPY, PEAK = 4200.0, 4800.0  # GB/s: what the synthetic env's worker measured / NVML says


def gpu_env(copy: float | None = COPY, peak: float | str | None = PEAK) -> dict:
    """A worker's env as fa_bench/run/worker.py writes it: describe() + calibration."""
    cal = {"available": True, "gbps_copy": copy, "gbps_peak_theoretical": peak}
    tel = {"available": True, "gbps_peak_theoretical": peak, "calibration": cal}
    return {"hostname": "node", "gpu_name": "NVIDIA H200", "gpus": [{"name": "NVIDIA H200"}],
            "telemetry": tel}  # fmt: skip


def decode_case(impl: str, ctx: int, *, batch: int = 8, page: int = 0, spread: float = 1.0,
                sq: int = 1) -> Case:  # fmt: skip
    return Case(impl, Mode.DECODE, "bf16", batch, 32, 8, sq, ctx, 128, True,
                page_size=page, ctx_spread=spread)  # fmt: skip


def record(case: Case, median_ms: float | None, status: Status = Status.OK) -> CaseRecord:
    r = CaseRecord.for_case(case, "cuda", status, error=None if median_ms else "no kernel")
    if median_ms is not None:
        r.latency_ms = Latency(median_ms, median_ms, median_ms, median_ms, median_ms,
                               median_ms, 0.0, 3, [median_ms] * 3)  # fmt: skip
        r.tflops = models.tflops(r.flops or 0.0, median_ms)
        r.gbps_model = models.gbps(r.bytes_model or 0.0, median_ms)
    return r


def at_gbps(case: Case, gbps: float) -> CaseRecord:
    """An ok record whose model bandwidth is `gbps`."""
    return record(case, models.case_bytes(case) / (gbps * 1e9) * 1e3)


def decode_doc(env: dict | None = None) -> ResultsDoc:
    """ours and sdpa at 1k and 4k, contiguous and paged, and a prefill fwd case beside."""
    recs = []
    for page in (0, 64):
        for ctx in (1024, 4096):
            recs.append(at_gbps(decode_case("triton", ctx, page=page), 3000.0 + ctx / 8))
            recs.append(at_gbps(decode_case("sdpa", ctx, page=page), 1500.0))
    recs.append(record(decode_case("flex", 4096, page=64), None, Status.UNSUPPORTED))
    doc = {"schema": "fa-bench/1", "run": {"id": "r", "device": "cuda"},
           "env": env if env is not None else gpu_env(),
           "cases": [r.to_json() for r in recs] + [make_case("sdpa", 1024)]}  # fmt: skip
    return ResultsDoc.from_json(json.loads(json.dumps(doc)))


def test_fractions_come_from_the_workers_env() -> None:
    r = at_gbps(decode_case("triton", 4096), 3150.0)
    hbm, copy = fractions(r, gpu_env())
    assert copy == pytest.approx(3150.0 / COPY) and hbm == pytest.approx(3150.0 / PEAK)
    # A CPU run, telemetry off, NVML's reason instead of a peak, a failed copy: no ceiling.
    assert fractions(r, {"telemetry": {"available": False, "reason": "off"}}) == (None, None)
    assert ceilings(gpu_env(peak="not supported")) == Ceilings(None, COPY)
    failed_copy = gpu_env()
    failed_copy["telemetry"]["calibration"] = {"available": False, "reason": "copy failed"}
    assert ceilings(failed_copy) == Ceilings(PEAK, None)
    # Only an ok record has a fraction.
    assert fractions(record(decode_case("sdpa", 64), None, Status.ERROR), gpu_env()) == (None, None)


def test_a_merged_run_measures_each_record_against_its_own_gpu() -> None:
    r = at_gbps(decode_case("triton", 4096), 2000.0)
    r.extra["rank"] = 1
    env = {**gpu_env(copy=1000.0), "parts": {"0": gpu_env(copy=1000.0), "1": gpu_env(copy=4000.0)}}
    assert fractions(r, env)[1] == pytest.approx(0.5)


def test_results_csv_has_the_fractions_for_decode_only(tmp_path: Path) -> None:
    frame = to_frame(decode_doc())
    decode_rows = frame[frame["mode"] == "decode"]
    ok = decode_rows[decode_rows["status"] == "ok"]
    assert (ok["copy_fraction"] - ok["gbps_model"] / COPY).abs().max() < 1e-12
    assert (ok["hbm_fraction"] - ok["gbps_model"] / PEAK).abs().max() < 1e-12
    assert frame[frame["mode"] == "fwd"]["copy_fraction"].isna().all()
    # A results file of prefill cases only gets no new column.
    old = load_results(OLD_RESULTS)
    assert "copy_fraction" not in to_frame(old).columns


def test_terminal_summary_puts_bandwidth_first_for_decode() -> None:
    doc = decode_doc()
    con = Console(width=220, record=True)
    fa_console.print_summary(con, doc.cases, doc.env)
    text = con.export_text()
    head = next(line for line in text.splitlines() if "% copy" in line)
    assert (
        head.index("bandwidth") < head.index("% copy") < head.index("% HBM") < head.index("FLOP/s")
    )
    triton_4k = next(
        r for r in doc.cases if r.id == "triton/decode/bf16/b8-hq32-hkv8-sq1-sk4096-d128/page64"
    )
    assert f"{triton_4k.gbps_model / COPY:.1%}" in text  # 3512 / 4200 = 83.6%
    # The prefill case keeps its own table, FLOP/s first as before.
    assert "Results" in text and "page64" in text
    # Beyond the per-case limit: grouped, median and best GB/s with the best % of copy.
    many = [at_gbps(decode_case("triton", 1024 * (i + 1)), 1000.0 + i) for i in range(41)]
    con = Console(width=220, record=True)
    fa_console.print_summary(con, many, gpu_env())
    grouped = con.export_text()
    assert "best % copy" in grouped and f"{1040.0 / COPY:.1%}" in grouped


def test_progress_line_of_a_decode_case_shows_gbps_before_flops() -> None:
    con = Console(width=300, record=True)
    r = at_gbps(decode_case("triton", 4096), 3000.0)
    with PlainProgress(con, total=1) as progress:
        progress("done", r.case, r)
    line = con.export_text()
    assert "3.00 TB/s" in line and line.index("TB/s") < line.index("FLOP/s")


def test_decode_figure_one_line_per_impl_and_the_ceilings() -> None:
    merged = merge([decode_doc()])
    fig = decode.decode_figure(merged)
    assert fig is not None
    names = [t.name for t in fig.figure.data]
    panels = {t.xaxis for t in fig.figure.data}
    assert len(panels) == 2  # contiguous and page 64
    for impl in ("triton", "sdpa"):  # one line per implementation (one batch here) per panel
        lines = [t for t in fig.figure.data if t.name == f"{impl} · B=8"]
        assert len(lines) == 2 and all(list(t.x) == [1024, 4096] for t in lines)
    copy = [t for t in fig.figure.data if t.name == "copy bandwidth (measured)"]
    peak = [t for t in fig.figure.data if t.name == "HBM peak (theoretical)"]
    assert len(copy) == 2 and all(set(t.y) == {COPY} for t in copy)
    assert len(peak) == 2 and all(set(t.y) == {PEAK} for t in peak)
    assert "flex · B=8" not in names  # unsupported: no line, no marker
    ours = next(t for t in fig.figure.data if t.name == "triton · B=8")
    assert f"{(3000.0 + 1024 / 8) / COPY:.1%} of the copy bandwidth" in ours.text[0]


def test_decode_figure_without_ceilings_says_so() -> None:
    fig = decode.decode_figure(merge([decode_doc(env={"hostname": "cpu"})]))
    assert fig is not None and "recorded no bandwidth ceilings" in fig.caption
    assert not [t for t in fig.figure.data if "copy bandwidth" in str(t.name)]


def test_prefill_figures_leave_decode_out_and_speedup_keeps_layouts_apart() -> None:
    merged = merge([decode_doc()])
    tf = figures.tflops_figure(decode.without_decode(merged))
    assert tf is not None
    assert all(a.text.startswith("fwd") for a in tf.figure.layout.annotations)
    assert all(max(t.x) <= 1024 for t in tf.figure.data if t.x)
    ids = [f.id for f in build.build_all(merged, "sdpa")]
    assert ids.index("tflops") < ids.index("decode")
    # Two cache layouts of one shape are two rows of the speedup heatmap, never one.
    rows = speedup.speedups(merged, "sdpa")["triton"]
    assert len(rows) == 4
    assert {speedup.shape_label(s) for s, _ in rows} >= {
        "decode bf16 d128 Sq=1,ctx=4096 B=8 H=32/8 contig",
        "decode bf16 d128 Sq=1,ctx=4096 B=8 H=32/8 page64",
    }


def test_a_report_of_an_older_results_file_is_unchanged_by_decode() -> None:
    old = load_results(OLD_RESULTS)
    merged = merge([old])
    assert decode.without_decode(merged) is merged
    assert decode.decode_figure(merged) is None
    assert "decode" not in [f.id for f in build.build_all(merged, "sdpa")]


def test_the_page_has_the_decode_view_and_its_table_columns() -> None:
    from fa_bench.reports import tables

    doc = decode_doc()
    page = build.render([doc], plotlyjs="cdn", generated="2026-11-30T00:00:00+00:00")
    assert 'id="section-decode"' in page and "Decode: bandwidth vs context length" in page
    merged = merge([doc])
    columns = tables.case_columns(merged)
    assert columns == tables.DECODE_CASE_COLUMNS
    for name in ("cache", "spread", "% copy BW", "% HBM peak"):
        assert f'<th scope="col">{name}</th>' in page
    rows = tables.case_rows(merged)
    assert all(len(r["cells"]) == len(columns) for r in rows)
    status = columns.index("status")
    assert all(r["cells"][status]["text"] == r["status"] for r in rows)
    ours = next(r for r, c in zip(rows, merged.cases, strict=True) if c.record.id ==
                "triton/decode/bf16/b8-hq32-hkv8-sq1-sk4096-d128/page64")  # fmt: skip
    cell = dict(zip(columns, (x["text"] for x in ours["cells"]), strict=True))
    assert cell["cache"] == "page64" and cell["% copy BW"] == f"{3512.0 / COPY:.1%}"
    assert 'class="status-ok">ok</td>' in str(tables.case_rows_html(rows, status))
    # A page without decode cases keeps the columns it always had.
    old = merge([load_results(OLD_RESULTS)])
    assert tables.case_columns(old) == tables.CASE_COLUMNS
    assert all(len(r["cells"]) == len(tables.CASE_COLUMNS) for r in tables.case_rows(old))


def test_the_summary_paragraph_gives_decode_in_fractions_of_the_copy() -> None:
    from fa_bench.reports import summary

    merged = merge([decode_doc()])
    text = summary.paragraph(merged, "sdpa")
    # triton: 3128 and 3512 GB/s twice each over 4200 -> median 79%, best 84%; sdpa 36%.
    assert "Decode, median fraction of the measured copy bandwidth: triton 79% (best 84%, " \
        "4 cases); sdpa 36% (best 36%, 4 cases)." in text  # fmt: skip
    assert "copy bandwidth" not in summary.paragraph(merge([decode_doc(env={})]), "sdpa")


def test_a_narrow_terminal_gets_blocks_with_the_fractions_when_known() -> None:
    recs = [at_gbps(decode_case("triton", 4096, page=64, spread=0.25), 2100.0)]
    con = Console(width=80, record=True)
    fa_console.print_summary(con, recs, gpu_env())
    text = con.export_text()
    assert recs[0].id in text and "2.10 TB/s  50.0% of copy  43.8% of HBM" in text
    con = Console(width=80, record=True)
    fa_console.print_summary(con, recs, None)  # a CPU run: no ceilings, no empty fractions
    assert "of copy" not in con.export_text().split("\n", 1)[1]


@pytest.mark.slow
def test_a_decode_run_hands_its_env_to_the_summary(tmp_path: Path, monkeypatch) -> None:
    """`fa-bench run` gives the summary the worker's env, where the ceilings are (a CPU run
    has none: the env is checked, not the fractions)."""
    from conftest import FAST
    from typer.testing import CliRunner

    from fa_bench.cli import app
    from fa_bench.commands import run as run_command

    seen: list[object] = []
    real = run_command.print_summary

    def spy(con: Console, recs: list[CaseRecord], env: dict | None = None) -> None:
        seen.append(env)
        real(con, recs, env)

    monkeypatch.setattr(run_command, "print_summary", spy)
    out = tmp_path / "out"
    args = ["run", "-s", "decode", "--device", "cpu", "--dtype", "fp32", "--impl", "sdpa",
            "--heads", "2", "--kv-heads", "1", "--head-dim", "16", "--batch", "2",
            "--seqlen-k", "32", "--seqlen-q", "1", "--page-size", "none",
            "--ctx-spread", "1", "--no-report", "--out", str(out), *FAST]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "Decode results" in result.output
    (env,) = seen
    assert isinstance(env, dict) and env["telemetry"] == load_results(out).env["telemetry"]


def test_run_json_summary_gives_decode_cases_their_fractions(tmp_path: Path) -> None:
    from fa_bench.commands.run_summary import summary_doc

    doc = decode_doc()
    out = summary_doc(doc.cases, out=tmp_path, total=len(doc.cases), written={}, exit_code=0,
                      interrupted=False, env=doc.env)  # fmt: skip
    cases = {c["id"]: c for c in out["cases"]}
    ours = cases["triton/decode/bf16/b8-hq32-hkv8-sq1-sk4096-d128/page64"]
    assert ours["copy_fraction"] == pytest.approx(3512.0 / COPY)
    assert ours["hbm_fraction"] == pytest.approx(3512.0 / PEAK)
    assert "copy_fraction" not in cases["sdpa/fwd/bf16/b2-hq16-hkv16-sq1024-sk1024-d128/full"]


def test_decode_hover_gives_nvml_bytes_against_the_model() -> None:
    doc = decode_doc()
    doc.cases[0].telemetry = {"available": True, "bytes_ratio_measured_to_model": 1.04}
    merged = merge([doc])
    assert "NVML bytes per call ÷ byte model: 1.04" in decode.decode_hover(merged.cases[0], merged)
    assert "NVML bytes" not in decode.decode_hover(merged.cases[1], merged)
