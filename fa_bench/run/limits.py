"""What a run is checked against before its first case: where it writes, how big its
cases are, how many there are and about how long they take.

Each check raises a `LimitError` (a `UsageError`: exit 2) naming the flag or the case,
so a run that cannot work stops here instead of as a traceback or a column of `error`s.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

from fa_bench.case import Case, Mode
from fa_bench.errors import UsageError
from fa_bench.run.timing import TimingConfig

# Past this many cases a run or sweep is refused unless --max-cases raises the limit:
# 10^4 cases take hours on a GPU, and a typo in an axis can make 10^6.
DEFAULT_MAX_CASES = 10_000
# Per case, on top of warm-up and timing: the worker's hand-off, preparation and the
# accuracy check (about 0.5 s for the standard grid on the H200), and the >= 1 s NVML
# window when telemetry is on.
CASE_OVERHEAD_S = 0.5
TELEMETRY_WINDOW_S = 1.0
# Once per run: starting the worker (importing torch, opening NVML), a few seconds.
WORKER_START_S = 5.0


class LimitError(UsageError):
    """An output folder, case size or case count that cannot run (exit 2)."""


# --------------------------------------------------------------------------- output folder


def check_out_dir(path: Path, flag: str = "--out") -> None:
    """Make sure `path` is, or can become, a folder this process can write; creates it.

    Refused: an existing file, a parent that is a file, a folder that cannot be created
    (no permission, /proc, a read-only mount) or written."""
    shown = f"{flag} {path}"
    if path.exists() and not path.is_dir():
        raise LimitError(f"{shown}: is a file, not a folder; name a folder")
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise LimitError(f"{shown}: {parent} is a file, so no folder can be made under it")
            break
    try:
        path.mkdir(parents=True, exist_ok=True)
        # A probe file: a read-only mount or a folder without write permission fails here,
        # not after the first case.
        fd, probe = tempfile.mkstemp(prefix=".fa-bench-probe-", dir=path)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise LimitError(f"{shown}: cannot write there ({reason})") from None


# --------------------------------------------------------------------------- case sizes


def tensor_bytes(case: Case) -> int:
    """Bytes of the tensors every implementation must hold at once: q, k, v and o, and in
    backward modes do, dq, dk and dv too, in the case's dtype (the least a case needs).
    A paged decode case also holds its pages, built beside the dense cache; a packed
    (varlen) case its T tokens, no padding."""
    key_tokens = case.total_tokens if case.varlen else case.batch * case.seqlen_k
    q = case.heads_q * case.total_tokens * case.head_dim
    kv = case.heads_kv * key_tokens * case.head_dim
    elements = 2 * q + 2 * kv  # q, o; k, v
    if case.mode.backward:
        elements *= 2  # their grads: do, dq; dk, dv
    if case.mode is Mode.DECODE and case.page_size:
        pages = sum(-(-n // case.page_size) for n in case.context_lengths())
        elements += 2 * pages * case.page_size * case.heads_kv * case.head_dim
    return elements * case.dtype.itemsize


def device_memory_bytes(device: str, gpu: int | None) -> tuple[int | None, str]:
    """(bytes, what they are) of the memory the cases run in: the GPU's (torch's total
    memory) on CUDA, the host's RAM on the CPU; None where it cannot be read."""
    if device == "cuda":
        import torch

        props = torch.cuda.get_device_properties(gpu or 0)
        return int(props.total_memory), f"GPU {gpu or 0} ({props.name})"
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None, "host RAM"
    return int(ram), "host RAM"


def check_case_sizes(cases: Iterable[Case], device: str, gpu: int | None) -> None:
    """Refuse a case whose tensors alone exceed the device's memory: no implementation
    could run it, and its allocation would fail (or overflow) only in the worker."""
    limit, what = device_memory_bytes(device, gpu)
    if limit is None:
        return
    for case in cases:
        need = tensor_bytes(case)
        if need > limit:
            grads = " and their grads" if case.mode.backward else ""
            raise LimitError(
                f"case {case.id}: q, k, v, o{grads} need {human_bytes(need)} in "
                f"{case.dtype.value}, more than the {human_bytes(limit)} of {what} "
                f"(batch {case.batch}, heads {case.heads_q}/{case.heads_kv}, seqlen "
                f"{case.seqlen_q}x{case.seqlen_k}, head_dim {case.head_dim}); "
                f"lower {'--seqlen-k' if case.mode is Mode.DECODE else '--seqlen'}, --batch "
                "or --heads"
            )


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return f"{n:.3g} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


# --------------------------------------------------------------------------- case count


def check_case_count(
    count: int, max_cases: int, what: str = "the suites", noun: str = "cases"
) -> None:
    """Refuse more than `max_cases` cases (or sweep points)."""
    if count > max_cases:
        raise LimitError(
            f"{what} make {count:,} {noun}, more than the limit of {max_cases:,}: narrow the "
            f"axes (--suite, --impl, --seqlen, ...), or raise the limit with "
            f"--max-cases {count}"
        )


def estimate_s(cases: int, timing: TimingConfig, telemetry: bool) -> float:
    """A rough upper estimate of a run's length: per case its warm-up, its --max-time (a
    case usually stops earlier, at --target-noise) and a fixed overhead; once, the
    worker's start. Compilation (Triton, torch.compile) is not in it."""
    if cases <= 0:
        return 0.0
    per_case = timing.warmup_ms / 1000 + timing.max_time_s + CASE_OVERHEAD_S
    per_case += TELEMETRY_WINDOW_S if telemetry else 0.0
    return WORKER_START_S + cases * per_case


def human_duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"
