"""Rank detection under torchrun and Slurm, sharding, and the merge of per-rank runs."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from fa_bench.case import Case, Status
from fa_bench.results.files import build_document, write_results
from fa_bench.results.record import CaseRecord
from fa_bench.run.distributed import DistributedError, detect, part_dir, shard, wait_and_merge


def test_detect_single_process() -> None:
    r = detect({})
    assert (r.rank, r.world_size, r.local_rank, r.launcher, r.distributed) == (0, 1, 0, None, False)


def test_detect_torchrun() -> None:
    r = detect({"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1"})
    assert (r.rank, r.world_size, r.local_rank, r.launcher) == (5, 8, 1, "torchrun")


def test_a_batch_script_without_srun_is_one_process() -> None:
    # what sbatch --ntasks=4 gives the batch script itself (no srun): one process
    env = {"SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_LOCALID": "0", "SLURM_JOB_ID": "7"}
    assert detect(env).world_size == 1 and not detect(env).distributed


def test_detect_slurm_step_and_torchrun_precedence() -> None:
    env = {"SLURM_PROCID": "3", "SLURM_NTASKS": "16", "SLURM_STEP_NUM_TASKS": "4",
           "SLURM_LOCALID": "3"}  # fmt: skip
    r = detect(env)
    assert (r.rank, r.world_size, r.local_rank, r.launcher) == (3, 4, 3, "slurm")
    both = detect({**env, "RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"})
    assert (both.rank, both.world_size, both.launcher) == (0, 2, "torchrun")


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"RANK": "x", "WORLD_SIZE": "2"}, "RANK='x'"),
        ({"RANK": "2", "WORLD_SIZE": "2"}, "outside a world of size 2"),
        ({"SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "-1"}, "negative"),
    ],
)
def test_detect_rejects_bad_variables(env: dict, message: str) -> None:
    with pytest.raises(DistributedError, match=message):
        detect(env)


def cases(n: int) -> list[Case]:
    return [Case("naive", "fwd", "fp32", 1, 1, 1, s, s, 16, False) for s in range(1, n + 1)]


@pytest.mark.parametrize(("n", "world"), [(10, 3), (2, 4), (7, 1), (0, 2)])
def test_shards_partition_the_cases(n: int, world: int) -> None:
    every = cases(n)
    shares = [shard(every, r, world) for r in range(world)]
    flat = [c.id for share in shares for c in share]
    assert sorted(flat) == sorted(c.id for c in every)  # each case exactly once
    assert len(flat) == len(set(flat))
    assert max(map(len, shares)) - min(map(len, shares)) <= 1


def finished_part(folder: Path, seqlens: list[int], ended: bool = True) -> None:
    folder.mkdir(parents=True)
    recs = [
        CaseRecord.for_case(c, "cpu", Status.OK)
        for c in cases(max(seqlens))
        if c.seqlen_q in seqlens
    ]
    run = {"id": folder.name, "ended": "2026-11-29T10:00:00+00:00" if ended else None}
    write_results(folder, build_document(run, {"hostname": folder.name}, recs))


def test_merge_tags_ranks_and_reports_missing(tmp_path: Path) -> None:
    parts = [(r, part_dir(tmp_path, "rank", r)) for r in range(3)]
    finished_part(parts[0][1], [1, 4])
    finished_part(parts[1][1], [2, 5])
    finished_part(parts[2][1], [3], ended=False)  # crashed mid-run: never ends
    merged = wait_and_merge(tmp_path, parts, mode="spread", timeout_s=0.3, poll_s=0.05)
    assert merged.missing == [2]
    assert merged.doc.run["missing_ranks"] == [2]
    assert [(c.rank, c.case.seqlen_q) for c in merged.doc.cases] == [
        (0, 1), (0, 4), (1, 2), (1, 5)
    ]  # fmt: skip
    assert set(merged.doc.env["parts"]) == {"0", "1"}


def test_merge_waits_for_a_late_rank(tmp_path: Path) -> None:
    parts = [(r, part_dir(tmp_path, "gpu", r)) for r in range(2)]
    finished_part(parts[0][1], [1])
    late = threading.Timer(0.3, finished_part, args=(parts[1][1], [2]))
    late.start()
    t0 = time.monotonic()
    merged = wait_and_merge(tmp_path, parts, mode="replicate", timeout_s=30, poll_s=0.05)
    assert merged.missing == []
    assert time.monotonic() - t0 < 10
    assert [c.rank for c in merged.doc.cases] == [0, 1]
