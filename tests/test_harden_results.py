"""Issue 16, items 8 and 9: results files checked by schema (the error names the file,
the case and the field; exit 2 in `report` and `compare`, never a traceback), `compare`
refusing a comparison with nothing comparable, and the report's grouping steps (one pass
over the cases, not one per facet, GPU or implementation)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from report_fixture import make_case, two_gpu_docs
from typer.testing import CliRunner

from fa_bench.cli import app
from fa_bench.compare.core import compare_docs
from fa_bench.compare.match import CompareError
from fa_bench.results.inputs import load_any
from fa_bench.results.record import SCHEMA, ResultsDoc, ResultsError

runner = CliRunner()


def _doc(cases: list[dict], **run: object) -> dict:
    env = {"hostname": "n1", "gpu_name": "NVIDIA H100", "gpus": [{"name": "NVIDIA H100"}]}
    return {"schema": SCHEMA, "run": {"id": "r", **run}, "env": env, "cases": cases}


def _write(tmp_path: Path, name: str, doc: object) -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


def _good() -> list[dict]:
    return [make_case("flex", 2048, median=3.0), make_case("sdpa", 2048, median=2.0)]


# A field set to a value of the wrong type, and the words the error must hold.
BAD_FIELDS = [
    (("latency_ms", "p80"), "fast", "latency_ms: p80 must be a finite number"),
    (("latency_ms", "mean"), None, "latency_ms: mean must be a finite number"),
    (("latency_ms", "samples"), [1.0, "2.0"], "samples[1] must be a finite number"),
    (("latency_ms", "samples"), "1,2,3", "samples must be a list of numbers"),
    (("latency_ms", "n"), 2.5, "latency_ms: n must be an integer"),
    (("impl",), 7, "impl must be a string"),
    (("device",), ["cuda"], "device must be a string"),
    (("error",), {"msg": "x"}, "error must be a string or null"),
    (("status",), ["ok"], "status must be a string"),
    (("tflops",), "12.5", "tflops must be a finite number or null"),
    (("gbps_model",), True, "gbps_model must be a finite number or null"),
    (("peak_mem_bytes",), 10**40, "peak_mem_bytes must be a finite number ≥ 0 or null"),
    (("flops",), float("inf"), "flops must be a finite number ≥ 0 or null"),
    (("seqlen_q",), 2**70, "seqlen_q must be an integer"),
    (("causal",), "yes", "causal must be true or false"),
    (("accuracy",), [1e-3], "accuracy must be an object or null"),
    (("timing",), "fast", "timing must be an object or null"),
    (("latency_ms", "median"), "-0.5", "latency_ms: median must be a finite number"),
    (("wall_s",), -3, "wall_s must be a finite number ≥ 0 or null"),
    (("telemetry", "power_w_mean"), "310 W", "telemetry: power_w_mean must be a finite number"),
    (("telemetry", "gbps_nvml"), [3000.0], "telemetry: gbps_nvml must be a finite number"),
    (("telemetry", "warnings"), [["hw_slowdown"]], "telemetry: warnings must be a list of strings"),
    (("timing", "sm_clock_mhz"), [1755.0], "timing: sm_clock_mhz must be an object or null"),
    (("timing", "sm_clock_mhz", "mean"), "1.7 GHz", "timing.sm_clock_mhz: mean must be a finite"),
]


@pytest.mark.parametrize(("path", "value", "words"), BAD_FIELDS, ids=lambda v: str(v)[:24])
def test_a_field_of_the_wrong_type_names_file_case_and_field(
    tmp_path: Path, path: tuple, value: object, words: str
) -> None:
    cases = _good()
    cases[1].update(telemetry={"available": True, "power_w_mean": 400.0},
                    timing={"sm_clock_mhz": {"mean": 1800.0}})  # fmt: skip
    target = cases[1]
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    file = _write(tmp_path, "typed.json", _doc(cases))
    with pytest.raises(ResultsError) as err:
        load_any(file)
    message = str(err.value)
    assert str(file) in message and "cases[1]" in message and cases[1]["id"] in message
    assert words in message


@pytest.mark.parametrize(
    ("key", "value", "words"),
    [
        ("suites", "standard", "run: suites must be a list of objects or null"),
        ("suites", [{"name": "a"}, "b"], r"run: suites\[1\] must be an object"),
        ("argv", "fa-bench run", "run: argv must be a list or null"),
        ("options", [1], "run: options must be an object or null"),
        ("suites", [{"description": "unnamed"}], r"run.suites\[0\]: name must be a string"),
    ],
)
def test_run_fields_of_the_wrong_type(tmp_path: Path, key: str, value: object, words: str) -> None:
    file = _write(tmp_path, "run.json", _doc(_good(), **{key: value}))
    with pytest.raises(ResultsError, match=words):
        load_any(file)


@pytest.mark.parametrize(
    ("key", "value", "words"),
    [
        ("gpus", {"name": "H100"}, "env: gpus must be a list of objects"),
        ("gpus", ["H100"], r"env: gpus\[0\] must be an object"),
        ("gpu_name", 100, "env: gpu_name must be a string"),
        ("telemetry", "on", "env: telemetry must be an object or null"),
    ],
)
def test_env_fields_of_the_wrong_type(tmp_path: Path, key: str, value: object, words: str) -> None:
    doc = _doc(_good())
    doc["env"][key] = value
    with pytest.raises(ResultsError, match=words):
        load_any(_write(tmp_path, "env.json", doc))


def _unreadable(tmp_path: Path) -> dict[str, Path]:
    """Files no JSON reader should choke on with a traceback."""
    files = {
        "binary": b"\x89PNG\r\n\x1a\n\x00\x00\xff\xfe" * 40,
        "latin1": '{"schema": "fa-bench/1", "run": "café"}'.encode("latin-1"),
        "deep": b"[" * 200_000 + b"]" * 200_000,
        "deep-object": b'{"a":' * 120_000 + b"1" + b"}" * 120_000,
        "long-int": b'{"schema": "fa-bench/1", "n": ' + b"7" * 6000 + b"}",
        "nan": json.dumps(_doc([{**make_case("sdpa", 512), "tflops": float("nan")}])).encode(),
    }
    out = {}
    for name, data in files.items():
        out[name] = tmp_path / f"{name}.json"
        out[name].write_bytes(data)
    return out


def test_unreadable_files_are_results_errors(tmp_path: Path) -> None:
    for name, path in _unreadable(tmp_path).items():
        with pytest.raises(ResultsError) as err:
            load_any(path)
        assert str(path) in str(err.value), name


def test_a_deeply_nested_report_page_is_a_results_error(tmp_path: Path) -> None:
    page = tmp_path / "page.html"
    body = "[" * 150_000 + "]" * 150_000
    page.write_text(f'<script type="application/json" id="fa-bench-results">{body}</script>')
    with pytest.raises(ResultsError, match="nested too deeply"):
        load_any(page)


def test_report_and_compare_exit_2_on_bad_files(tmp_path: Path) -> None:
    good = _write(tmp_path, "good.json", _doc(_good()))
    bad = _good()
    bad[0]["latency_ms"]["median"] = "1.5 ms"
    bad_files = [*_unreadable(tmp_path).values(), _write(tmp_path, "typed.json", _doc(bad))]
    for path in bad_files:
        out = tmp_path / "page.html"
        got = runner.invoke(app, ["report", str(path), "-o", str(out)])
        assert got.exit_code == 2, (path, got.output, got.exception)
        assert "Traceback" not in got.output
        got = runner.invoke(app, ["compare", str(good), str(path)])
        assert got.exit_code == 2, (path, got.output, got.exception)
        assert "Traceback" not in got.output


def test_every_results_file_in_the_tree_still_reads() -> None:
    root = Path(__file__).resolve().parent.parent
    found = [p for p in (root / "docs" / "data").glob("*.json") if '"fa-bench/1"' in p.read_text()]
    assert found
    for path in found:
        assert load_any(path)[0].cases
    for doc in two_gpu_docs():  # the report fixture, through its JSON
        ResultsDoc.from_json(json.loads(json.dumps(doc.to_json())))


# --- compare: nothing comparable ---------------------------------------------------------


def _unmeasured(case: dict) -> dict:
    """An ok case whose latency samples are all unusable (zero)."""
    case = json.loads(json.dumps(case))
    case["latency_ms"]["samples"] = [0.0] * 4
    return case


def _docs(cases: list[dict]) -> list[ResultsDoc]:
    return [ResultsDoc.from_json(_doc(cases))]


def test_compare_with_nothing_comparable_is_refused() -> None:
    cases = [_unmeasured(make_case(impl, n)) for impl in ("flex", "naive") for n in (256, 768)]
    with pytest.raises(
        CompareError, match=r"nothing comparable: none of the 4 cases.*4 unmeasured"
    ):
        compare_docs(_docs(cases), _docs(cases))


def test_compare_of_cases_failed_alike_is_refused_but_a_status_change_is_not() -> None:
    failed = [make_case("flex", 640, "error", error="boom"), make_case("naive", 640, "timeout")]
    with pytest.raises(CompareError, match="1 error in both, 1 timeout in both"):
        compare_docs(_docs(failed), _docs(failed))
    # A case that broke compares its status: the gate fails (exit 1), it is not refused.
    cmp = compare_docs(_docs([make_case("flex", 640)]), _docs([failed[0]]))
    assert cmp.exit_code == 1


def test_compare_with_some_comparable_cases_is_unchanged() -> None:
    base = [make_case("flex", 384, median=2.0), _unmeasured(make_case("naive", 384))]
    cmp = compare_docs(_docs(base), _docs(base))
    assert cmp.exit_code == 0
    assert sorted(r.verdict.value for r in cmp.rows) == ["same", "unmeasured"]


def test_compare_cli_exits_2_with_nothing_comparable(tmp_path: Path) -> None:
    cases = [_unmeasured(make_case("flex", n)) for n in (320, 960)]
    a = _write(tmp_path, "a.json", _doc(cases))
    got = runner.invoke(app, ["compare", str(a), str(a)])
    assert got.exit_code == 2, got.output
    assert "nothing comparable" in got.output and "PASS" not in got.output


# --- report: one pass over the cases per step -------------------------------------------


class _CountingList(list):
    """A list that counts the passes made over it."""

    passes = 0

    def __iter__(self):
        type(self).passes += 1
        return super().__iter__()


def _wide_merge():
    """Many facets (head dims × masks), GPUs and implementations, few cases of each:
    a step that scans every case once per facet, GPU or implementation shows up as
    dozens of passes."""
    from fa_bench.reports.merge import merge

    impls = [f"impl{i}" for i in range(9)]
    docs = []
    for g in range(12):
        cases = []
        for i in range(24):
            case = make_case(impls[(i + g) % 9], 256 * (1 + i % 3), median=1.0 + i / 10)
            case["head_dim"] = 16 * (1 + i % 6)
            case["causal"] = bool(i % 2)
            case["id"] = f"{case['id']}-{i}"
            if i % 7 == 0:
                case.update(status="oom", latency_ms=None, tflops=None, gbps_model=None,
                            peak_mem_bytes=None)  # fmt: skip
            cases.append(case)
        doc = _doc(cases)
        doc["env"].update(gpu_name=f"GPU {g}", hostname=f"n{g}")
        docs.append(ResultsDoc.from_json(doc))
    merged = merge(docs)
    merged.cases = _CountingList(merged.cases)
    return merged


def test_report_steps_pass_over_the_cases_a_bounded_number_of_times() -> None:
    from fa_bench.reports import figures, per_gpu, roofline, speedup, summary, tables

    merged = _wide_merge()
    assert len(merged.gpus) == 12 and len(merged.impls) == 9
    steps = {
        "tflops_figure": lambda: figures.tflops_figure(merged),
        "memory_figure": lambda: figures.memory_figure(merged),
        "speedup_figure": lambda: speedup.speedup_figure(merged, "impl0"),
        "roofline_figure": lambda: roofline.roofline_figure(merged),
        "ceilings": lambda: roofline.ceilings(merged),
        "per_gpu_figure": lambda: per_gpu.per_gpu_figure(merged),
        "summary": lambda: summary.paragraph(merged, "impl0"),
        "case_rows": lambda: tables.case_rows(merged),
        "telemetry_note": lambda: tables.telemetry_note(merged),
    }
    passes = {}
    for name, step in steps.items():
        _CountingList.passes = 0
        step()
        passes[name] = _CountingList.passes
    # 12 facets, 12 GPUs, 9 implementations: a scan per any of them is > 10 passes.
    assert max(passes.values()) <= 10, passes


def test_a_zero_baseline_median_is_no_speedup_and_no_crash(tmp_path: Path) -> None:
    cases = [make_case("sdpa", 1536, median=2.0), make_case("flex", 1536, median=3.0)]
    cases[0]["latency_ms"].update(median=0.0, min=0.0, p20=0.0)
    file = _write(tmp_path, "zero.json", _doc(cases))
    got = runner.invoke(app, ["report", str(file), "-o", str(tmp_path / "page.html")])
    assert got.exit_code == 0, got.output


def test_a_negative_derived_latency_is_data_read_and_reported(tmp_path: Path) -> None:
    """A backward derived by subtracting the forward's median can fall below 0 in the
    noise: the record reads back (the run's own results.json must) and the report draws
    no speedup for it instead of failing on the logarithm of a negative ratio."""
    cases = [make_case("sdpa", 2560, median=2.0), make_case("flex", 2560, median=-0.02)]
    cases[1].update(derived="fwd_bwd samples minus the forward median")
    file = _write(tmp_path, "derived.json", _doc(cases))
    assert load_any(file)[0].cases[1].median_ms == -0.02
    got = runner.invoke(app, ["report", str(file), "-o", str(tmp_path / "page.html")])
    assert got.exit_code == 0, got.output
