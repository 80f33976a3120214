"""A thin wrapper over NVML (pynvml, package nvidia-ml-py): one device, its GPM metrics, its
instantaneous readings and a thread that polls them, and the decoding of clock-event
("throttle") bits.

Every failure is an `NvmlUnavailable` with a reason a reader can act on; callers turn it into
a recorded "unavailable: <reason>", never a zero. The pynvml module is passed in (`lib`), so
tests drive every degrade path with a fake module and no driver.
"""

from __future__ import annotations

import importlib
import threading
import uuid as uuid_mod
from collections.abc import Callable
from types import ModuleType
from typing import TypeVar

_T = TypeVar("_T")

# GPM metric ids (nvml.h, NVML_GPM_METRIC_*): the field names carry their unit, % of the
# metric's own peak over the sampling window.
GPM_METRICS: dict[str, int] = {
    "sm_util_pct": 2,
    "sm_occupancy_pct": 3,
    "tensor_util_pct": 5,  # any tensor-core pipe
    "hmma_util_pct": 7,  # fp16/bf16 tensor-core pipe
    "dram_bw_util_pct": 10,  # % of the theoretical HBM bandwidth
}

# nvmlClocksEventReason* bits (older name: ClocksThrottleReason*), decoded to names.
CLOCK_EVENT_BITS: dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
    0x200: "board_limit",
    0x400: "reliability",
}
# The bits that mean the clocks were held down by power, heat or the board; idle, sync
# boost and the settings bits are not a slowdown of a running kernel.
THROTTLING = frozenset(
    {"sw_power_cap", "hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown",
     "hw_power_brake_slowdown", "board_limit", "reliability"}
)  # fmt: skip


class NvmlUnavailable(Exception):
    """NVML, a device, or one reading cannot be had; the message says why."""


def decode_clock_events(bits: int) -> list[str]:
    """Names of the set clock-event bits, lowest first; unknown bits keep their value."""
    names = [name for bit, name in sorted(CLOCK_EVENT_BITS.items()) if bits & bit]
    unknown = bits & ~sum(CLOCK_EVENT_BITS)
    if unknown:
        names.append(f"unknown_{unknown:#x}")
    return names


def peak_bandwidth_gbps(mem_clock_mhz: float, bus_width_bits: int) -> float:
    """Theoretical DRAM bandwidth: HBM moves data on both clock edges (×2), bus width in
    bytes. H200: 3201 MHz × 2 × 6016 bit / 8 = 4814 GB/s (the datasheet's 4.8 TB/s)."""
    return mem_clock_mhz * 1e6 * 2 * bus_width_bits / 8 / 1e9


def gbps_from_util(dram_bw_util_pct: float, peak_gbps: float) -> float:
    """Achieved bandwidth implied by GPM's DRAM_BW_UTIL (% of theoretical)."""
    return dram_bw_util_pct / 100.0 * peak_gbps


def normalize_uuid(value: object) -> str:
    """NVML spells a GPU uuid 'GPU-xxxxxxxx-…'; torch gives that, a bare uuid or a UUID."""
    text = str(value).strip()
    if text.startswith(("GPU-", "MIG-")):
        return text
    try:
        return "GPU-" + str(uuid_mod.UUID(text))
    except ValueError:
        raise NvmlUnavailable(f"cannot read GPU uuid {text!r}") from None


def load_library(lib: ModuleType | None = None) -> ModuleType:
    """The pynvml module, initialised. Raises NvmlUnavailable (not installed, no driver)."""
    if lib is None:
        try:
            lib = importlib.import_module("pynvml")
        except ImportError:
            raise NvmlUnavailable("nvidia-ml-py (pynvml) is not installed") from None
    try:
        lib.nvmlInit()
    except lib.NVMLError as exc:
        raise NvmlUnavailable(f"NVML cannot start: {exc}") from None
    return lib


class NvmlDevice:
    """One GPU through NVML. Readings raise NvmlUnavailable with the reason."""

    def __init__(self, lib: ModuleType, handle: object) -> None:
        self.lib = lib
        self.handle = handle

    @classmethod
    def by_uuid(cls, lib: ModuleType, uuid: object) -> NvmlDevice:
        # NVML indices ignore CUDA_VISIBLE_DEVICES; the uuid names the same card in both.
        key = normalize_uuid(uuid)
        try:
            return cls(lib, lib.nvmlDeviceGetHandleByUUID(key.encode()))
        except lib.NVMLError as exc:
            raise NvmlUnavailable(f"NVML has no device {key}: {exc}") from None

    def _call(self, what: str, fn: Callable[[], _T]) -> _T:
        try:
            return fn()
        except self.lib.NVMLError as exc:
            raise NvmlUnavailable(f"{what}: {exc}") from None
        except AttributeError:
            raise NvmlUnavailable(f"{what}: this nvidia-ml-py has no such call") from None

    def probes(self) -> dict[str, Callable[[], float]]:
        """Readings polled during a window, each raising NvmlUnavailable with its reason."""
        return {name: self._probe(name, fn) for name, fn in self._raw_probes().items()}

    def _probe(self, name: str, fn: Callable[[], float]) -> Callable[[], float]:
        return lambda: self._call(name, fn)

    def _raw_probes(self) -> dict[str, Callable[[], float]]:
        # Units in the names; NVML's mW are converted here.
        lib, h = self.lib, self.handle
        return {
            "sm_clock_mhz": lambda: lib.nvmlDeviceGetClockInfo(h, lib.NVML_CLOCK_SM),
            "mem_clock_mhz": lambda: lib.nvmlDeviceGetClockInfo(h, lib.NVML_CLOCK_MEM),
            "power_w": lambda: lib.nvmlDeviceGetPowerUsage(h) / 1e3,
            "temperature_c": lambda: lib.nvmlDeviceGetTemperature(h, lib.NVML_TEMPERATURE_GPU),
            "clock_event_bits": self._clock_event_bits,
            "mem_used_bytes": lambda: lib.nvmlDeviceGetMemoryInfo(h).used,
        }

    def read(self, name: str) -> float:
        return self._call(name, self._raw_probes()[name])

    def _clock_event_bits(self) -> int:
        # The "Event" name replaced "Throttle" in newer pynvml; older ones have only the latter.
        fn = getattr(self.lib, "nvmlDeviceGetCurrentClocksEventReasons", None)
        fn = fn or self.lib.nvmlDeviceGetCurrentClocksThrottleReasons
        return int(fn(self.handle))

    def energy_mj(self) -> int:
        """The total-energy counter (mJ since the driver loaded)."""
        return self._call(
            "total energy counter",
            lambda: self.lib.nvmlDeviceGetTotalEnergyConsumption(self.handle),
        )

    def sm_clock_max_mhz(self) -> float:
        return self._call(
            "max SM clock",
            lambda: self.lib.nvmlDeviceGetMaxClockInfo(self.handle, self.lib.NVML_CLOCK_SM),
        )

    def peak_bandwidth_gbps(self) -> float:
        lib, h = self.lib, self.handle
        clock = self._call(
            "max memory clock", lambda: lib.nvmlDeviceGetMaxClockInfo(h, lib.NVML_CLOCK_MEM)
        )
        width = self._call("memory bus width", lambda: lib.nvmlDeviceGetMemoryBusWidth(h))
        if not clock or not width:
            raise NvmlUnavailable(f"memory clock {clock} MHz / bus width {width} bit reported")
        return peak_bandwidth_gbps(clock, width)

    # GPM (GPU performance monitoring, Hopper and later): counters between two samples.
    def gpm_check(self) -> None:
        """Raise NvmlUnavailable when GPM does not work on this device."""
        support = self._call(
            "GPM support query", lambda: self.lib.nvmlGpmQueryDeviceSupport(self.handle)
        )
        if not getattr(support, "isSupportedDevice", 0):
            raise NvmlUnavailable("GPM is not supported on this GPU (needs Hopper or newer)")

    def gpm_sample(self) -> object:
        lib = self.lib
        sample = self._call("GPM sample alloc", lib.nvmlGpmSampleAlloc)
        try:
            self._call("GPM sample", lambda: lib.nvmlGpmSampleGet(self.handle, sample))
        except NvmlUnavailable:
            self.gpm_free(sample)
            raise
        return sample

    def gpm_free(self, sample: object) -> None:
        try:
            self.lib.nvmlGpmSampleFree(sample)
        except self.lib.NVMLError:
            pass  # a leaked sample buffer is harmless; the reading is what matters

    def gpm_metrics(self, first: object, second: object) -> dict[str, float | NvmlUnavailable]:
        """Each GPM metric between two samples, or why that one metric failed."""
        lib = self.lib
        request = lib.c_nvmlGpmMetricsGet_t()
        request.version = lib.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(GPM_METRICS)
        request.sample1, request.sample2 = first, second
        for i, metric_id in enumerate(GPM_METRICS.values()):
            request.metrics[i].metricId = metric_id
        self._call("GPM metrics", lambda: lib.nvmlGpmMetricsGet(request))
        out: dict[str, float | NvmlUnavailable] = {}
        for i, name in enumerate(GPM_METRICS):
            m = request.metrics[i]
            if m.nvmlReturn != 0:  # NVML_SUCCESS
                out[name] = NvmlUnavailable(
                    f"GPM metric {m.metricId}: {lib.NVMLError(m.nvmlReturn)}"
                )
            else:
                out[name] = float(m.value)
        return out


class Poller(threading.Thread):
    """Polls NVML readings every `poll_s` until stopped. Only inside the window: a poll
    before the first call or after the final synchronisation would see an idle GPU (the
    gpu_idle bit, idle clocks). A reading that fails once is dropped with its reason rather
    than kept with holes, so no average mixes in a missing value."""

    def __init__(self, probes: dict[str, Callable[[], float]], poll_s: float) -> None:
        super().__init__(daemon=True)
        self.probes = dict(probes)
        self.poll_s = poll_s
        self.values: dict[str, list[float]] = {name: [] for name in probes}
        self.failed: dict[str, str] = {}
        self._stop_event = threading.Event()

    def poll(self) -> None:
        for name, read in list(self.probes.items()):
            try:
                self.values[name].append(read())
            except NvmlUnavailable as exc:
                self.failed[name] = str(exc)
                self.values.pop(name, None)
                self.probes.pop(name)

    def run(self) -> None:
        while not self._stop_event.wait(self.poll_s):
            self.poll()

    def finish(self) -> None:
        self._stop_event.set()
        if self.ident is not None:  # started
            self.join()
        if any(not v for v in self.values.values()):
            self.poll()  # the thread never got a turn: one late reading beats none
