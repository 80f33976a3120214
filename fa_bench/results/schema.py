"""Type checks for the fields of a results file, each error naming the field.

`record.py` reads results.json, journals and report pages through these: a value of the
wrong type (a latency as a string, an implementation as a number, a suite list as a
string) is a `ResultsError` naming the file, the case and the field, never a traceback
later in the report or in `compare`. JSON's own extremes are refused too: NaN and
infinity (Python's json reads them; fa-bench never writes them) and integers too large
for any counter or size (a float of them overflows).
"""

from __future__ import annotations

import json
import math
from typing import Any

from fa_bench.errors import UsageError

MAX_INT = 2**63 - 1  # the largest size or count any field can mean
_MISSING = object()


class ResultsError(UsageError, ValueError):
    """A results file (or record) that is unreadable or not of this schema; the message
    names the file, the case and the field."""


def show(value: object) -> str:
    """A value as an error message quotes it: its JSON type and a short repr."""
    kinds = {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
             list: "a list", dict: "an object", type(None): "null"}  # fmt: skip
    kind = kinds.get(type(value), "a value")
    text = repr(value)
    return kind if value is None else f"{kind} ({text[:57] + '...' if len(text) > 60 else text})"


def _fail(where: str, key: str, want: str, value: object) -> ResultsError:
    return ResultsError(f"{where}: {key} must be {want}, got {show(value)}")


def is_number(value: object) -> bool:
    """A finite JSON number that fits a float (not a boolean)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return math.isfinite(value) if isinstance(value, float) else abs(value) <= MAX_INT


def number(
    d: dict, key: str, where: str, *, null: bool = True, default: Any = _MISSING,
    nonneg: bool = False,
) -> Any:  # fmt: skip
    """d[key] as a finite number (not below 0 when `nonneg`: a time, a size, a rate; None
    allowed when `null`); a missing key is `default`."""
    value = d.get(key) if default is not _MISSING else d[key]
    if value is None and null:
        return None
    if not is_number(value) or (nonneg and isinstance(value, (int, float)) and value < 0):
        want = "a finite number" + (" ≥ 0" if nonneg else "") + (" or null" if null else "")
        return _raise(where, key, want, value)
    return value


def integer(d: dict, key: str, where: str, *, null: bool = True, default: Any = _MISSING) -> Any:
    value = d.get(key) if default is not _MISSING else d[key]
    if value is None and null:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or abs(value) > MAX_INT:
        return _raise(where, key, "an integer" + (" or null" if null else ""), value)
    return value


def string(d: dict, key: str, where: str, *, null: bool = True, default: Any = _MISSING) -> Any:
    value = d.get(key) if default is not _MISSING else d[key]
    if value is None and null:
        return None
    if not isinstance(value, str):
        return _raise(where, key, "a string" + (" or null" if null else ""), value)
    return value


def obj(d: dict, key: str, where: str, *, default: Any = _MISSING) -> dict | None:
    """d[key] as an object or null."""
    value = d.get(key) if default is not _MISSING else d[key]
    if value is not None and not isinstance(value, dict):
        return _raise(where, key, "an object or null", value)
    return value


def number_list(d: dict, key: str, where: str) -> list:
    """d[key] as a list of finite numbers; the error names the first bad element."""
    value = d[key]
    if not isinstance(value, list):
        return _raise(where, key, "a list of numbers", value)
    if _all_finite_floats(value):  # the common case, without a call per sample
        return value
    for i, item in enumerate(value):
        if not is_number(item):
            return _raise(where, f"{key}[{i}]", "a finite number", item)
    return value


def _all_finite_floats(values: list) -> bool:
    if not all(type(v) is float for v in values):
        return False
    try:
        return math.isfinite(math.fsum(values))  # NaN or infinity anywhere: not finite
    except OverflowError:  # finite values whose sum overflows: check one by one
        return False


def object_list(d: dict, key: str, where: str) -> None:
    """d[key], when present and not null, as a list of objects (run.suites, env.gpus)."""
    value = d.get(key)
    if value is None:
        return
    if not isinstance(value, list):
        _raise(where, key, "a list of objects or null", value)
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            _raise(where, f"{key}[{i}]", "an object", item)


def _raise(where: str, key: str, want: str, value: object) -> Any:
    raise _fail(where, key, want, value)


# Telemetry figures the report draws and formats as numbers, and its lists of warnings.
TELEMETRY_NUMBERS = ("gbps_nvml", "dram_bw_util_pct", "sm_clock_mhz_mean", "sm_clock_mhz_max",
                     "power_w_mean", "energy_j_per_call")  # fmt: skip


def check_telemetry(tel: dict, where: str) -> None:
    """A case's telemetry object: its figures numbers, its warnings a list of strings."""
    at = where + ": telemetry"
    for key in TELEMETRY_NUMBERS:
        number(tel, key, at, default=None)
    for key in ("warnings", "throttle_reasons"):
        value = tel.get(key)
        if value is None or isinstance(value, str):
            continue
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            _raise(at, key, "a list of strings or null", value)


def check_timing(timing: dict, where: str) -> None:
    """The SM clock `compare` reads from how a case was timed."""
    clock = obj(timing, "sm_clock_mhz", where + ": timing", default=None)
    if clock is not None:
        number(clock, "mean", where + ": timing.sm_clock_mhz", default=None, nonneg=True)


def check_run(run: dict, where: str) -> None:
    """The run object's keys that the report and `compare` read."""
    object_list(run, "suites", where + ": run")
    for i, suite in enumerate(run.get("suites") or []):
        string(suite, "name", f"{where}: run.suites[{i}]", null=False, default=None)
        string(suite, "description", f"{where}: run.suites[{i}]", default=None)
    for key in ("argv", "resumed"):
        value = run.get(key)
        if value is not None and not isinstance(value, list):
            _raise(where + ": run", key, "a list or null", value)
    obj(run, "options", where + ": run", default=None)
    string(run, "device", where + ": run", default=None)


def check_env(env: dict, where: str) -> None:
    """The env object's keys that the report and `compare` read."""
    object_list(env, "gpus", where + ": env")
    obj(env, "telemetry", where + ": env", default=None)
    for key in ("gpu_name", "hostname"):
        string(env, key, where + ": env", default=None)
    for i, gpu in enumerate(env.get("gpus") or []):
        string(gpu, "name", f"{where}: env.gpus[{i}]", default=None)
        number(gpu, "memory_bytes", f"{where}: env.gpus[{i}]", default=None)


def parse_json(text: str, source: str) -> object:
    """json.loads, with its other failures as ResultsError too: nesting deeper than the
    parser's recursion limit, an integer of more digits than Python converts."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ResultsError(f"{source}: not valid JSON: {exc}") from None
    except RecursionError:
        raise ResultsError(f"{source}: not readable: JSON nested too deeply") from None
    except ValueError as exc:  # e.g. "Exceeds the limit (4300 digits) for integer string"
        raise ResultsError(f"{source}: not readable: {exc}") from None
