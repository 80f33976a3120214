"""Multi-part runs: splitting a plan among GPUs/ranks, and a real `torchrun` run on CPU
(gloo-free: ranks only share the output folder) producing one merged results.json."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fa_bench.multi import parse_gpus, split
from fa_bench.plan import PlanError, new_plan
from fa_bench.results import load_results
from fa_bench.runner import RunOptions
from fa_bench.suite import load_suite


def smoke_plan():
    cases = list(load_suite("smoke").cases)
    return new_plan(cases, RunOptions(device="cuda"), [], ["fa-bench"]), cases


def test_replicate_gives_every_gpu_every_case(tmp_path: Path) -> None:
    plan, cases = smoke_plan()
    parts = split(plan, tmp_path, "gpu", [0, 3], spread=False)
    assert [p.index for p in parts] == [0, 3]
    assert [p.plan.options.gpu for p in parts] == [0, 3]
    assert all(p.plan.cases == cases for p in parts)
    assert parts[1].out == tmp_path / "gpu-3"


def test_spread_partitions_the_cases(tmp_path: Path) -> None:
    plan, cases = smoke_plan()
    parts = split(plan, tmp_path, "rank", range(3), spread=True)
    ids = [c.id for p in parts for c in p.plan.cases]
    assert sorted(ids) == sorted(c.id for c in cases) and len(ids) == len(set(ids))
    assert parts[2].out == tmp_path / "rank-002"
    assert parts[1].plan.run["part"] == {"kind": "rank", "index": 1, "of": 3, "mode": "spread"}


@pytest.mark.parametrize(("spec", "ok"), [("all", [0, 1, 2, 3]), ("0,3", [0, 3]), ("2", [2])])
def test_parse_gpus(spec: str, ok: list[int]) -> None:
    assert parse_gpus(spec, 4) == ok


@pytest.mark.parametrize("spec", ["4", "0,0", "x", "", "-1"])
def test_parse_gpus_rejects(spec: str) -> None:
    with pytest.raises(PlanError, match="--gpus"):
        parse_gpus(spec, 4)


# The command docs/cluster.md shows for a CPU check of a cluster set-up.
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
            "-m", "fa_bench.cli", "run", "--suite", "smoke", "--device", "cpu", "--spread",
            "--no-report", "--out", "shared-out"]  # fmt: skip


@pytest.mark.slow
def test_torchrun_two_ranks_merge_into_one_results(tmp_path: Path) -> None:
    proc = subprocess.run(TORCHRUN, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = tmp_path / "shared-out"
    merged = load_results(out)
    smoke = {c.id for c in load_suite("smoke").cases}
    ids = [c["id"] for c in merged["cases"]]
    assert sorted(ids) == sorted(smoke)  # every smoke case exactly once
    assert {c["rank"] for c in merged["cases"]} == {0, 1}
    assert all(c["host"] for c in merged["cases"])
    assert merged["run"]["missing_ranks"] == []
    assert merged["run"]["merged"]["mode"] == "spread"
    for rank in (0, 1):
        part = load_results(out / f"rank-00{rank}")
        assert part["run"]["part"]["index"] == rank
