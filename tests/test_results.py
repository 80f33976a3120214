"""results.json: schema validation, round trip, and the loader's errors."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from fa_bench.case import Case, Status
from fa_bench.results.files import build_document, load_results, sanitize, write_results
from fa_bench.results.record import (
    SCHEMA,
    CaseRecord,
    GpuRef,
    Latency,
    Placement,
    ResultsDoc,
    ResultsError,
)
from fa_bench.run.timing import summarize


def sample_doc() -> ResultsDoc:
    case = Case("naive", "fwd", "bf16", 1, 2, 2, 64, 64, 32, True)
    latency = Latency.from_json(summarize([1.0, 1.1, 0.9]), case.id)
    ok = CaseRecord.for_case(case, "cuda:0", Status.OK, latency_ms=latency, tflops=1.5)
    oom = CaseRecord.for_case(
        case.__class__(**{**case.to_dict(), "seqlen_q": 128, "seqlen_k": 128}),
        "cuda:0",
        Status.OOM,
        error="CUDA out of memory",
    )
    return build_document({"id": "r1"}, {"hostname": "h"}, [ok, oom])


def test_round_trip(tmp_path: Path) -> None:
    doc = sample_doc()
    json_path, csv_path = write_results(tmp_path, doc)
    back = load_results(json_path)
    assert back == doc
    assert load_results(tmp_path) == doc  # a directory holding results.json works too
    assert json.loads(json_path.read_text())["schema"] == SCHEMA
    assert back.cases[0].latency_ms is not None
    assert back.cases[0].latency_ms.samples == [1.0, 1.1, 0.9]
    assert csv_path.read_text().splitlines()[0].startswith("id,impl,mode")


def test_non_finite_numbers_become_null() -> None:
    assert sanitize({"a": float("nan"), "b": [float("inf"), 1.0]}) == {"a": None, "b": [None, 1.0]}


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.update(schema="fa-bench/0"), "schema"),
        (lambda d: d.pop("env"), "'env'"),
        (lambda d: d["cases"][0].pop("latency_ms"), "lacks latency_ms"),
        (lambda d: d["cases"][0].update(status="great"), "status 'great'"),
        (lambda d: d["cases"][0]["latency_ms"].pop("p20"), "latency_ms must hold"),
    ],
)
def test_validation_rejects(mutate, message: str) -> None:
    doc = copy.deepcopy(sample_doc().to_json())
    mutate(doc)
    with pytest.raises(ResultsError, match=message):
        ResultsDoc.from_json(doc)


def test_load_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(ResultsError, match="no such file"):
        load_results(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ResultsError, match=r"bad\.json"):
        load_results(bad)
    pickled = tmp_path / "p.json"
    pickled.write_bytes(b"\x80\x04\x95")
    with pytest.raises(ResultsError, match=r"p\.json"):
        load_results(pickled)
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"schema": "something-else", "cases": []}))
    with pytest.raises(ResultsError, match="something-else"):
        load_results(other)


def test_csv_keeps_each_cases_gpu_in_multi_gpu_runs() -> None:
    from fa_bench.results.files import to_frame

    case = Case("naive", "fwd", "bf16", 1, 2, 2, 8, 8, 16, False)
    recs = [
        CaseRecord.for_case(
            case,
            "cuda:0",
            Status.OK,
            placement=Placement(None, None, GpuRef(index=i, uuid=f"u{i}", name="H200")),
        )
        for i in (0, 3)
    ]
    frame = to_frame(build_document({}, {"gpu_name": "H200"}, recs))
    assert list(frame["gpu.index"]) == [0, 3] and list(frame["gpu.uuid"]) == ["u0", "u3"]
