"""Several GPUs and nodes: who this process is, which cases it runs, and the merge.

Launchers are the usual ones, not a home-made one: under `torchrun` (RANK, WORLD_SIZE,
LOCAL_RANK) or Slurm's `srun` (SLURM_PROCID, SLURM_STEP_NUM_TASKS, SLURM_LOCALID) each
rank runs its share (`--spread`) or the whole suite (`--replicate`) on its local GPU and
writes an ordinary run folder `OUT/rank-NNN/`. The merge goes through the shared `--out`
directory, not torch.distributed: rank 0 waits (with a timeout) until every rank's
results.json says it has ended, then writes one merged OUT/results.json; ranks that
never finish are listed in `run.missing_ranks` instead of hanging the merge.
`fa-bench run --gpus` on one node uses the same layout with one folder per GPU
(`OUT/gpu-N/`) and the same merge.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from fa_bench.case import Case
from fa_bench.errors import UsageError
from fa_bench.models import case_flops
from fa_bench.results.files import PLAN, build_document, load_results, read_journal
from fa_bench.results.record import ResultsDoc, ResultsError


class DistributedError(UsageError, ValueError):
    """Inconsistent launcher variables or flags (exit code 2)."""


@dataclass(frozen=True)
class Rank:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    launcher: str | None = None  # "torchrun", "slurm" or None
    host: str = ""

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def _int(env: Mapping[str, str], name: str) -> int:
    try:
        value = int(env[name])
    except ValueError:
        raise DistributedError(
            f"environment variable {name}={env[name]!r} is not an integer"
        ) from None
    if value < 0:
        raise DistributedError(f"environment variable {name}={value} is negative")
    return value


def detect(env: Mapping[str, str] | None = None) -> Rank:
    """This process's place among the ranks; torchrun's variables win over Slurm's
    (torchrun started by srun sets both, and its own are the per-process ones)."""
    env = os.environ if env is None else env
    host = socket.gethostname()
    if "RANK" in env and "WORLD_SIZE" in env:
        rank, world = _int(env, "RANK"), _int(env, "WORLD_SIZE")
        local = _int(env, "LOCAL_RANK") if "LOCAL_RANK" in env else 0
        launcher = "torchrun"
    elif "SLURM_PROCID" in env and "SLURM_STEP_NUM_TASKS" in env:
        # Only srun's job steps set SLURM_STEP_NUM_TASKS. A batch script run directly sees
        # SLURM_PROCID=0 and the allocation's SLURM_NTASKS too, but it is one process:
        # taking SLURM_NTASKS as the world would make it wait for ranks that never start.
        rank = _int(env, "SLURM_PROCID")
        world = _int(env, "SLURM_STEP_NUM_TASKS")
        local = _int(env, "SLURM_LOCALID") if "SLURM_LOCALID" in env else 0
        launcher = "slurm"
    else:
        return Rank(host=host)
    if world < 1 or rank >= world:
        raise DistributedError(f"{launcher}: rank {rank} is outside a world of size {world}")
    return Rank(rank, world, local, launcher, host)


def tie_to_launcher(rank: Rank) -> bool:
    """Under torchrun, make this rank stop when its launcher dies (SIGKILLed, crashed):
    Linux sends it SIGTERM, which a run takes as a stop (its finished cases written, its
    worker stopped, exit 143), instead of running on under PID 1 with nobody to wait for
    it. torchrun starts the ranks from its main thread, so only its death fires this (the
    signal follows the parent *thread*). srun's slurmstepd ends its tasks itself. True
    when set."""
    if rank.launcher != "torchrun":
        return False
    from fa_bench.run.lifeline import set_death_signal

    return set_death_signal(signal.SIGTERM)


def shard(cases: Sequence[Case], index: int, count: int) -> list[Case]:
    """Share `index` of `count`: every case in exactly one share, share sizes within one of
    each other, and each implementation's cases, largest first, dealt across the shares.

    Dealt per implementation, not over the plan as it comes: the plan interleaves the
    implementations shape by shape, so a plain round-robin gave every share the same few
    implementations whenever their number was a multiple of the shares (`-i triton -i sdpa
    --gpus all --spread` on two GPUs: one GPU ran, and compiled, every triton case while the
    other finished early and sat idle). The deal goes back and forth (0 1 2 2 1 0 ...) over
    the cases sorted by FLOPs, so no share collects the large ones. Each share keeps the
    plan's order."""
    if not 0 <= index < count:
        raise DistributedError(f"share {index} of {count} does not exist")
    first_of_impl: dict[str, int] = {}
    for i, case in enumerate(cases):
        first_of_impl.setdefault(case.impl, i)
    dealt = sorted(
        range(len(cases)), key=lambda i: (first_of_impl[cases[i].impl], -case_flops(cases[i]), i)
    )
    mine = {i for k, i in enumerate(dealt) if _snake(k, count) == index}
    return [case for i, case in enumerate(cases) if i in mine]


def _snake(k: int, count: int) -> int:
    """The share of the k-th dealt case: 0 1 .. count-1, then back, count-1 .. 0, ..."""
    lap, pos = divmod(k, count)
    return pos if lap % 2 == 0 else count - 1 - pos


def part_dir(out: Path, kind: str, index: int) -> Path:
    """OUT/rank-003 for launched ranks, OUT/gpu-3 for the GPUs of `--gpus`."""
    return Path(out) / (f"rank-{index:03d}" if kind == "rank" else f"gpu-{index}")


def journal_progress(folder: Path) -> tuple[int, int | None]:
    """(cases journaled, cases planned or None) of a part folder, read while it runs: how
    far another rank has got, from the shared folder alone."""
    done = len({r.id for r in read_journal(folder)})
    try:
        planned = json.loads((Path(folder) / PLAN).read_text(encoding="utf-8"))["cases"]
        return done, len(planned) if isinstance(planned, list) else None
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError):
        return done, None  # no plan yet (the rank is starting) or one being replaced


@dataclass
class Merged:
    doc: ResultsDoc
    missing: list[int]


def wait_and_merge(
    out: Path,
    parts: Sequence[tuple[int, Path]],
    *,
    mode: str,
    timeout_s: float,
    poll_s: float = 1.0,
    run_extra: dict | None = None,
    on_wait: Callable[[list[int], float], None] | None = None,
) -> Merged:
    """Wait for every part's finished results.json (or the timeout), then merge.

    `parts` is [(rank or GPU index, folder)]. Cases are tagged with `rank`; the merged
    env lists every part's env under `parts`, and missing parts are named. `on_wait(pending
    indices, seconds waited)` is called before each poll's sleep: rank 0 can wait up to
    --merge-timeout (an hour by default) and must show that it waits, and for whom.
    """
    started = time.monotonic()
    deadline = started + timeout_s
    docs: dict[int, ResultsDoc] = {}
    while True:
        for index, folder in parts:
            if index in docs:
                continue
            try:
                doc = load_results(folder)
            except ResultsError:
                continue  # not written yet (or being replaced)
            if doc.run.get("ended"):
                docs[index] = doc
        if len(docs) == len(parts) or time.monotonic() >= deadline:
            break
        if on_wait is not None:
            on_wait([i for i, _ in parts if i not in docs], time.monotonic() - started)
        time.sleep(poll_s)
    missing = sorted(i for i, _ in parts if i not in docs)
    if not docs:
        raise ResultsError(f"{out}: no part finished within {timeout_s:g} s (missing {missing})")
    first = docs[min(docs)]
    cases = [
        dataclasses.replace(record, extra={**record.extra, "rank": index})
        for index in sorted(docs)
        for record in docs[index].cases
    ]
    run = {
        **first.run,
        "merged": {"mode": mode, "parts": len(parts), "finished": sorted(docs)},
        "missing_ranks": missing,
        **(run_extra or {}),
    }
    env = {**first.env, "parts": {str(i): docs[i].env for i in sorted(docs)}}
    return Merged(build_document(run, env, cases), missing)
