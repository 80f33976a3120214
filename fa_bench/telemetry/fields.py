"""Telemetry readings → the fields of a case's `telemetry` object (units in the names),
and the warnings a reader should see. Pure functions over what fa_bench.telemetry.session read."""

from __future__ import annotations

import statistics

from fa_bench.telemetry.nvml import THROTTLING, decode_clock_events, gbps_from_util


def telemetry_warnings(t: dict, sm_clock_fraction: float = 0.9) -> list[str]:
    """Throttling seen in the window, and a mean SM clock below a fraction of its max (the
    mean, not the minimum: one poll at a clock step should not flag a whole case)."""
    warnings = []
    throttled = [r for r in t.get("throttle_reasons") or [] if r in THROTTLING]
    if throttled:
        warnings.append("clocks throttled: " + ", ".join(throttled))
    mean, top = t.get("sm_clock_mhz_mean"), t.get("sm_clock_mhz_max")
    if mean is not None and top and mean < sm_clock_fraction * top:
        warnings.append(
            f"SM clock mean {mean:.0f} MHz is below {sm_clock_fraction:.0%} "
            f"of its max {top:.0f} MHz"
        )
    return warnings


def bandwidth_fields(
    out: dict, peak: float | str | None, bytes_model: float | None, unavailable: dict[str, str]
) -> None:
    """GB/s from DRAM utilisation × theoretical peak; bytes per call from GB/s × the window's
    own time per call (the latency median was taken with a flushed L2 and without the
    window's gaps, so dividing by it would mix two conditions)."""
    out["gbps_peak_theoretical"] = number(peak)
    if isinstance(peak, str):
        unavailable["gbps_peak_theoretical"] = peak
    util = out.get("dram_bw_util_pct")
    peak_gbps = number(peak)
    gbps = gbps_from_util(util, peak_gbps) if util is not None and peak_gbps else None
    out["gbps_nvml"] = gbps
    if gbps is None:
        unavailable["gbps_nvml"] = "needs dram_bw_util_pct and gbps_peak_theoretical"
    per_call = gbps * 1e9 * out["window_s"] / out["calls"] if gbps is not None else None
    out["bytes_nvml_per_call"] = per_call
    out["bytes_model"] = bytes_model
    ratio = per_call / bytes_model if per_call is not None and bytes_model else None
    out["bytes_ratio_measured_to_model"] = ratio


def reading_fields(
    out: dict, values: dict[str, list[float]], failed: dict[str, str], unavailable: dict[str, str]
) -> None:
    """Clocks (min/mean), peak temperature, clock-event reasons seen, peak memory in use."""
    v = values
    for key, name in (("sm_clock_mhz", "sm_clock_mhz"), ("mem_clock_mhz", "mem_clock_mhz")):
        vals = v.get(name)
        out[f"{key}_min"] = min(vals) if vals else None
        out[f"{key}_mean"] = statistics.fmean(vals) if vals else None
    out["temperature_c_max"] = max(v["temperature_c"]) if v.get("temperature_c") else None
    bits = v.get("clock_event_bits")
    seen = 0
    for b in bits or ():
        seen |= int(b)
    out["throttle_reasons"] = decode_clock_events(seen) if bits else None
    used = v.get("mem_used_bytes")
    out["nvml_mem_used_bytes_peak"] = int(max(used)) if used else None
    out["polls"] = max((len(x) for x in v.values()), default=0)
    renamed = {
        "temperature_c": "temperature_c_max",
        "clock_event_bits": "throttle_reasons",
        "mem_used_bytes": "nvml_mem_used_bytes_peak",
    }
    for name, why in failed.items():
        unavailable[renamed.get(name, name)] = why


def energy_fields(
    out: dict,
    e0: float | str,
    e1: float | str,
    window_s: float,
    calls: float,  # the calls the counter's span covers, pro rata: may be fractional
    values: dict[str, list[float]],
    failed: dict[str, str],
    unavailable: dict[str, str],
) -> None:
    """Energy from the total-energy counter; mean power from it too, since NVML's power
    reading is a 1 s running average on Hopper. Without the counter: the polled power."""
    if isinstance(e0, str) or isinstance(e1, str):
        out["energy_j_per_call"] = None
        unavailable["energy_j_per_call"] = e0 if isinstance(e0, str) else str(e1)
        power = values.get("power_w")
        out["power_w_mean"] = statistics.fmean(power) if power else None
        out["power_from"] = "power_usage_polls" if power else None
        if not power:
            unavailable["power_w_mean"] = failed.get("power_w", "no power reading")
        return
    joules = (e1 - e0) / 1e3
    out["energy_j_per_call"] = joules / calls
    out["power_w_mean"] = joules / window_s
    out["power_from"] = "energy_counter"


def number(value: object) -> float | None:
    """A reading that is a number, else None (a string here is the reason it is missing)."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
