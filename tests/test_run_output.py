"""`fa-bench run`'s terminal output (issue 15, items 6 and 7): plain progress and tables
that a CI log (80 columns, not a terminal) keeps whole, units that scale, `run --json`,
the reasons cases did not run, the pre-run warning and the time-limit marker."""

from __future__ import annotations

import io
import json
import os
import sys
from pathlib import Path

import pytest
import torch
from conftest import FAST
from rich.console import Console
from rich.table import Table
from typer.testing import CliRunner

from fa_bench import registry, units
from fa_bench.case import Case, DType, Mode, Status
from fa_bench.cli import app
from fa_bench.commands.run_summary import summary_doc, write_summary
from fa_bench.console import failures, print_summary, reasons, summary, time_limit_note
from fa_bench.progress import PlainProgress, RunProgress, every_n, make_progress
from fa_bench.results.files import load_results
from fa_bench.results.record import CaseRecord, Latency
from fa_bench.run.preflight import cannot_run

CPU_ONLY = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU machine's view")
LONG_IMPL = "my-very-own-attention-kernel"  # a plugin's name: longer than any built-in


def _case(impl: str = "naive", seqlen: int = 128, dtype: DType = DType.FP32) -> Case:
    return Case(impl=impl, mode=Mode.FWD, dtype=dtype, batch=1, heads_q=2, heads_kv=2,
                seqlen_q=seqlen, seqlen_k=seqlen, head_dim=64, causal=True)  # fmt: skip


def _ok(case: Case, median: float = 0.0812, noise: float = 0.004,
        stop: str = "noise-target") -> CaseRecord:  # fmt: skip
    lat = Latency.from_json(
        {
            "median": median,
            "mean": median,
            "min": median * 0.98,
            "max": median * 1.1,
            "p20": median * 0.99,
            "p80": median * 1.02,
            "stdev": 0.001,
            "n": 30,
            "samples": [median] * 30,
            "noise": noise,
        },
        case.id,
    )
    return CaseRecord.for_case(case, "cpu", Status.OK, latency_ms=lat, tflops=2.5e-5,
                               gbps_model=0.412, peak_mem_bytes=12 * 2**20,
                               accuracy={"max_abs_err": 1.2e-6},
                               timing={"stop_reason": stop, "target_noise": 0.01})  # fmt: skip


def _records() -> list[CaseRecord]:
    return [
        _ok(_case("naive")),
        _ok(_case(LONG_IMPL, seqlen=16384)),
        CaseRecord.for_case(_case("sdpa-cudnn"), "cpu", Status.UNSUPPORTED,
                            error="sdpa-cudnn runs on cuda, not cpu"),
        CaseRecord.for_case(_case("sdpa-cudnn", 256), "cpu", Status.UNSUPPORTED,
                            error="sdpa-cudnn runs on cuda, not cpu"),
        CaseRecord.for_case(_case(LONG_IMPL, 256), "cpu", Status.ERROR,
                            error="RuntimeError: boom\ntraceback lines"),
    ]  # fmt: skip


def _log(width: int = 80, terminal: bool = False) -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, width=width, force_terminal=terminal, color_system=None), buf


# --- units that scale -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fn", "value", "shown"),
    [
        (units.latency, 0.0812, "81.2 µs"), (units.latency, 0.0000812, "81.2 ns"),
        (units.latency, 1.2, "1.20 ms"), (units.latency, 999.96, "1.00 s"),
        (units.latency, 2500.0, "2.50 s"), (units.latency, None, "–"),
        (units.flops, 2.5e-5, "25.0 MFLOP/s"), (units.flops, 0.0012, "1.20 GFLOP/s"),
        (units.flops, 664.0, "664 TFLOP/s"), (units.flops, 0.99999, "1.00 TFLOP/s"),
        (units.bandwidth, 0.412, "412 MB/s"), (units.bandwidth, 3350.0, "3.35 TB/s"),
        (units.bandwidth, 0.0, "0 B/s"), (units.mebibytes, 12 * 2**20, "12.0 MiB"),
        (units.percent, 0.0123, "1.2%"), (units.duration, 3723, "1:02:03"),
    ],
)  # fmt: skip
def test_units_scale_to_readable_figures(fn, value, shown: str) -> None:
    assert fn(value) == shown


def test_cpu_figures_in_the_summary_are_readable_not_exponents_or_zero() -> None:
    con, buf = _log(width=200)
    print_summary(con, _records())
    text = buf.getvalue()
    assert "81.2 µs" in text and "25.0 MFLOP/s" in text and "412 MB/s" in text
    assert "e-05" not in text and "2.5e" not in text


# --- nothing cut at 80 columns ------------------------------------------------------------


def test_summary_at_80_columns_keeps_every_id_and_figure_whole() -> None:
    con, buf = _log(width=80)
    records = _records()
    print_summary(con, records)
    text = buf.getvalue()
    assert "…" not in text
    for r in records:
        assert r.id in text, r.id
    assert "81.2 µs" in text and "25.0 MFLOP/s" in text and "unsupported" in text


def test_grouped_summary_at_80_columns_keeps_names_and_figures() -> None:
    records = [_ok(_case(LONG_IMPL, seqlen=16 * (i + 1))) for i in range(45)]
    con, buf = _log(width=80)
    print_summary(con, records)
    text = buf.getvalue()
    assert "…" not in text and LONG_IMPL in text and "25.0 MFLOP/s" in text


def test_fold_is_not_enough_for_ids_the_failures_keep_them_whole() -> None:
    # overflow="fold" breaks an id over lines: a log search for it finds nothing
    rec = _records()[-1]
    folded = Table()
    folded.add_column("status")
    folded.add_column("case", overflow="fold")
    folded.add_column("message", overflow="fold")
    folded.add_row("error", rec.id, "RuntimeError: boom " * 4)
    con, buf = _log(width=80)
    con.print(folded)
    assert rec.id not in buf.getvalue()
    con, buf = _log(width=80)
    for item in failures([rec], 80):
        con.print(item, soft_wrap=True)
    assert rec.id in buf.getvalue() and "RuntimeError: boom" in buf.getvalue()


def test_a_terminal_drops_columns_before_cutting_a_number() -> None:
    records = [_ok(_case("naive")), _ok(_case("sdpa-math"))]
    con, buf = _log(width=100, terminal=True)
    items = summary(records, 100)
    assert len(items) == 1 and isinstance(items[0], Table)  # a table still, fewer columns
    con.print(items[0])
    text = buf.getvalue()
    assert "…" not in text and "81.2 µs" in text and "sdpa-math" in text
    wide = summary(records, 200)[0]
    assert isinstance(wide, Table) and len(wide.columns) > len(items[0].columns)


# --- progress ---------------------------------------------------------------------------


def test_progress_in_a_log_is_one_uncut_line_per_case() -> None:
    con, buf = _log(width=80)
    records = _records()
    progress = make_progress(con, total=len(records))
    assert isinstance(progress, PlainProgress)
    with progress:
        for r in records:
            progress("start", r.case, None)
            progress("done", r.case, r)
    lines = buf.getvalue().splitlines()
    assert "…" not in buf.getvalue()
    for i, r in enumerate(records, 1):
        line = next(x for x in lines if r.id in x)
        assert line.startswith(f"[{i}/{len(records)}] {r.status.value}"), line
    assert any("81.2 µs  25.0 MFLOP/s  (0:00 elapsed, eta 0:00)" in x for x in lines)
    assert any(x.startswith("error ") and "RuntimeError: boom" in x for x in lines)


def test_a_terminal_keeps_the_live_bar_and_cuts_the_label_before_a_figure() -> None:
    con, buf = _log(width=80, terminal=True)
    progress = make_progress(con, total=420)
    assert isinstance(progress, RunProgress)
    progress.start(_case(LONG_IMPL, 16384))
    progress.progress.update(progress.task, advance=123, counts="ok 100 unsupported 20 error 3")
    con.print(progress.progress.make_tasks_table(progress.progress.tasks))
    line = buf.getvalue()
    assert "123/420" in line and "ok 100 unsupported 20 error 3" in line and "eta" in line


def test_a_big_run_logs_every_nth_case_and_every_failure() -> None:
    assert every_n(42) == 1 and every_n(470) == 10
    con, buf = _log(width=80)
    records = [_ok(_case(seqlen=16 * (i + 1))) for i in range(470)]
    records[5] = CaseRecord.for_case(records[5].case, "cpu", Status.ERROR, error="boom")
    with PlainProgress(con, total=len(records)) as progress:
        for r in records:
            progress("done", r.case, r)
    lines = [x for x in buf.getvalue().splitlines() if x.startswith("[")]
    assert 45 <= len(lines) <= 50
    assert lines[-1].startswith("[470/470]") and any(x.startswith("[  6/470] error") for x in lines)
    assert lines[0].startswith("[  1/470] ok")


# --- why cases did not run, the time limit ----------------------------------------------


def test_reasons_are_grouped_by_implementation_and_reason() -> None:
    lines = [t.plain for t in reasons(_records())]
    assert lines == ["sdpa-cudnn: 2 unsupported: sdpa-cudnn runs on cuda, not cpu"]
    con, buf = _log(width=80)
    print_summary(con, _records())
    assert "sdpa-cudnn: 2 unsupported: sdpa-cudnn runs on cuda, not cpu" in buf.getvalue()


def test_a_case_stopped_at_the_time_limit_is_marked_with_a_footnote() -> None:
    records = [_ok(_case("naive")), _ok(_case("sdpa-math"), noise=0.05, stop="time-limit"),
               _ok(_case("sdpa"), noise=0.005, stop="time-limit")]  # fmt: skip
    note = time_limit_note(records)
    assert note is not None and note.plain.startswith("* 1 case stopped at the time limit")
    assert "--max-time" in note.plain and "1.0%" in note.plain
    con, buf = _log(width=200)
    print_summary(con, records)
    assert buf.getvalue().count("81.2 µs *") == 1
    assert time_limit_note(records[:1]) is None
    many = [_ok(_case("naive", 16 * (i + 1))) for i in range(45)]
    many[3] = _ok(many[3].case, noise=0.05, stop="time-limit")
    con, buf = _log(width=80)
    print_summary(con, many)  # the grouped table: the group's median carries the marker
    assert "25.0 MFLOP/s *" in buf.getvalue() and "* 1 case stopped" in buf.getvalue()


@CPU_ONLY
def test_preflight_names_implementations_that_cannot_run_here() -> None:
    cases = [_case("naive"), _case("sdpa-cudnn"), _case("sdpa-cudnn", 256),
             _case("triton", dtype=DType.BF16), _case("triton")]  # fmt: skip
    registry.load()
    found = {f.impl: f for f in cannot_run(cases, "cpu")}
    assert set(found) == {"sdpa-cudnn"}  # triton runs its fp32 case (the worker interprets)
    assert found["sdpa-cudnn"].kind == "unavailable" and found["sdpa-cudnn"].cases == 2
    assert "CUDA not available" in found["sdpa-cudnn"].line
    bf16 = cannot_run([_case("triton", dtype=DType.BF16)], "cpu")
    assert [(f.impl, f.kind) for f in bf16] == [("triton", "unsupported")]
    assert "bf16" in bf16[0].reason
    assert os.environ.get("TRITON_INTERPRET") in (None, "1")  # conftest's, left as it was


@CPU_ONLY
def test_a_plan_in_which_nothing_can_run_exits_2_before_starting(tmp_path: Path,
                                                                 tiny_suite) -> None:  # fmt: skip
    suite = tiny_suite(["sdpa-cudnn"])
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["run", "-s", str(suite), "--device", "cpu", "--out",
                                      str(out), "--json"])  # fmt: skip
    assert result.exit_code == 2, result.output
    assert "no case of this plan can run on cpu" in result.stderr
    assert "sdpa-cudnn: CUDA not available" in result.stderr
    assert result.stdout == "" and not (out / "plan.json").exists()


@CPU_ONLY
@pytest.mark.slow
def test_run_json_and_its_log_at_80_columns(tmp_path: Path, tiny_suite) -> None:
    suite = tiny_suite(["naive", "sdpa-cudnn"])
    out = tmp_path / "run"
    chatty = tmp_path / "chatty.py"  # a plugin that prints as it loads: not into the JSON
    chatty.write_text(
        "import torch\nfrom fa_bench.registry import register\nprint('chatty plugin loaded')\n"
        "register('chatty', description='prints')(lambda case, q, k, v: "
        "lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v))\n"
    )
    env = {"COLUMNS": "80"}
    result = CliRunner().invoke(app, ["run", "-s", str(suite), "--device", "cpu", "--out",
                                      str(out), "--json", "--plugin", str(chatty), *FAST],
                                env=env)  # fmt: skip
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)  # stdout holds the JSON alone
    results = load_results(out)
    assert [c["id"] for c in doc["cases"]] == [r.id for r in results.cases]
    assert [c["median_ms"] for c in doc["cases"]] == [r.median_ms for r in results.cases]
    assert doc["counts"] == {"ok": 2, "unsupported": 2} and doc["exit_code"] == 0
    assert doc["files"]["results_json"] == str(out / "results.json")
    assert doc["not_run"] == [{"impl": "sdpa-cudnn", "status": "unsupported", "cases": 2,
                               "reason": "sdpa-cudnn runs on cuda, not cpu"}]  # fmt: skip
    err = result.stderr
    assert "chatty plugin loaded" in err
    assert "warning: sdpa-cudnn is unavailable here: CUDA not available" in err
    assert err.index("warning: sdpa-cudnn") < err.index("[1/4]")  # before the first case
    assert "sdpa-cudnn: 2 unsupported: sdpa-cudnn runs on cuda, not cpu" in err
    assert "…" not in err
    for r in results.cases:
        assert r.id in err


def test_run_json_keeps_stdout_for_the_json_alone(monkeypatch, capsys) -> None:
    from fa_bench.commands import run as run_mod

    def chatty_run(req, *, console, err_console) -> int:  # prints as a plugin might
        print("plugin chatter")
        console.print("human output")
        run_mod.write_summary(run_mod._JSON_OUT.get() or sys.stdout, {"counts": {"ok": 1}})
        return 0

    monkeypatch.setattr(run_mod, "_run", chatty_run)
    err = Console(file=sys.stderr, width=80)
    code = run_mod.run_command(run_mod.RunRequest(json=True), console=Console(), err_console=err)
    got = capsys.readouterr()
    assert code == 0 and json.loads(got.out) == {"counts": {"ok": 1}}
    assert "plugin chatter" in got.err and "human output" in got.err


def test_the_json_summary_of_an_interrupted_run_gives_the_resume_command() -> None:
    records = _records()
    doc = summary_doc(records, out=Path("runs/x"), total=9,
                      written={"results_json": Path("runs/x/results.json"), "report_html": None},
                      exit_code=130, interrupted=True)  # fmt: skip
    assert doc["resume_command"] == "fa-bench run --resume runs/x"
    assert doc["planned"] == 9 and doc["recorded"] == 5
    assert doc["counts"] == {"error": 1, "ok": 2, "unsupported": 2}
    assert doc["files"] == {"results_json": "runs/x/results.json", "report_html": None}
    doc["cases"][0]["noise"] = float("nan")  # a figure JSON cannot hold
    buf = io.StringIO()
    write_summary(buf, doc)
    back = json.loads(buf.getvalue(), parse_constant=lambda c: pytest.fail(f"{c} in JSON"))
    assert back["cases"][0]["noise"] is None
    assert back["cases"][0]["median_ms"] == 0.0812 and back["cases"][0]["tflops"] == 2.5e-5
