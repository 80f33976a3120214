"""The tuning cache: the best kernel configs a sweep found, kept for later runs.

A readable JSON file (schema `fa-bench-tuning/1`) with one entry per key
(gpu name, dtype, head_dim, causal, mode, seqlen bucket):

    {"schema": "fa-bench-tuning/1",
     "entries": [{"gpu": "NVIDIA H200", "dtype": "bf16", "head_dim": 128, "causal": false,
                  "mode": "fwd", "seqlen_bucket": "1025-4096",
                  "config": {"block_m": 128, "block_n": 128, "num_warps": 8, "num_stages": 3},
                  "tflops": 519.2, "default_tflops": 512.7, "seqlen": 4096,
                  "source": "fa-bench-out/sweep-.../sweep.json", "saved": "..."}]}

`mode` is the sweep's mode: a `fwd` entry holds forward fields, a `bwd` entry the
`bwd_*` fields, so one case's config merges both on top of the heuristic (`select`).
`kernel` says which forward kernel a `fwd` entry tunes: "tl" (absent in caches written
before the Gluon sweep, and read so) the `tl` kernel's four fields, "gluon" a Gluon launch
as the FlashConfig's `gluon_*` fields (kernels/gluon_fields.py). Both may be kept for
one key: the dispatch (kernels/flash_dispatch.py) still picks the kernel; the entry
decides that kernel's launch.
The kernel library never reads this cache: the `triton` registry adapter
(kernels/triton_impl.py) does, and hands the kernel an explicit config.

Where: `--tuning-cache PATH`, else `$FA_BENCH_TUNING_CACHE`, else
`$XDG_CACHE_HOME/fa-bench/tuning.json` (`~/.cache/fa-bench/tuning.json`). The value
`off` disables the cache. A relative path is taken from the current directory (`fa-bench
run` pins it absolute in its plan). At the default location a missing file means "no
tuning"; a file named by the flag or the variable must exist (`fa-bench run` exits 2). An
unreadable or malformed one gives one warning and the heuristic, never an exception.
"""

from __future__ import annotations

import functools
import json
import os
import warnings
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

from fa_bench.errors import UsageError
from fa_bench.kernels.flash_config import FlashConfig
from fa_bench.kernels.gluon_fields import GLUON_FIELDS
from fa_bench.sweep.vocab import KERNELS, MODE_FIELDS, SWEEP_MODES

SCHEMA = "fa-bench-tuning/1"
ENV_VAR = "FA_BENCH_TUNING_CACHE"
OFF = "off"
# Bucket upper edges, powers of 4: a sweep at N = 1k, 4k, 16k covers (256, 1k],
# (1k, 4k], (4k, 16k]; coarse enough that the standard suite's 512..16k all find an entry.
BUCKET_EDGES = (256, 1024, 4096, 16384, 65536)


class TuningCacheError(UsageError, ValueError):
    """A tuning cache file that cannot be read or is not of this schema."""


def default_path() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "fa-bench" / "tuning.json"


def resolve_path(flag: str | Path | None = None) -> Path | None:
    """The cache file to use: flag, env var, default location; None when turned `off`."""
    value = str(flag) if flag is not None else os.environ.get(ENV_VAR)
    if value is None or value == "":
        return default_path()
    return None if value.strip().lower() == OFF else Path(value).expanduser()


def pin(flag: str | Path | None = None) -> str:
    """`resolve_path` as an absolute path, or "off": what a worker process is handed, since
    it runs in the output folder where a relative path would name another file."""
    path = resolve_path(flag)
    return OFF if path is None else str(path.absolute())


def explicit_missing(flag: str | Path | None = None) -> str | None:
    """Why a cache the user named (flag or $FA_BENCH_TUNING_CACHE) cannot be used: it
    points to no file; None when it exists, is `off` or is the default location."""
    named = "--tuning-cache" if flag is not None else ENV_VAR if os.environ.get(ENV_VAR) else None
    path = resolve_path(flag)
    if named is None or path is None or path.is_file():
        return None
    return f"{named}: no tuning cache file at {path}"


def seqlen_bucket(seqlen: int) -> str:
    """The bucket label of a sequence length, e.g. 4096 -> "1025-4096", 1 -> "1-256"."""
    if seqlen < 1:
        raise ValueError(f"seqlen must be >= 1, got {seqlen}")
    lo = 1
    for edge in BUCKET_EDGES:
        if seqlen <= edge:
            return f"{lo}-{edge}"
        lo = edge + 1
    return f"{lo}-"


def entry_key(entry: dict) -> tuple:
    key = (
        entry["gpu"],
        entry["dtype"],
        int(entry["head_dim"]),
        bool(entry["causal"]),
        entry["mode"],
        entry["seqlen_bucket"],
    )
    # a Gluon launch's entry is a key of its own beside the `tl` one (whose key stays)
    return (*key, "gluon") if entry_kernel(entry) == "gluon" else key


def entry_kernel(entry: dict) -> str:
    """The forward kernel an entry tunes; "tl" for entries written before the key existed."""
    return entry.get("kernel", "tl")


def _validate_entry(entry: object, where: str) -> dict:
    if not isinstance(entry, dict):
        raise TuningCacheError(f"{where}: an entry must be an object, got {entry!r}")
    missing = [k for k in ("gpu", "dtype", "head_dim", "causal", "mode", "seqlen_bucket",
                           "config") if k not in entry]  # fmt: skip
    if missing:
        raise TuningCacheError(f"{where}: entry lacks {', '.join(missing)}")
    if entry["mode"] not in SWEEP_MODES:
        raise TuningCacheError(f"{where}: mode {entry['mode']!r} is not one of {SWEEP_MODES}")
    kernel = entry_kernel(entry)
    if kernel not in KERNELS or (kernel == "gluon" and entry["mode"] != "fwd"):
        raise TuningCacheError(
            f"{where}: kernel {kernel!r} is not one of {KERNELS} (gluon: mode fwd only)"
        )
    config = entry["config"]
    allowed = GLUON_FIELDS if kernel == "gluon" else MODE_FIELDS[entry["mode"]]
    if not isinstance(config, dict) or not config or set(config) - set(allowed):
        raise TuningCacheError(
            f"{where}: a {entry['mode']} entry's config takes only {', '.join(allowed)}; "
            f"got {config!r}"
        )
    try:
        FlashConfig(**config)
    except (TypeError, ValueError) as exc:
        raise TuningCacheError(f"{where}: invalid config {config!r}: {exc}") from None
    return entry


def read_cache(path: Path) -> list[dict]:
    """Entries of a cache file; [] when it does not exist; TuningCacheError when broken."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise TuningCacheError(f"{path}: cannot read it: {exc}") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TuningCacheError(f"{path}: not valid JSON: {exc}") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        found = doc.get("schema") if isinstance(doc, dict) else type(doc).__name__
        raise TuningCacheError(f"{path}: schema {found!r} is not {SCHEMA!r}")
    entries = doc.get("entries")
    if not isinstance(entries, list):
        raise TuningCacheError(f"{path}: 'entries' must be a list")
    return [_validate_entry(e, f"{path} entries[{i}]") for i, e in enumerate(entries)]


def write_cache(
    path: Path, new_entries: Iterable[dict], remove: Iterable[tuple] = ()
) -> list[dict]:
    """Merge entries into the file (a new entry replaces one with the same key) and drop
    the `remove` keys (`entry_key` tuples: a newer sweep found the heuristic as good).

    A broken existing file is an error here, not a warning: overwriting it would lose
    what it held, so the caller reports it and the user decides.
    """
    path = Path(path)
    merged = {entry_key(e): e for e in read_cache(path)}
    for key in remove:
        merged.pop(key, None)
    for e in new_entries:
        merged[entry_key(_validate_entry(e, str(path)))] = e
    entries = sorted(merged.values(), key=lambda e: tuple(str(x) for x in entry_key(e)))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"schema": SCHEMA, "entries": entries}, indent=1) + "\n", "utf-8")
    tmp.replace(path)  # atomic: a reader never sees half a file
    return entries


@functools.lru_cache(maxsize=16)
def _index(path: str, mtime_ns: int, size: int) -> dict[tuple, dict]:
    """Entries by key, re-read only when the file changes; warns once per broken version."""
    del mtime_ns, size  # part of the cache key only
    try:
        return {entry_key(e): e for e in read_cache(Path(path))}
    except TuningCacheError as exc:
        warnings.warn(f"tuning cache ignored, using the default heuristic: {exc}", stacklevel=4)
        return {}


def load_index(path: Path | None) -> dict[tuple, dict]:
    if path is None:
        return {}
    try:
        st = os.stat(path)
    except OSError:
        return {}  # no cache yet: the heuristic, silently
    return _index(str(path), st.st_mtime_ns, st.st_size)


def lookup(
    *,
    gpu: str,
    dtype: str,
    head_dim: int,
    causal: bool,
    seqlen: int,
    path: Path | None,
) -> dict[str, dict]:
    """The cached configs for one case: {"fwd": fields, "bwd": fields, "gluon": fields}
    (the `tl` forward's, the backward's, the Gluon launch's), any may be absent."""
    index = load_index(path)
    found = {}
    for mode, kernel in (("fwd", "tl"), ("bwd", "tl"), ("fwd", "gluon")):
        key = (gpu, dtype, int(head_dim), bool(causal), mode, seqlen_bucket(seqlen))
        entry = index.get((*key, "gluon") if kernel == "gluon" else key)
        if entry is not None:
            found["gluon" if kernel == "gluon" else mode] = dict(entry["config"])
    return found


def select(
    base: FlashConfig,
    *,
    gpu: str,
    dtype: str,
    head_dim: int,
    causal: bool,
    seqlen: int,
    path: Path | None,
) -> tuple[FlashConfig, str]:
    """`base` (the heuristic's config) with the cached fields for this case laid over it,
    and where the config came from: "heuristic" or e.g. "tuning cache (fwd, bwd)" ("gluon":
    a Gluon launch, which runs where the dispatch takes the Gluon kernel)."""
    found = lookup(gpu=gpu, dtype=dtype, head_dim=head_dim, causal=causal, seqlen=seqlen,
                   path=path)  # fmt: skip
    if not found:
        return base, "heuristic"
    cfg = base
    for fields in found.values():
        cfg = replace(cfg, **fields)
    return cfg, "tuning cache (" + ", ".join(found) + ")"
