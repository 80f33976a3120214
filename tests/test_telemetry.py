"""NVML telemetry: arithmetic, decoding, the window, every degrade path (through a fake pynvml
module, since this machine has no driver), the run path on a CPU, and on a GPU (`-m gpu`)
the agreement of NVML's GB/s with a copy and the extra bytes of naive attention."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import FAST
from fake_nvml import DRIVER_NOT_LOADED, NOT_SUPPORTED, UUID, FakeNvml
from rich.console import Console
from typer.testing import CliRunner

from fa_bench import models
from fa_bench.case import Case, Status
from fa_bench.cli import app
from fa_bench.console import RunProgress
from fa_bench.results.files import load_results
from fa_bench.results.record import CaseRecord
from fa_bench.telemetry.env import support_table
from fa_bench.telemetry.nvml import (
    NvmlUnavailable,
    Poller,
    decode_clock_events,
    gbps_from_util,
    normalize_uuid,
    peak_bandwidth_gbps,
)
from fa_bench.telemetry.session import (
    DISABLED,
    TelemetryConfig,
    TelemetrySession,
    case_telemetry,
    open_session,
    run_window,
)

WINDOW = TelemetryConfig(window_s=0.1, poll_s=0.02)
H200_PEAK_GBPS = 4814.304  # 3201e6 Hz × 2 edges × 6016 bit / 8 = 4.814304e12 B/s
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def session(fake: FakeNvml | None = None) -> TelemetrySession:
    return TelemetrySession.from_uuid(UUID, lib=fake or FakeNvml(), config=WINDOW)


class Counter:
    def __init__(self, cost_s: float = 0.0) -> None:
        self.calls, self.cost_s = 0, cost_s

    def __call__(self) -> None:
        self.calls += 1
        if self.cost_s:
            time.sleep(self.cost_s)


def measure(s: TelemetrySession, bytes_model: float = 1e6) -> tuple[dict, Counter, Counter]:
    call, before = Counter(0.001), Counter()
    return s.measure(call, before, per_call_s=0.001, bytes_model=bytes_model), call, before


# --- arithmetic and decoding --------------------------------------------------------------


def test_bandwidth_arithmetic() -> None:
    assert peak_bandwidth_gbps(3201, 6016) == pytest.approx(H200_PEAK_GBPS)
    # Field notes: GPM read 87.5% during a copy on the H200, ≈ 4.21 TB/s.
    assert gbps_from_util(87.5, H200_PEAK_GBPS) == pytest.approx(4212.516)
    assert gbps_from_util(0.0, H200_PEAK_GBPS) == 0.0


def test_clock_event_bits_decode_to_names() -> None:
    assert decode_clock_events(0) == []
    assert decode_clock_events(0x1 | 0x4 | 0x40) == [
        "gpu_idle",
        "sw_power_cap",
        "hw_thermal_slowdown",
    ]
    assert decode_clock_events(0x8 | 0x20 | 0x80) == [
        "hw_slowdown",
        "sw_thermal_slowdown",
        "hw_power_brake_slowdown",
    ]
    assert decode_clock_events(0x4 | 0x1000) == ["sw_power_cap", "unknown_0x1000"]


def test_uuid_normalisation() -> None:
    bare = UUID.removeprefix("GPU-")
    assert normalize_uuid(UUID) == UUID
    assert normalize_uuid(bare) == UUID
    import uuid

    assert normalize_uuid(uuid.UUID(bare)) == UUID
    with pytest.raises(NvmlUnavailable, match="uuid"):
        normalize_uuid("not-a-uuid")


def test_config_refuses_windows_gpm_cannot_read() -> None:
    with pytest.raises(ValueError, match="window_s"):
        TelemetryConfig(window_s=0.05)


# --- the window ---------------------------------------------------------------------------


def test_window_lasts_the_target_and_calls_before_each_time() -> None:
    call, before = Counter(0.002), Counter()
    elapsed, calls = run_window(call, before, sync=lambda: None, per_call_s=0.002,
                                target_s=0.1, max_calls=10**6)  # fmt: skip
    assert elapsed >= 0.1
    assert calls == call.calls == before.calls
    assert 10 <= calls <= 60  # ~50 at 2 ms; sleep overshoot makes it fewer, never more


def test_a_slow_case_runs_once() -> None:
    call = Counter(0.15)
    elapsed, calls = run_window(call, None, sync=lambda: None, per_call_s=0.15,
                                target_s=0.1, max_calls=10**6)  # fmt: skip
    assert calls == 1 and elapsed >= 0.1


def test_window_corrects_a_wrong_latency_estimate() -> None:
    # Estimate 1 s per call, really 1 ms: more rounds until the window is long enough.
    call = Counter(0.001)
    elapsed, calls = run_window(call, None, sync=lambda: None, per_call_s=1.0,
                                target_s=0.1, max_calls=10**6)  # fmt: skip
    assert elapsed >= 0.1 and calls > 1
    # Estimate 1 µs, really 10 ms (a host-bound case): host time ends it, not 100k calls.
    call = Counter(0.01)
    elapsed, calls = run_window(call, None, sync=lambda: None, per_call_s=1e-6,
                                target_s=0.1, max_calls=10**6)  # fmt: skip
    assert elapsed >= 0.1 and calls <= 11


def test_poller_reads_inside_the_window_only() -> None:
    # A poll before the first call would see an idle GPU (gpu_idle bit, idle clocks).
    poller = Poller({"t": time.perf_counter}, poll_s=0.01)
    start = time.perf_counter()
    poller.start()
    time.sleep(0.06)
    poller.finish()
    assert len(poller.values["t"]) >= 2 and min(poller.values["t"]) > start
    idle = Poller({"t": time.perf_counter}, poll_s=0.01)
    idle.finish()  # never started (no turn): one late reading rather than none
    assert len(idle.values["t"]) == 1


# --- a full reading through the fake NVML --------------------------------------------------


def test_full_reading() -> None:
    fake = FakeNvml()
    t, call, before = measure(session(fake), bytes_model=1e6)
    assert t["available"] is True and t["unavailable"] == {} and t["warnings"] == []
    assert t["calls"] == call.calls == before.calls and t["window_s"] >= 0.1
    assert (t["sm_util_pct"], t["sm_occupancy_pct"]) == (80.0, 40.0)
    assert (t["tensor_util_pct"], t["hmma_util_pct"], t["dram_bw_util_pct"]) == (60.0, 55.0, 50.0)
    assert t["gbps_peak_theoretical"] == pytest.approx(H200_PEAK_GBPS)
    assert t["gbps_nvml"] == pytest.approx(0.5 * H200_PEAK_GBPS)
    per_call = t["gbps_nvml"] * 1e9 * t["window_s"] / t["calls"]
    assert t["bytes_nvml_per_call"] == pytest.approx(per_call)
    assert t["bytes_ratio_measured_to_model"] == pytest.approx(per_call / 1e6)
    # The fake's energy counter advances 1000 mJ per read: 1 J over the window.
    assert t["energy_j_per_call"] == pytest.approx(1.0 / t["calls"])
    assert t["power_w_mean"] == pytest.approx(1.0 / t["window_s"])
    assert t["power_from"] == "energy_counter"
    assert t["sm_clock_mhz_min"] == t["sm_clock_mhz_mean"] == 1980
    assert t["mem_clock_mhz_mean"] == 3201 and t["temperature_c_max"] == 55
    assert t["throttle_reasons"] == [] and t["nvml_mem_used_bytes_peak"] == 10 * 2**30
    assert t["polls"] >= 2
    assert fake.samples_freed == 2  # both GPM sample buffers returned
    json.dumps(t, allow_nan=False)  # goes into results.json as it is


# --- degrade paths ------------------------------------------------------------------------


def test_pynvml_absent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml → ImportError
    s = TelemetrySession.from_uuid(UUID, config=WINDOW)
    assert not s.available and "not installed" in s.reason
    call = Counter()
    assert s.measure(call, None, per_call_s=0.001, bytes_model=1.0) == {
        "available": False,
        "reason": s.reason,
    }
    assert call.calls == 0  # no window without telemetry
    assert s.calibrate("cpu")["available"] is False


def test_driver_not_loaded_and_unknown_gpu() -> None:
    s = session(FakeNvml(init_error=DRIVER_NOT_LOADED))
    assert not s.available and s.reason == "NVML cannot start: Driver Not Loaded"
    other = TelemetrySession.from_uuid("GPU-" + "0" * 8 + "-0000-0000-0000-" + "0" * 12,
                                       lib=FakeNvml(), config=WINDOW)  # fmt: skip
    assert not other.available and "NVML has no device" in other.reason


def test_gpm_unsupported_keeps_the_other_readings() -> None:
    t, _, _ = measure(session(FakeNvml(gpm_supported=False)))
    for name in ("dram_bw_util_pct", "sm_util_pct", "sm_occupancy_pct", "tensor_util_pct",
                 "hmma_util_pct"):  # fmt: skip
        assert t[name] is None
        assert "GPM is not supported" in t["unavailable"][name]
    assert t["gbps_nvml"] is None and t["bytes_ratio_measured_to_model"] is None
    assert "gbps_nvml" in t["unavailable"]
    assert t["energy_j_per_call"] is not None and t["sm_clock_mhz_mean"] == 1980


def test_one_gpm_metric_failing() -> None:
    fake = FakeNvml()
    fake.gpm_values[7] = NOT_SUPPORTED
    t, _, _ = measure(session(fake))
    assert t["hmma_util_pct"] is None
    assert "Not Supported" in t["unavailable"]["hmma_util_pct"]
    assert t["tensor_util_pct"] == 60.0 and t["gbps_nvml"] is not None
    assert set(t["unavailable"]) == {"hmma_util_pct"}


def test_gpm_sampling_failing_mid_window() -> None:
    fake = FakeNvml(failing={"gpm_metrics": NOT_SUPPORTED})
    t, _, _ = measure(session(fake))
    assert t["available"] and t["dram_bw_util_pct"] is None
    assert "GPM metrics: Not Supported" in t["unavailable"]["dram_bw_util_pct"]
    assert fake.samples_freed == 2


def test_readings_failing() -> None:
    t, _, _ = measure(session(FakeNvml(failing={"energy": NOT_SUPPORTED})))
    assert t["energy_j_per_call"] is None
    assert "Not Supported" in t["unavailable"]["energy_j_per_call"]
    assert t["power_w_mean"] == 500.0 and t["power_from"] == "power_usage_polls"

    t, _, _ = measure(session(FakeNvml(failing={"energy": 3, "power": 3, "clock": 3})))
    assert t["power_w_mean"] is None and "power_w" in t["unavailable"]["power_w_mean"]
    assert t["sm_clock_mhz_mean"] is None and t["sm_clock_mhz_min"] is None
    assert "sm_clock_mhz" in t["unavailable"] and "mem_clock_mhz" in t["unavailable"]
    assert t["warnings"] == []  # no clock reading: no clock warning either

    t, _, _ = measure(session(FakeNvml(failing={"bus_width": NOT_SUPPORTED})))
    assert t["gbps_peak_theoretical"] is None and t["gbps_nvml"] is None
    assert t["dram_bw_util_pct"] == 50.0  # the utilisation itself is still a reading
    assert "memory bus width" in t["unavailable"]["gbps_peak_theoretical"]


def test_an_exception_in_the_window_is_recorded_not_raised() -> None:
    fake = FakeNvml()

    def broken() -> None:
        raise RuntimeError("kernel exploded")

    t = session(fake).measure(broken, None, per_call_s=0.001, bytes_model=1.0)
    assert t == {"available": False, "reason": "telemetry failed: RuntimeError: kernel exploded"}
    assert fake.samples_freed == 1  # the first GPM sample is not leaked


def test_throttling_and_low_clock_warn() -> None:
    t, _, _ = measure(session(FakeNvml(clock_event_bits=0x1 | 0x4, sm_clock_mhz=1500)))
    assert t["throttle_reasons"] == ["gpu_idle", "sw_power_cap"]
    assert t["warnings"] == [
        "clocks throttled: sw_power_cap",  # idle is not throttling
        "SM clock mean 1500 MHz is below 90% of its max 1980 MHz",
    ]
    t, _, _ = measure(session(FakeNvml(clock_event_bits=0x1, sm_clock_mhz=1800)))
    assert t["warnings"] == []  # 1800 / 1980 = 91%


def test_calibration_copy_compares_bytes_per_second_with_nvml() -> None:
    cal = session().calibrate("cpu", nbytes=1 << 20)
    assert cal["available"] and cal["copy_bytes"] == 1 << 20
    assert cal["gbps_copy"] == pytest.approx(2 * (1 << 20) * cal["calls"] / cal["window_s"] / 1e9)
    assert cal["gbps_nvml"] == pytest.approx(0.5 * H200_PEAK_GBPS)
    assert cal["ratio_nvml_to_copy"] == pytest.approx(cal["gbps_nvml"] / cal["gbps_copy"])


def test_case_telemetry_models_bytes_of_what_the_window_ran() -> None:
    case = Case("naive", "bwd", "fp16", 1, 2, 2, 64, 64, 32, False)
    s = session()
    t = case_telemetry(s, case, Counter(0.001), None, median_ms=1.0, derived=True)
    assert t["window_covers"] == "fwd_bwd"
    assert t["bytes_model"] == models.forward_bytes(case) + models.backward_bytes(case)
    t = case_telemetry(s, case, Counter(0.001), None, median_ms=1.0, derived=False)
    assert t["window_covers"] == "bwd" and t["bytes_model"] == models.backward_bytes(case)
    assert case_telemetry(None, case, Counter(), None, median_ms=1.0, derived=False)[
        "available"
    ] is False  # fmt: skip


def test_sessions_for_cpu_and_disabled() -> None:
    assert open_session(torch.device("cpu")).reason == "no NVIDIA GPU: this run uses the CPU"
    assert open_session(torch.device("cpu"), enabled=False).reason == DISABLED


# --- what the user sees -------------------------------------------------------------------


def test_env_panel_and_progress_warning() -> None:
    described = {"index": 0, **session(FakeNvml(gpm_supported=False)).describe()}
    console = Console(record=True, width=160)
    console.print(support_table([described, {"index": 1, "available": False, "reason": "why"}]))
    text = console.export_text()
    assert "GPM is not supported" in text and "power_w: ok" in text and "4814 GB/s" in text
    assert "unavailable" in text and "why" in text

    case = Case("naive", "fwd", "fp32", 1, 1, 1, 16, 16, 16, False)
    telemetry = {"available": True, "warnings": ["clocks throttled"]}
    record = CaseRecord.for_case(case, "cpu", Status.OK, telemetry=telemetry)
    console = Console(record=True, width=160)
    with RunProgress(console, total=1) as progress:
        progress("done", case, record)
    text = console.export_text()
    assert "telemetry naive fwd" in text and "clocks throttled" in text


def test_env_command_shows_telemetry() -> None:
    result = CliRunner().invoke(app, ["env"])
    assert result.exit_code == 0
    assert "telemetry (NVML)" in result.output


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU path")
@pytest.mark.parametrize("flag", ["--telemetry", "--no-telemetry"])
def test_cpu_run_records_telemetry_unavailable(tmp_path: Path, tiny_suite, flag: str) -> None:
    suite = tiny_suite(["sdpa-math"], seqlens=[16])
    out = tmp_path / "out"
    result = CliRunner().invoke(
        app, ["run", "-s", str(suite), "--device", "cpu", "--out", str(out), flag, *FAST]
    )
    assert result.exit_code == 0, result.output
    doc = load_results(out)
    reason = DISABLED if flag == "--no-telemetry" else "no NVIDIA GPU: this run uses the CPU"
    for case in doc.cases:
        assert case.status == "ok"
        assert case.telemetry == {"available": False, "reason": reason}
    assert doc.env["telemetry"]["available"] is False
    assert doc.env["telemetry"]["calibration"] == {"available": False, "reason": reason}


# --- on the GPU ---------------------------------------------------------------------------


@pytest.mark.gpu
@needs_cuda
def test_gpu_copy_bandwidth_agrees_with_nvml() -> None:
    device = torch.device("cuda:0")
    s = open_session(device)
    assert s.available, s.reason
    cal = s.calibrate(device)
    assert cal["available"], cal
    assert cal["gbps_nvml"] == pytest.approx(cal["gbps_copy"], rel=0.10), cal


@pytest.mark.gpu
@needs_cuda
def test_gpu_naive_moves_more_bytes_than_flash() -> None:
    from fa_bench import registry
    from fa_bench.run.execute import ExecOptions, run_case
    from fa_bench.run.timing import TimingConfig

    registry.load()
    device = torch.device("cuda:0")
    opts = ExecOptions(timing=TimingConfig(max_time_s=0.5), telemetry=open_session(device))
    ratios = {}
    for impl in ("naive", "sdpa-flash"):
        case = Case(impl, "fwd", "bf16", 2, 16, 16, 8192, 8192, 128, False)
        record = run_case(case, device, opts)
        assert record.status == "ok", record.error
        t = record.telemetry
        assert t is not None and t["available"] and t["gbps_nvml"], t
        ratios[impl] = t["bytes_ratio_measured_to_model"]
        assert record.timing is not None
        clock = record.timing["sm_clock_mhz"]  # read while the latency samples ran
        assert clock["n"] >= 1 and 0 < clock["min"] <= clock["mean"] <= clock["max"], clock
    # naive writes and reads the N×N scores and probabilities; flash keeps them on chip.
    assert ratios["naive"] > ratios["sdpa-flash"], ratios


def test_results_validate_the_telemetry_object() -> None:
    from fa_bench.results.record import ResultsDoc, ResultsError

    case = Case("naive", "fwd", "fp32", 1, 1, 1, 16, 16, 16, False)

    def check(telemetry: dict | None) -> None:
        record = CaseRecord.for_case(case, "cpu", Status.OK, telemetry=telemetry)
        ResultsDoc.from_json(ResultsDoc({}, {}, [record]).to_json())

    for good in (None, {"available": False, "reason": "no GPU"}):
        check(good)
    with pytest.raises(ResultsError, match="telemetry"):
        check({"gbps_nvml": 1.0})
