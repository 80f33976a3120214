"""A stand-in for the pynvml module: the calls fa_bench.telemetry.nvml makes, with knobs to make any
of them fail the way the real library does (an NVMLError carrying an NVML return code)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import ClassVar

NOT_SUPPORTED = 3
DRIVER_NOT_LOADED = 9
UUID = "GPU-12345678-1234-1234-1234-123456789abc"


class NVMLError(Exception):
    _names: ClassVar[dict[int, str]] = {
        NOT_SUPPORTED: "Not Supported",
        DRIVER_NOT_LOADED: "Driver Not Loaded",
    }

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return self._names.get(self.value, f"NVML error {self.value}")


class MetricsGet:
    """c_nvmlGpmMetricsGet_t: fields set by the caller, values filled by nvmlGpmMetricsGet."""

    def __init__(self) -> None:
        self.version = self.numMetrics = 0
        self.sample1 = self.sample2 = None
        self.metrics = [SimpleNamespace(metricId=0, nvmlReturn=0, value=0.0) for _ in range(16)]


class FakeNvml:
    NVMLError = NVMLError
    NVML_CLOCK_SM = 1
    NVML_CLOCK_MEM = 2
    NVML_TEMPERATURE_GPU = 0
    NVML_GPM_METRICS_GET_VERSION = 1
    c_nvmlGpmMetricsGet_t = MetricsGet

    def __init__(self, **overrides: object) -> None:
        self.init_error: int | None = None
        self.gpm_supported = True
        # GPM metric id → percent, or an NVML return code (int) for "this metric failed".
        self.gpm_values: dict[int, float | int] = {2: 80.0, 3: 40.0, 5: 60.0, 7: 55.0, 10: 50.0}
        self.failing: dict[str, int] = {}  # call name → NVML error code it raises
        self.sm_clock_mhz, self.sm_clock_max_mhz = 1980, 1980
        self.mem_clock_mhz, self.bus_width_bits = 3201, 6016
        self.power_mw, self.temperature_c = 500_000, 55
        self.clock_event_bits = 0
        self.mem_used_bytes = 10 * 2**30
        self.energy_step_mj = 1000  # the energy counter advances this much per read
        self._energy_mj = 0
        self.samples_freed = 0
        self.init_calls = 0
        for key, value in overrides.items():
            setattr(self, key, value)

    def _maybe_fail(self, name: str) -> None:
        if name in self.failing:
            raise NVMLError(self.failing[name])

    def nvmlInit(self) -> None:
        self.init_calls += 1
        if self.init_error is not None:
            raise NVMLError(self.init_error)

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetHandleByUUID(self, uuid: bytes) -> str:
        if uuid.decode() != UUID:
            raise NVMLError(13)
        return "handle0"

    def nvmlDeviceGetClockInfo(self, h: str, kind: int) -> int:
        self._maybe_fail("clock")
        return self.sm_clock_mhz if kind == self.NVML_CLOCK_SM else self.mem_clock_mhz

    def nvmlDeviceGetMaxClockInfo(self, h: str, kind: int) -> int:
        self._maybe_fail("max_clock")
        return self.sm_clock_max_mhz if kind == self.NVML_CLOCK_SM else self.mem_clock_mhz

    def nvmlDeviceGetMemoryBusWidth(self, h: str) -> int:
        self._maybe_fail("bus_width")
        return self.bus_width_bits

    def nvmlDeviceGetPowerUsage(self, h: str) -> int:
        self._maybe_fail("power")
        return self.power_mw

    def nvmlDeviceGetTemperature(self, h: str, sensor: int) -> int:
        self._maybe_fail("temperature")
        return self.temperature_c

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: str) -> int:
        self._maybe_fail("clock_events")
        return self.clock_event_bits

    def nvmlDeviceGetMemoryInfo(self, h: str) -> SimpleNamespace:
        self._maybe_fail("memory")
        return SimpleNamespace(used=self.mem_used_bytes, total=141 * 2**30)

    def nvmlDeviceGetTotalEnergyConsumption(self, h: str) -> int:
        self._maybe_fail("energy")
        self._energy_mj += self.energy_step_mj
        return self._energy_mj

    def nvmlGpmQueryDeviceSupport(self, h: str) -> SimpleNamespace:
        self._maybe_fail("gpm_query")
        return SimpleNamespace(isSupportedDevice=int(self.gpm_supported))

    def nvmlGpmSampleAlloc(self) -> object:
        return object()

    def nvmlGpmSampleGet(self, h: str, sample: object) -> object:
        self._maybe_fail("gpm_sample")
        return sample

    def nvmlGpmSampleFree(self, sample: object) -> None:
        self.samples_freed += 1

    def nvmlGpmMetricsGet(self, request: MetricsGet) -> MetricsGet:
        self._maybe_fail("gpm_metrics")
        for m in request.metrics[: request.numMetrics]:
            value = self.gpm_values.get(m.metricId, NOT_SUPPORTED)
            if isinstance(value, float):
                m.value, m.nvmlReturn = value, 0
            else:
                m.value, m.nvmlReturn = 0.0, value
        return request
