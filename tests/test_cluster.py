"""Multi-part runs: splitting a plan among GPUs/ranks, and a real `torchrun` run on CPU
(gloo-free: ranks only share the output folder) producing one merged results.json."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fa_bench.results.files import load_results
from fa_bench.run.multi import parse_gpus, split
from fa_bench.run.plan import PlanError, new_plan
from fa_bench.run.runner import RunOptions
from fa_bench.suite.expand import load_suite


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
    ids = [c.id for c in merged.cases]
    assert sorted(ids) == sorted(smoke)  # every smoke case exactly once
    assert {c.rank for c in merged.cases} == {0, 1}
    assert all(c.host for c in merged.cases)
    assert merged.run["missing_ranks"] == []
    assert merged.run["merged"]["mode"] == "spread"
    for rank in (0, 1):
        part = load_results(out / f"rank-00{rank}")
        assert part.run["part"]["index"] == rank


@pytest.mark.slow
def test_parts_run_concurrently_and_merge(tmp_path: Path) -> None:
    """The --gpus path minus the GPUs: two parts in threads, each with its own worker
    (on CPU the GPU index is unused), finished and merged like a one-node run."""
    from fa_bench.case import Case
    from fa_bench.run.distributed import part_dir, wait_and_merge
    from fa_bench.run.multi import run_parts
    from fa_bench.run.plan import finish
    from fa_bench.run.timing import TimingConfig

    cases = [Case(i, "fwd", "fp32", 1, 2, 2, 32, 32, 16, False) for i in ("naive", "sdpa")]
    fast = TimingConfig(target_noise=0.2, min_samples=3, min_time_s=0.0, max_time_s=0.05)
    options = RunOptions(device="cpu", timing=fast, telemetry=False)
    plan = new_plan(cases, options, [], ["fa-bench"])
    parts = split(plan, tmp_path, "gpu", [0, 1], spread=False)
    events: list[tuple[str, str]] = []
    outcomes = run_parts(parts, lambda event, case, rec: events.append((event, case.impl)))
    assert [interrupted for _, interrupted in outcomes] == [False, False]
    for part, (env, interrupted) in zip(parts, outcomes, strict=True):
        finish(part.plan, part.out, env, interrupted)
    merged = wait_and_merge(tmp_path, [(i, part_dir(tmp_path, "gpu", i)) for i in (0, 1)],
                            mode="replicate", timeout_s=0)  # fmt: skip
    assert merged.missing == []
    got = sorted((c.rank, c.impl, c.status.value) for c in merged.doc.cases)
    assert got == [(0, "naive", "ok"), (0, "sdpa", "ok"), (1, "naive", "ok"), (1, "sdpa", "ok")]
    assert events.count(("done", "naive")) == 2 and events.count(("done", "sdpa")) == 2
