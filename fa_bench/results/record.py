"""The case record: one measured (or failed) case, as the journal, results.json, the
report and `compare` all see it.

Every producer builds a `CaseRecord` and every reader gets one from `CaseRecord.from_json`;
the JSON form (a flat object, schema fa-bench/1) is written only by `to_json`. The JSON is
exactly what earlier versions wrote, so the schema string has not changed:

    id, impl, mode, dtype, batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, causal,
    device, status, error, backend, derived, latency_ms, timing, flops, bytes_model,
    tflops, gbps_model, peak_mem_bytes, accuracy, telemetry,
    [traceback], [prepare_s], [wall_s, host, gpu]

`traceback` is present for an unexpected error (null for an out-of-memory error, whose
trace says nothing new), `prepare_s` for a case that was prepared, and `wall_s`/`host`/`gpu`
once the runner has placed the record (`Placement`). Keys this version does not know (the
merge's `rank`) are kept in `extra` and written back unchanged, after the known ones.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from fa_bench import models
from fa_bench.case import Case, Status
from fa_bench.results import schema
from fa_bench.results.schema import ResultsError

__all__ = ["CaseRecord", "GpuRef", "Latency", "Placement", "ResultsDoc", "ResultsError"]

LATENCY_KEYS = ("median", "mean", "min", "max", "p20", "p80", "stdev", "n", "samples")
_CASE_KEYS = tuple(f.name for f in dataclasses.fields(Case))
# Case fields added later (decode's page_size, ctx_spread; issue 19's variants, written
# only when set): older files and dense cases lack them.
_OPTIONAL_CASE_KEYS = (
    "page_size", "ctx_spread", "window_left", "window_right", "alibi", "softcap", "varlen",
)  # fmt: skip


@dataclass(frozen=True)
class Latency:
    """Milliseconds per call over the timed samples (fa_bench.run.timing.summarize)."""

    median: float
    mean: float
    min: float
    max: float
    p20: float
    p80: float
    stdev: float
    n: int
    samples: list[float]
    # Relative standard error of the mean; absent from files older than the field.
    noise: float | None = None

    @classmethod
    def from_json(cls, d: object, where: str) -> Latency:
        if not isinstance(d, dict) or any(k not in d for k in LATENCY_KEYS):
            raise ResultsError(f"{where}: latency_ms must hold {', '.join(LATENCY_KEYS)}")
        at = f"{where}: latency_ms"
        # Not checked for sign: a backward derived by subtracting the forward's median
        # (`derived`) can come out below 0 in the noise, and that is data.
        stats = {k: schema.number(d, k, at, null=False) for k in LATENCY_KEYS[:7]}
        return cls(
            **stats,
            n=schema.integer(d, "n", at, null=False),
            samples=schema.number_list(d, "samples", at),
            noise=schema.number(d, "noise", at, default=None),
        )

    def to_json(self) -> dict[str, Any]:
        # summarize() puts noise before n; keep that order in the files. Built by hand:
        # dataclasses.asdict deep-copies every sample, a third of a large report's time.
        return {"median": self.median, "mean": self.mean, "min": self.min, "max": self.max,
                "p20": self.p20, "p80": self.p80, "stdev": self.stdev, "noise": self.noise,
                "n": self.n, "samples": list(self.samples)}  # fmt: skip


@dataclass(frozen=True)
class GpuRef:
    """The GPU a case ran on: its physical index on the host, UUID and name."""

    index: int
    uuid: str | None = None
    name: str | None = None

    @classmethod
    def from_json(cls, d: object, where: str) -> GpuRef | None:
        if d is None:
            return None
        if not isinstance(d, dict) or not isinstance(d.get("index"), int):
            raise ResultsError(f"{where}: gpu must be null or an object with an integer 'index'")
        at = f"{where}: gpu"
        return cls(
            index=d["index"],
            uuid=schema.string(d, "uuid", at, default=None),
            name=schema.string(d, "name", at, default=None),
        )

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "uuid": self.uuid, "name": self.name}


@dataclass(frozen=True)
class Placement:
    """Where and for how long the runner ran a case (set after the worker answered)."""

    wall_s: float | None
    host: str | None
    gpu: GpuRef | None


@dataclass
class CaseRecord:
    """One case's result. `case` is the benchmark point; the rest is what happened."""

    case: Case
    device: str
    status: Status
    error: str | None = None
    backend: str | None = None
    derived: str | None = None  # how a figure was derived (a subtracted forward), else None
    latency_ms: Latency | None = None
    timing: dict[str, Any] | None = None  # how it was timed (fa_bench.run.execute)
    flops: float | None = None
    bytes_model: float | None = None
    tflops: float | None = None
    gbps_model: float | None = None
    peak_mem_bytes: int | None = None
    accuracy: dict[str, Any] | None = None  # fa_bench.run.accuracy.check_accuracy
    telemetry: dict[str, Any] | None = None  # fa_bench.telemetry.session.case_telemetry
    traceback: str | None = None
    prepare_s: float | None = None
    # An fp8 case's per-tensor scales {"q", "k", "v"} (run/fp8_inputs.py); else None.
    fp8_scales: dict[str, float] | None = None
    placement: Placement | None = None
    id: str = ""  # the case id as written; defaults to case.id
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.status = Status(self.status)
        if not self.id:
            self.id = self.case.id

    @classmethod
    def for_case(cls, case: Case, device: object, status: Status, **fields: Any) -> CaseRecord:
        """A record of `case` with its modelled FLOPs and bytes (fa_bench.models) filled in,
        as every record carries them, whatever happened to the case."""
        return cls(
            case=case,
            device=str(device),
            status=status,
            flops=models.case_flops(case),
            bytes_model=models.case_bytes(case),
            **fields,
        )

    @classmethod
    def failed(cls, case: Case, status: Status, message: str, device: object) -> CaseRecord:
        """A case that has no measurement: its worker never answered (timeout, crash)."""
        return cls.for_case(case, device, status, error=message)

    @property
    def impl(self) -> str:
        return self.case.impl

    @property
    def rank(self) -> int | None:
        """The part (rank or GPU index) a merged run took this case from; None unmerged."""
        return self.extra.get("rank")

    @property
    def median_ms(self) -> float | None:
        return self.latency_ms.median if self.latency_ms is not None else None

    @property
    def noisy_at_limit(self) -> bool:
        """Timing gave up at its time limit (`stop_reason` "time-limit") with the noise
        still above its target: the median is less certain than the run asked for."""
        timing, lat = self.timing or {}, self.latency_ms
        if timing.get("stop_reason") != "time-limit" or lat is None or lat.noise is None:
            return False
        target = timing.get("target_noise")
        return lat.noise > (target if isinstance(target, (int, float)) else 0.01)

    @property
    def gpu(self) -> GpuRef | None:
        return self.placement.gpu if self.placement is not None else None

    @property
    def wall_s(self) -> float | None:
        return self.placement.wall_s if self.placement is not None else None

    @property
    def host(self) -> str | None:
        return self.placement.host if self.placement is not None else None

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"id": self.id, **self.case.to_dict()}
        d.update(
            device=self.device,
            status=self.status.value,
            error=self.error,
            backend=self.backend,
            derived=self.derived,
            latency_ms=self.latency_ms.to_json() if self.latency_ms is not None else None,
            timing=self.timing,
            flops=self.flops,
            bytes_model=self.bytes_model,
            tflops=self.tflops,
            gbps_model=self.gbps_model,
            peak_mem_bytes=self.peak_mem_bytes,
            accuracy=self.accuracy,
            telemetry=self.telemetry,
        )
        if self.traceback is not None or self.status is Status.OOM:
            d["traceback"] = self.traceback
        if self.prepare_s is not None:
            d["prepare_s"] = self.prepare_s
        if self.fp8_scales is not None:
            d["fp8_scales"] = self.fp8_scales
        if self.placement is not None:
            gpu = self.placement.gpu
            d.update(
                wall_s=self.placement.wall_s,
                host=self.placement.host,
                gpu=gpu.to_json() if gpu is not None else None,
            )
        d.update(self.extra)
        return d

    @classmethod
    def from_json(cls, d: object, where: str = "record") -> CaseRecord:
        """Check and read one record; `where` (file and index) starts every error message."""
        if not isinstance(d, dict):
            raise ResultsError(f"{where} is not an object")
        where = f"{where} ({d.get('id')})" if isinstance(d.get("id"), str) else where
        missing = [k for k in REQUIRED_KEYS if k not in d]
        if missing:
            raise ResultsError(f"{where} lacks {', '.join(missing)}")
        _check_types(d, where)
        try:
            case = Case.from_dict(d)
        except (TypeError, ValueError) as exc:
            raise ResultsError(f"{where}: {exc}") from None
        tel = d["telemetry"]
        if tel is not None and not (
            isinstance(tel, dict) and isinstance(tel.get("available"), bool)
        ):
            raise ResultsError(f"{where}: telemetry must be null or an object with 'available'")
        lat = d["latency_ms"]
        placed = "wall_s" in d or "host" in d or "gpu" in d
        return cls(
            case=case,
            id=d["id"],
            device=d["device"],
            status=Status(d["status"]),
            error=d["error"],
            backend=d.get("backend"),
            derived=d.get("derived"),
            latency_ms=Latency.from_json(lat, where) if lat is not None else None,
            timing=d.get("timing"),
            flops=d.get("flops"),
            bytes_model=d.get("bytes_model"),
            tflops=d["tflops"],
            gbps_model=d["gbps_model"],
            peak_mem_bytes=d["peak_mem_bytes"],
            accuracy=d["accuracy"],
            telemetry=tel,
            traceback=d.get("traceback"),
            prepare_s=d.get("prepare_s"),
            fp8_scales=d.get("fp8_scales"),
            placement=Placement(
                wall_s=d.get("wall_s"),
                host=d.get("host"),
                gpu=GpuRef.from_json(d.get("gpu"), where),
            )
            if placed
            else None,
            extra={k: v for k, v in d.items() if k not in _KNOWN_KEYS},
        )


_STRINGS = ("id", "impl", "mode", "dtype", "device", "status")
_NULLABLE_STRINGS = ("error", "backend", "derived", "traceback", "host")
_NULLABLE_NUMBERS = ("flops", "bytes_model", "tflops", "gbps_model", "peak_mem_bytes",
                     "prepare_s", "wall_s")  # fmt: skip
# Counts, sizes and durations; tflops and gbps_model follow a (derived) latency's sign.
_NOT_NEGATIVE = ("flops", "bytes_model", "peak_mem_bytes", "prepare_s", "wall_s")
_INTS = ("batch", "heads_q", "heads_kv", "seqlen_q", "seqlen_k", "head_dim")


def _check_types(d: dict, where: str) -> None:
    """Every known field of a record has its JSON type (the error names the field)."""
    for key in _STRINGS:
        schema.string(d, key, where, null=False)
    for key in _INTS:
        schema.integer(d, key, where, null=False)
    schema.integer(d, "page_size", where, default=0)
    schema.number(d, "ctx_spread", where, default=1.0)
    for key in ("window_left", "window_right"):
        schema.integer(d, key, where, default=-1)
    schema.number(d, "softcap", where, default=0.0)
    schema.string(d, "varlen", where, default="")
    if not isinstance(d.get("alibi", False), bool):
        raise ResultsError(f"{where}: alibi must be true or false, got {schema.show(d['alibi'])}")
    if not isinstance(d["causal"], bool):
        raise ResultsError(f"{where}: causal must be true or false, got {schema.show(d['causal'])}")
    valid_status = {s.value for s in Status}
    if d["status"] not in valid_status:
        valid = ", ".join(sorted(valid_status))
        raise ResultsError(f"{where}: status {d['status']!r} is not one of {valid}")
    for key in _NULLABLE_STRINGS:
        schema.string(d, key, where, default=None)
    for key in _NULLABLE_NUMBERS:
        schema.number(d, key, where, default=None, nonneg=key in _NOT_NEGATIVE)
    for key in ("timing", "accuracy"):
        schema.obj(d, key, where, default=None)
    _check_fp8_scales(d, where)
    if d.get("timing") is not None:
        schema.check_timing(d["timing"], where)
    if isinstance(d["telemetry"], dict):
        schema.check_telemetry(d["telemetry"], where)


def _check_fp8_scales(d: dict, where: str) -> None:
    """`fp8_scales`, when present: {"q", "k", "v"} positive numbers (null: no fp8 case)."""
    scales = schema.obj(d, "fp8_scales", where, default=None)
    if scales is None:
        return
    at = f"{where}: fp8_scales"
    for key in ("q", "k", "v"):
        if key not in scales:
            raise ResultsError(f"{at} lacks {key!r}")
        schema.number(scales, key, at, null=False, nonneg=True)


REQUIRED_KEYS = (
    "id", *(k for k in _CASE_KEYS if k not in _OPTIONAL_CASE_KEYS), "device", "status",
    "error", "latency_ms", "tflops", "gbps_model", "peak_mem_bytes", "accuracy", "telemetry",
)  # fmt: skip
_KNOWN_KEYS = frozenset(
    (*REQUIRED_KEYS, *_OPTIONAL_CASE_KEYS, "backend", "derived", "timing", "flops",
     "bytes_model", "traceback", "prepare_s", "fp8_scales", "wall_s", "host", "gpu")
)  # fmt: skip


SCHEMA = "fa-bench/1"


@dataclass
class ResultsDoc:
    """One results.json: the run (argv, suites, options, times), the environment (GPU,
    versions, telemetry) and the case records."""

    run: dict[str, Any]
    env: dict[str, Any]
    cases: list[CaseRecord]

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "run": self.run,
            "env": self.env,
            "cases": [c.to_json() for c in self.cases],
        }

    @classmethod
    def from_json(cls, doc: object, source: str = "results") -> ResultsDoc:
        """Check a whole document; errors name `source` and, for a case, its index."""
        if not isinstance(doc, dict):
            raise ResultsError(f"{source}: not a JSON object")
        if doc.get("schema") != SCHEMA:
            raise ResultsError(
                f"{source}: schema is {doc.get('schema')!r}, this fa-bench reads {SCHEMA!r}"
            )
        for key, kind in (("run", dict), ("env", dict), ("cases", list)):
            if not isinstance(doc.get(key), kind):
                raise ResultsError(f"{source}: '{key}' must be a JSON {kind.__name__}")
        schema.check_run(doc["run"], source)
        schema.check_env(doc["env"], source)
        cases = [
            CaseRecord.from_json(c, f"{source}: cases[{i}]") for i, c in enumerate(doc["cases"])
        ]
        return cls(run=doc["run"], env=doc["env"], cases=cases)
