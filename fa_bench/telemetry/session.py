"""GPU telemetry per case through NVML: achieved HBM bandwidth (GPM), SM and tensor-core
activity, clocks, power, energy, temperature, throttling and device memory in use.

A case's telemetry comes from its own window, after (never inside) its latency samples: the
case's closure runs back to back for at least `window_s` (1 s; GPM and the energy counter
need that long to mean anything), without the L2 flush, which would add its own DRAM
traffic. GPM and the energy counter are read at both ends of the window, on a GPU while it
is busy (`telemetry_window`); clocks, power, temperature, clock-event bits and memory in
use are polled from a thread in between.

Nothing here fails a case: no driver, no pynvml, no GPM, one metric not supported, or any
error inside the window, each becomes `{"available": false, "reason": ...}` or a
per-field entry in `unavailable`, with the field itself null, never a zero.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING

from fa_bench import models
from fa_bench.case import Case, Mode
from fa_bench.telemetry.fields import (
    bandwidth_fields,
    energy_fields,
    number,
    reading_fields,
    telemetry_warnings,
)
from fa_bench.telemetry.nvml import (
    GPM_METRICS,
    NvmlDevice,
    NvmlUnavailable,
    Poller,
    load_library,
    normalize_uuid,
)
from fa_bench.telemetry.window import CudaMark, Mark, run_busy_window, run_window

Closure = Callable[[], object]
DISABLED = "disabled (--no-telemetry)"

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class TelemetryConfig:
    window_s: float = 1.0
    poll_s: float = 0.05
    max_calls: int = 1_000_000  # a bound for closures that cost next to nothing
    sm_clock_warn_fraction: float = 0.9
    calibration_bytes: int = 256 * 2**20  # per buffer: far beyond any L2

    def __post_init__(self) -> None:
        # GPM reads 0 for windows under ~100 ms (field notes §3).
        if self.window_s < 0.1:
            raise ValueError(f"window_s must be at least 0.1 s, got {self.window_s}")
        if not 0 < self.poll_s <= self.window_s:
            raise ValueError(f"poll_s must be in (0, window_s], got {self.poll_s}")


class TelemetrySession:
    """NVML opened once per worker for one GPU; `reason` is why not, when it is not."""

    def __init__(
        self,
        device: NvmlDevice | None,
        *,
        reason: str | None = None,
        sync: Callable[[], None] = lambda: None,
        config: TelemetryConfig | None = None,
        uuid: str | None = None,
        mark: Callable[[], Mark] | None = None,
    ) -> None:
        self.dev, self.reason, self.sync = device, reason, sync
        # Device-stream marks (CUDA events) for readings inside a busy window; without
        # them (fakes, tests) the readings are taken at the window's edges.
        self.mark = mark
        self.config = config or TelemetryConfig()
        self.uuid = uuid
        self.gpm_reason: str | None = None
        self.peak_gbps: float | str | None = None  # a float, or why it is unknown
        self.sm_clock_max_mhz: float | str | None = None
        if device is not None:
            self.gpm_reason = _reason_of(device.gpm_check)
            self.peak_gbps = _value_or_reason(device.peak_bandwidth_gbps)
            self.sm_clock_max_mhz = _value_or_reason(device.sm_clock_max_mhz)

    @property
    def available(self) -> bool:
        return self.dev is not None

    @property
    def nvml(self) -> NvmlDevice:
        """The NVML device, where `available` has been checked."""
        if self.dev is None:
            raise NvmlUnavailable(self.reason or "telemetry is unavailable")
        return self.dev

    @classmethod
    def unavailable(cls, reason: str) -> TelemetrySession:
        return cls(None, reason=reason)

    @classmethod
    def from_uuid(
        cls,
        uuid: object,
        *,
        lib: ModuleType | None = None,
        sync: Callable[[], None] = lambda: None,
        config: TelemetryConfig | None = None,
        mark: Callable[[], Mark] | None = None,
    ) -> TelemetrySession:
        try:
            nvml = load_library(lib)
            device = NvmlDevice.by_uuid(nvml, uuid)
        except NvmlUnavailable as exc:
            return cls.unavailable(str(exc))
        return cls(device, sync=sync, config=config, uuid=normalize_uuid(uuid), mark=mark)

    def describe(self) -> dict:
        """What telemetry works on this GPU and why not where it does not."""
        if not self.available:
            return {"available": False, "reason": self.reason}
        readings = {}
        for name, read in self.nvml.probes().items():
            readings[name] = _reason_of(read) or "ok"
        readings["energy_mj"] = _reason_of(self.nvml.energy_mj) or "ok"
        return {
            "available": True,
            "uuid": self.uuid,
            "gpm": self.gpm_reason or "ok",
            "readings": readings,
            "gbps_peak_theoretical": self.peak_gbps,
            "sm_clock_mhz_max": self.sm_clock_max_mhz,
        }

    def clock_probe(self) -> Callable[[], float | None] | None:
        """The SM clock reader the timing loop samples; None without NVML."""
        if not self.available:
            return None
        dev = self.nvml

        def read() -> float | None:
            try:
                return float(dev.read("sm_clock_mhz"))
            except NvmlUnavailable:
                return None

        return read

    def measure(
        self,
        closure: Closure,
        before: Closure | None,
        *,
        per_call_s: float | None,
        bytes_model: float | None,
    ) -> dict:
        """The telemetry object of one case; never raises."""
        if not self.available:
            return {"available": False, "reason": self.reason}
        try:
            return self._measure(closure, before, per_call_s, bytes_model)
        except Exception as exc:  # a telemetry error must never fail a case: record it
            return {"available": False, "reason": f"telemetry failed: {type(exc).__name__}: {exc}"}

    def _measure(
        self,
        closure: Closure,
        before: Closure | None,
        per_call_s: float | None,
        bytes_model: float | None,
    ) -> dict:
        cfg = self.config
        self.sync()  # earlier work must not land in the window
        r = _Readings(self)
        try:
            if self.mark is not None:
                w = run_busy_window(
                    closure, before, mark=self.mark, sync=self.sync, open=r.open, close=r.close,
                    per_call_s=per_call_s, target_s=cfg.window_s, max_calls=cfg.max_calls,
                )  # fmt: skip
                # The energy delta spans the readings, not the marks (below: its calls
                # pro rata).
                window_s, calls, energy_s = w.seconds, w.calls, w.readings_s
            else:
                r.open()
                window_s, calls = run_window(
                    closure, before, sync=self.sync, per_call_s=per_call_s,
                    target_s=cfg.window_s, max_calls=cfg.max_calls,
                )  # fmt: skip
                r.close()
                energy_s = window_s
        finally:
            r.free()
        if window_s <= 0 or calls == 0:
            # Nothing ran on the device: any rate would divide by zero or describe idle.
            return {"available": False, "reason": f"the telemetry window saw no device time "
                    f"({calls} calls, {window_s:.3g} s): the case queued no GPU work"}  # fmt: skip
        energy_calls = calls * energy_s / window_s
        unavailable: dict[str, str] = {}
        out: dict = {
            "available": True,
            "window_s": window_s,
            "calls": calls,
            "ms_per_call_window": window_s / calls * 1e3,
            "l2_flush": False,
            "readings": "inside a busy window" if self.mark is not None else "window edges",
        }
        for name in GPM_METRICS:
            value = r.gpm.get(name)
            out[name] = value if isinstance(value, float) else None
            if out[name] is None:
                unavailable[name] = str(value) if value is not None else str(r.gpm_reason)
        bandwidth_fields(out, self.peak_gbps, bytes_model, unavailable)
        values, failed = r.poller.values, r.poller.failed
        reading_fields(out, values, failed, unavailable)
        energy_fields(
            out, r.energy0, r.energy1, energy_s, energy_calls, values, failed, unavailable
        )
        out["sm_clock_mhz_max"] = number(self.sm_clock_max_mhz)
        out["warnings"] = telemetry_warnings(out, cfg.sm_clock_warn_fraction)
        out["unavailable"] = unavailable
        return out

    def _gpm_close(self, first: object) -> tuple[str | None, dict]:
        """(why GPM failed or None, the metrics between `first` and a sample taken now)."""
        try:
            second = self.nvml.gpm_sample()
        except NvmlUnavailable as exc:
            return str(exc), {}
        try:
            return None, self.nvml.gpm_metrics(first, second)
        except NvmlUnavailable as exc:
            return str(exc), {}
        finally:
            self.nvml.gpm_free(second)

    def calibrate(self, device: torch.device | str, nbytes: int | None = None) -> dict:
        """Copy a buffer for a window and compare bytes / time with NVML's GB/s, so a reader
        of the run can judge its telemetry. Never raises."""
        if not self.available:
            return {"available": False, "reason": self.reason}
        try:
            return self._calibrate(device, nbytes)
        except Exception as exc:  # a calibration that cannot run is recorded, not fatal
            return {
                "available": False,
                "reason": f"calibration failed: {type(exc).__name__}: {exc}",
            }
        finally:
            if getattr(device, "type", str(device)) == "cuda":
                import torch

                torch.cuda.empty_cache()  # the copy buffers must not crowd the first case

    def _calibrate(self, device: torch.device | str, nbytes: int | None) -> dict:
        import torch

        n = nbytes or self.config.calibration_bytes
        src = torch.ones(n, dtype=torch.uint8, device=device)
        dst = torch.empty_like(src)

        def copy() -> None:
            dst.copy_(src)

        self.sync()
        t0 = time.perf_counter()
        for _ in range(3):
            copy()
        self.sync()
        tel = self.measure(copy, None, per_call_s=(time.perf_counter() - t0) / 3, bytes_model=2 * n)
        if not tel["available"]:
            return tel
        gbps_copy = 2 * n * tel["calls"] / tel["window_s"] / 1e9  # read + write
        gbps_nvml = tel["gbps_nvml"]
        return {
            "available": True,
            "copy_bytes": n,
            "window_s": tel["window_s"],
            "calls": tel["calls"],
            "gbps_copy": gbps_copy,
            "gbps_nvml": gbps_nvml,
            "dram_bw_util_pct": tel["dram_bw_util_pct"],
            "gbps_peak_theoretical": tel["gbps_peak_theoretical"],
            "ratio_nvml_to_copy": gbps_nvml / gbps_copy if gbps_nvml is not None else None,
            "sm_clock_mhz_mean": tel["sm_clock_mhz_mean"],
            "warnings": tel["warnings"],
            "unavailable": tel["unavailable"],
        }


def open_session(
    device: torch.device | str,
    *,
    enabled: bool = True,
    lib: ModuleType | None = None,
    config: TelemetryConfig | None = None,
) -> TelemetrySession:
    """The worker's session for a torch device: the GPU is found in NVML by its uuid, since
    NVML's indices ignore CUDA_VISIBLE_DEVICES while torch's honour it."""
    if not enabled:
        return TelemetrySession.unavailable(DISABLED)
    if getattr(device, "type", str(device)) != "cuda":
        return TelemetrySession.unavailable("no NVIDIA GPU: this run uses the CPU")
    import torch

    uuid = getattr(torch.cuda.get_device_properties(device), "uuid", None)
    if not uuid:
        return TelemetrySession.unavailable("torch reports no uuid for this GPU")
    return TelemetrySession.from_uuid(
        uuid, lib=lib, sync=lambda: torch.cuda.synchronize(device), config=config,
        mark=lambda: CudaMark(device),
    )  # fmt: skip


class _Readings:
    """What a window reads at its two ends: GPM samples, the energy counter, and a poller
    running in between. `open()` again (a second attempt) starts over."""

    def __init__(self, session: TelemetrySession) -> None:
        self.s = session
        self.first: object | None = None
        self.poller: Poller = Poller({}, session.config.poll_s)
        self.gpm_reason: str | None = session.gpm_reason
        self.gpm: dict[str, float | NvmlUnavailable] = {}
        self.energy0: float | str = "window never opened"
        self.energy1: float | str = "window never closed"

    def open(self) -> None:
        self.free()
        dev = self.s.nvml
        self.gpm_reason, self.gpm = self.s.gpm_reason, {}
        if self.gpm_reason is None:
            try:
                self.first = dev.gpm_sample()
            except NvmlUnavailable as exc:
                self.gpm_reason = str(exc)
        self.energy0 = _value_or_reason(dev.energy_mj)
        self.poller = Poller(dev.probes(), self.s.config.poll_s)
        self.poller.start()

    def close(self) -> None:
        # The closing readings first, then the poller's last poll.
        self.energy1 = _value_or_reason(self.s.nvml.energy_mj)
        if self.first is not None:
            self.gpm_reason, self.gpm = self.s._gpm_close(self.first)
        self.poller.finish()

    def free(self) -> None:
        self.poller.finish()
        if self.first is not None:
            self.s.nvml.gpm_free(self.first)
            self.first = None


def case_telemetry(
    session: TelemetrySession | None,
    case: Case,
    closure: Closure,
    before: Closure | None,
    *,
    median_ms: float,
    derived: bool,
) -> dict:
    """Telemetry for a timed case. A derived backward's closure is forward + backward, so
    its bytes are compared with the fwd_bwd model and the object says `window_covers`."""
    if session is None:
        return {"available": False, "reason": "no telemetry session in this process"}
    covers = Mode.FWD_BWD if derived else case.mode
    bytes_model = models.case_bytes(dataclasses.replace(case, mode=covers))
    per_call_s = median_ms / 1e3 if median_ms and median_ms > 0 else None
    record = session.measure(closure, before, per_call_s=per_call_s, bytes_model=bytes_model)
    if record["available"]:
        record["window_covers"] = covers.value
    return record


def _reason_of(fn: Callable[[], object]) -> str | None:
    try:
        fn()
    except NvmlUnavailable as exc:
        return str(exc)
    return None


def _value_or_reason(fn: Callable[[], float]) -> float | str:
    try:
        return fn()
    except NvmlUnavailable as exc:
        return str(exc)
