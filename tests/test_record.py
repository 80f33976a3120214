"""The case record (fa_bench.results.record): what the worker writes reads back the same,
byte for byte; a bad field is named with its case; keys of a later version survive."""

from __future__ import annotations

import json

import pytest
import torch

from fa_bench import models, registry
from fa_bench.case import Case, Status
from fa_bench.results.record import (
    CaseRecord,
    GpuRef,
    Placement,
    ResultsDoc,
    ResultsError,
)
from fa_bench.run.execute import ExecOptions, run_case
from fa_bench.run.timing import TimingConfig

CASE = Case("naive", "fwd", "fp32", 1, 2, 2, 16, 16, 16, True)
FAST = TimingConfig(target_noise=0.5, min_samples=3, min_time_s=0.0, max_time_s=0.05)


def dumps(obj: object) -> str:
    return json.dumps(obj, allow_nan=False)


@pytest.fixture(scope="module")
def measured() -> CaseRecord:
    """A real record: the case measured in this process, as the worker measures it."""
    registry.load()
    record = run_case(CASE, torch.device("cpu"), ExecOptions(timing=FAST))
    assert record.status is Status.OK, record.error
    return record


def test_a_measured_record_round_trips_byte_for_byte(measured: CaseRecord) -> None:
    text = dumps(measured.to_json())
    back = CaseRecord.from_json(json.loads(text))
    assert back == measured
    assert dumps(back.to_json()) == text
    d = json.loads(text)
    assert list(d)[:12] == ["id", *CASE.to_dict(), "device"]
    assert d["latency_ms"]["n"] >= 2 and d["prepare_s"] is not None
    assert "traceback" not in d and "wall_s" not in d  # not failed, not placed yet


def test_a_placed_record_in_a_document_round_trips(measured: CaseRecord) -> None:
    placed = CaseRecord.from_json(measured.to_json())
    placed.placement = Placement(wall_s=0.25, host="node-a", gpu=GpuRef(3, "GPU-u3", "H200"))
    doc = ResultsDoc(run={"id": "r"}, env={"hostname": "node-a"}, cases=[placed])
    text = json.dumps(doc.to_json(), indent=1, allow_nan=False)
    back = ResultsDoc.from_json(json.loads(text))
    assert back == doc and json.dumps(back.to_json(), indent=1) == text
    d = json.loads(text)["cases"][0]
    assert list(d)[-3:] == ["wall_s", "host", "gpu"]
    assert d["gpu"] == {"index": 3, "uuid": "GPU-u3", "name": "H200"}
    assert back.cases[0].gpu == GpuRef(3, "GPU-u3", "H200") and back.cases[0].host == "node-a"


def test_a_failed_record_carries_the_models_and_no_measurement() -> None:
    rec = CaseRecord.failed(CASE, Status.TIMEOUT, "case timed out (no answer within 20 s)", "cpu")
    d = rec.to_json()
    assert list(d) == [
        "id", *CASE.to_dict(), "device", "status", "error", "backend", "derived",
        "latency_ms", "timing", "flops", "bytes_model", "tflops", "gbps_model",
        "peak_mem_bytes", "accuracy", "telemetry",
    ]  # fmt: skip
    assert d["status"] == "timeout" and d["device"] == "cpu" and d["id"] == CASE.id
    assert d["flops"] == models.case_flops(CASE) and d["bytes_model"] == models.case_bytes(CASE)
    assert d["latency_ms"] is None and d["tflops"] is None


def test_an_out_of_memory_record_keeps_its_null_traceback() -> None:
    rec = CaseRecord.for_case(CASE, "cpu", Status.OOM, error="out of memory")
    d = rec.to_json()
    assert "traceback" in d and d["traceback"] is None
    assert CaseRecord.from_json(d).to_json() == d


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("seqlen_q", "long", "seqlen_q"),
        ("mode", "sideways", "sideways"),
        ("status", "great", "status 'great'"),
        ("latency_ms", {"median": 1.0}, "latency_ms must hold"),
        ("telemetry", {"gbps_nvml": 1.0}, "telemetry"),
        ("gpu", {"index": "first"}, "gpu must be"),
    ],
)
def test_a_wrong_field_is_named_with_its_case(
    measured: CaseRecord, field: str, value: object, message: str
) -> None:
    doc = ResultsDoc(run={}, env={}, cases=[measured]).to_json()
    doc["cases"][0][field] = value
    with pytest.raises(ResultsError, match=message) as info:
        ResultsDoc.from_json(doc, source="runs/a/results.json")
    text = str(info.value)
    assert text.startswith(f"runs/a/results.json: cases[0] ({CASE.id})"), text


def test_a_missing_field_is_named(measured: CaseRecord) -> None:
    d = measured.to_json()
    del d["tflops"]
    with pytest.raises(ResultsError, match=rf"journal.jsonl:3 \({CASE.id}\) lacks tflops"):
        CaseRecord.from_json(d, "journal.jsonl:3")


def test_unknown_keys_are_kept_in_place(measured: CaseRecord) -> None:
    d = {**measured.to_json(), "rank": 2, "energy_j": {"per_call": 0.5}}
    rec = CaseRecord.from_json(d)
    assert rec.rank == 2 and rec.extra == {"rank": 2, "energy_j": {"per_call": 0.5}}
    assert dumps(rec.to_json()) == dumps(d)
