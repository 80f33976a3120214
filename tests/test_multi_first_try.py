"""Several GPUs and ranks on the first try (issue 15, item 5, and the stop signals there):
progress per GPU or rank that shows in a log, which parts are still working, the causes
of a silent or lopsided `--gpus --spread` run, and stop signals on those paths.

The fast tests drive the pieces in-process (a fake clock, fake parts); the slow ones run
`fa-bench run --gpus all` on two CPU "GPUs" through the test hook FA_BENCH_TEST_FAKE_GPUS
(fa_bench/run/multi.py).
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from rich.console import Console

from fa_bench.case import Case, Status
from fa_bench.errors import UsageError
from fa_bench.part_progress import MergeWait, PartsProgress, parts_progress
from fa_bench.results.files import (
    append_journal,
    build_document,
    load_results,
    read_journal,
    write_results,
)
from fa_bench.results.record import CaseRecord
from fa_bench.run import multi
from fa_bench.run.distributed import journal_progress, shard, wait_and_merge
from fa_bench.run.interrupts import InterruptGuard
from fa_bench.run.multi import FAKE_GPUS_ENV, fake_gpus, run_parts, split
from fa_bench.run.plan import PlanError, new_plan, save_plan
from fa_bench.run.runner import RunOptions


def case(impl: str = "naive", seqlen: int = 64, causal: bool = False) -> Case:
    return Case(impl, "fwd", "fp32", 1, 2, 2, seqlen, seqlen, 16, causal)


def record(c: Case, status: Status = Status.OK) -> CaseRecord:
    return CaseRecord.for_case(c, "cpu", status)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def log_console() -> tuple[Console, io.StringIO]:
    """What a CI log gets: not a terminal, 80 columns."""
    buf = io.StringIO()
    return Console(file=buf, width=80, force_terminal=False, color_system=None), buf


# ----------------------------------------------------------------------------- the spread


def test_spread_gives_every_gpu_every_implementation() -> None:
    """The plan interleaves implementations shape by shape; a plain round-robin over it
    gave GPU 0 every case of the first implementation and GPU 1 every case of the second
    whenever their number was a multiple of the GPUs (`-i triton -i sdpa --gpus all
    --spread`: one GPU compiled and ran all of triton while the other sat idle)."""
    cases = [case(impl, s, c) for s in (64, 128, 256, 512) for c in (False, True)
             for impl in ("triton", "sdpa")]  # fmt: skip
    for count in (2, 4):
        shares = [shard(cases, n, count) for n in range(count)]
        flat = [c.id for s in shares for c in s]
        assert sorted(flat) == sorted(c.id for c in cases) and len(set(flat)) == len(flat)
        for share in shares:
            assert {c.impl for c in share} == {"triton", "sdpa"}, [c.id for c in share]
            for impl in ("triton", "sdpa"):  # each implementation dealt evenly
                assert sum(c.impl == impl for c in share) == 8 // count
            order = [cases.index(c) for c in share]
            assert order == sorted(order)  # each share keeps the plan's order


def test_spread_does_not_give_one_gpu_all_the_large_cases() -> None:
    cases = [case("naive", s) for s in (1024, 512, 256, 128, 64, 32)]
    shares = [shard(cases, n, 2) for n in range(2)]
    largest = [max(c.seqlen_q for c in s) for s in shares]
    assert sorted(largest) == [512, 1024]


# ----------------------------------------------------------------------------- progress


def two_parts(clock: Clock, console: Console, **kw: object) -> PartsProgress:
    return PartsProgress(console, [("gpu 0", 2, 0), ("gpu 1", 3, 0)], live=False,
                         clock=clock, **kw)  # type: ignore[arg-type]  # fmt: skip


def test_log_gets_a_line_per_finished_case_per_gpu_and_who_is_still_working() -> None:
    clock, (console, buf) = Clock(), log_console()
    a = [case("naive", 64), case("sdpa", 64)]
    b = [case("naive", 4096, True), case("sdpa", 4096, True), case("sdpa-math", 4096, True)]
    progress = two_parts(clock, console)
    on0, on1 = progress.for_part(0), progress.for_part(1)
    with progress:
        for c in a:
            on0("start", c, None)
            clock.t += 1
            on0("done", c, record(c))
        progress.ended(0, "done")
        on1("start", b[0], None)
        on1("done", b[0], record(b[0], Status.TIMEOUT))
    text = buf.getvalue()
    lines = text.splitlines()
    for c in a:
        assert any(line.startswith("gpu 0 [") and c.id in line for line in lines), text
    assert any(line.startswith("gpu 1 [1/3] timeout") and b[0].id in line for line in lines)
    assert "gpu 0: done, 2/2 (ok 2); still working: gpu 1 (0/3)" in text
    assert all(len(line) <= 80 or " " not in line[-5:] for line in lines)  # not folded
    assert "…" not in text


def test_heartbeat_in_a_log_names_the_running_case_and_how_long() -> None:
    """A long case (or a slow worker start) prints nothing per case: every HEARTBEAT_S
    without output the log gets a status line, so life shows and a hang can be told."""
    clock, (console, buf) = Clock(), log_console()
    progress = two_parts(clock, console, heartbeat_s=20.0)
    long_case = case("sdpa", 16384, True)
    progress.start(1, long_case)
    clock.t += 5
    assert not progress.heartbeat()  # too soon
    progress.ended(0, "done")
    clock.t += 25
    assert progress.heartbeat()
    line = buf.getvalue().splitlines()[-1]
    assert line.startswith("[0:30] gpu 0: done, 0/2; gpu 1: 0/3, running ")
    assert f"{long_case.id} for 0:30" in line
    assert not progress.heartbeat()  # it just printed
    progress.done(1, long_case, record(long_case))
    assert progress.status_line().endswith("gpu 1: 1/3, between cases")
    clock.t += 21
    progress.ended(1, "done")
    assert not progress.heartbeat()  # nothing left to wait for


def test_heartbeat_thread_prints_in_a_log_without_any_event() -> None:
    console, buf = log_console()
    progress = PartsProgress(console, [("gpu 0", 1, 0), ("gpu 1", 1, 0)], live=False,
                             heartbeat_s=0.2)  # fmt: skip
    with progress:
        progress.start(0, case())
        assert wait_for(lambda: "running" in buf.getvalue(), 10)
    assert "gpu 1: 0/1, starting its worker for 0:0" in buf.getvalue()


def test_live_display_has_a_row_per_gpu_with_its_case() -> None:
    buf = io.StringIO()
    console = Console(file=buf, width=200, force_terminal=True, color_system=None)
    progress = PartsProgress(console, [("gpu 0", 2, 0), ("gpu 1", 2, 1)])
    assert progress.live
    c = case("sdpa", 128)
    with progress:
        progress.start(1, c)
        progress.progress.refresh()  # type: ignore[union-attr]
    text = buf.getvalue()
    assert "gpu 0" in text and "gpu 1" in text and "1/2" in text
    assert f"running {c.id}" in text


def test_ranks_print_lines_even_on_a_terminal(tmp_path: Path) -> None:
    """The ranks of a node share torchrun's terminal: one live display each would draw over
    the others, so a rank prints lines, prefixed with its rank."""
    buf = io.StringIO()
    console = Console(file=buf, width=200, force_terminal=True, color_system=None)
    plan = new_plan([case()], RunOptions(device="cpu"), [], ["fa-bench"])
    part = split(plan, tmp_path, "rank", range(2), spread=True)[1]
    assert not parts_progress(console, [part], "rank").live
    gpus = split(plan, tmp_path, "gpu", range(2), spread=False)
    assert parts_progress(console, gpus, "gpu").live


def test_a_part_stopped_by_an_error_is_named_and_the_others_go_on() -> None:
    console, buf = log_console()
    progress = PartsProgress(console, [("gpu 0", 1, 0), ("gpu 1", 1, 0)], live=False)
    progress.ended(1, "stopped by an error: RuntimeError: boom")
    assert "gpu 1: stopped by an error: RuntimeError: boom, 0/1; the others go on" in buf.getvalue()


# ----------------------------------------------------------------------------- run_parts


def wait_for(check: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.02)
    return check()


def fake_parts(tmp_path: Path, n: int = 2) -> list[multi.Part]:
    plan = new_plan([case()], RunOptions(device="cpu"), [], ["fa-bench"])
    return split(plan, tmp_path, "gpu", range(n), spread=False)


class Events:
    """A PartListener that notes how each part ended."""

    def __init__(self) -> None:
        self.how: dict[int, str] = {}

    def for_part(self, n: int) -> Callable:
        return lambda event, c, rec: None

    def ended(self, n: int, how: str) -> None:
        self.how[n] = how


def test_a_usage_error_in_one_part_stops_every_part_and_is_raised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plugin the worker cannot load (P's WorkerPluginError, a UsageError) fails every
    GPU alike: it must stop the run with exit 2, not die in its thread while the others
    record a case after case."""
    stopped = threading.Event()

    def fake_run_plan(plan, out, on_event, stop=None):
        if plan.options.gpu == 0:
            raise UsageError("--plugin nope: cannot import")
        assert stop is not None and stop.wait(30)
        stopped.set()
        return None, True

    monkeypatch.setattr(multi, "run_plan", fake_run_plan)
    with pytest.raises(UsageError, match="nope"):
        run_parts(fake_parts(tmp_path), None)
    assert stopped.is_set()


def test_a_bug_in_one_part_is_reported_with_its_gpu_and_the_others_finish(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fake_run_plan(plan, out, on_event, stop=None):
        if plan.options.gpu == 1:
            raise RuntimeError("boom")
        time.sleep(0.2)
        return {"hostname": "h"}, False

    monkeypatch.setattr(multi, "run_plan", fake_run_plan)
    events = Events()
    outcomes = run_parts(fake_parts(tmp_path), events)
    assert outcomes == [({"hostname": "h"}, False), (None, True)]
    assert events.how == {0: "done", 1: "stopped by an error: RuntimeError: boom"}


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGHUP, 129),
                                           (signal.SIGINT, 130)])  # fmt: skip
def test_a_stop_signal_stops_every_part(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sig: signal.Signals, code: int
) -> None:
    """The signal reaches the main thread only; every part's runner sees the stop event
    and ends interrupted (so its journal is kept and results are written)."""
    running = threading.Barrier(3)

    def fake_run_plan(plan, out, on_event, stop=None):
        running.wait(10)
        assert stop is not None and stop.wait(30)
        return None, True

    monkeypatch.setattr(multi, "run_plan", fake_run_plan)
    events = Events()
    timer = threading.Thread(target=lambda: (running.wait(10), os.kill(os.getpid(), sig)))
    # the guard leaves an inherited SIG_IGN alone (`nohup` ignores SIGHUP, and a run under
    # it must not stop on a hang-up); the test runs under whatever started pytest, so the
    # signal gets its default disposition here for the guard to take over
    inherited = (
        signal.signal(sig, signal.SIG_DFL) if signal.getsignal(sig) is signal.SIG_IGN else None
    )
    try:
        with InterruptGuard() as guard:
            timer.start()
            outcomes = run_parts(fake_parts(tmp_path), events)
        timer.join()
    finally:
        if inherited is not None:
            signal.signal(sig, inherited)
    assert outcomes == [(None, True), (None, True)]
    assert events.how == {0: "stopped", 1: "stopped"}
    assert guard.exit_code == code


# ----------------------------------------------------------------------------- merge wait


def rank_folder(out: Path, index: int, cases: list[Case], done: int, ended: bool) -> Path:
    folder = out / f"rank-{index:03d}"
    folder.mkdir(parents=True)
    plan = new_plan(cases, RunOptions(device="cpu"), [], ["fa-bench"])
    save_plan(folder, plan)
    for c in cases[:done]:
        append_journal(folder, record(c))
    if ended:
        run = {"id": folder.name, "ended": "2026-11-30T10:00:00+00:00"}
        write_results(folder, build_document(run, {}, [record(c) for c in cases[:done]]))
    return folder


def test_rank_0_says_whom_it_waits_for_and_how_far_they_are(tmp_path: Path) -> None:
    """Rank 0 waits up to --merge-timeout (an hour by default) for the other ranks: that
    wait printed nothing at all. Now it names the ranks it waits for, with their journals'
    progress read from the shared folder."""
    cases = [case("naive", s) for s in (16, 32, 48)]
    folders = {0: rank_folder(tmp_path, 0, cases, 3, True),
               1: rank_folder(tmp_path, 1, cases, 1, False)}  # fmt: skip
    assert journal_progress(folders[1]) == (1, 3)
    console, buf = log_console()
    on_wait = MergeWait(console, folders, 0.3, heartbeat_s=10)
    merged = wait_and_merge(tmp_path, sorted(folders.items()), mode="spread", timeout_s=0.3,
                            poll_s=0.05, on_wait=on_wait)  # fmt: skip
    assert merged.missing == [1]
    lines = buf.getvalue().splitlines()
    assert len(lines) == 1  # once at the start, then every heartbeat_s
    assert lines[0].startswith("waiting for rank 1 (1/3) to finish: 0:00 so far, at most 0:00")
    assert "--merge-timeout" in lines[0]


# ----------------------------------------------------------------------------- the hook


def test_fake_gpus_hook_only_with_the_variable_and_on_the_cpu(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(FAKE_GPUS_ENV, raising=False)
    assert fake_gpus("cpu") == 0
    monkeypatch.setenv(FAKE_GPUS_ENV, "2")
    assert fake_gpus("cpu") == 2 and fake_gpus("cuda") == 0
    monkeypatch.setenv(FAKE_GPUS_ENV, "two")
    with pytest.raises(PlanError, match=FAKE_GPUS_ENV):
        fake_gpus("cpu")


# ----------------------------------------------------------------------------- end to end

CLI = [sys.executable, "-c", "from fa_bench.cli import main; main()"]
FAST = ["--max-time", "0.05", "--min-samples", "3", "--target-noise", "0.5", "--warmup", "0"]
SLOW_PLUGIN = """
import os, time
import torch
from fa_bench.registry import register

@register("test-sleepy", description="sleeps while it prepares; logs the worker's PID")
def sleepy(case, q, k, v):
    with open(os.environ["FA_BENCH_TEST_PID_FILE"], "a", encoding="utf-8") as f:
        f.write(f"{os.getpid()}\\n")
    time.sleep(float(os.environ.get("FA_BENCH_TEST_SLEEP_S", "1")))
    return lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v)
"""


def alive(pid: int) -> bool:
    """Running, not a zombie (a dead orphan may wait unreaped under a container's PID 1)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


def start(tmp_path: Path, args: list[str], sleep_s: float = 0.0,
          env: dict[str, str] | None = None) -> subprocess.Popen:  # fmt: skip
    plugin = tmp_path / "sleepy.py"
    plugin.write_text(SLOW_PLUGIN, encoding="utf-8")
    env = {**os.environ, FAKE_GPUS_ENV: "2", "FA_BENCH_TEST_PID_FILE": str(tmp_path / "pids"),
           "FA_BENCH_TEST_SLEEP_S": str(sleep_s), "COLUMNS": "80", **(env or {})}  # fmt: skip
    cmd = [*CLI, "run", "--device", "cpu", "--plugin", str(plugin), "--no-report", *FAST, *args]
    return subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)  # fmt: skip


def worker_pids(tmp_path: Path) -> set[int]:
    path = tmp_path / "pids"
    return {int(s) for s in path.read_text().split()} if path.exists() else set()


@pytest.mark.slow
def test_gpus_run_on_two_cpu_gpus_shows_per_gpu_progress_and_merges(
    tmp_path: Path, tiny_suite
) -> None:
    suite = tiny_suite(["naive", "sdpa"], seqlens=[16, 32, 48])
    out = tmp_path / "out"
    proc = start(tmp_path, ["-s", str(suite), "--gpus", "all", "--spread", "--out", str(out)])
    text, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, text
    merged = load_results(out)
    ids = sorted(c.id for c in merged.cases)
    planned = json.loads((out / "gpu-0" / "plan.json").read_text())["cases"]
    assert len(ids) == len(set(ids)) == 6 and len(planned) == 3
    assert {c.rank for c in merged.cases} == {0, 1}
    for n in (0, 1):  # every GPU got both implementations (the spread's deal)
        assert {c.impl for c in merged.cases if c.rank == n} == {"naive", "sdpa"}
    for c in merged.cases:  # one line per case, prefixed with its GPU, the id whole
        assert f"gpu {c.rank} [" in text and c.id in text, text
    assert "gpu 0: done, 3/3" in text and "gpu 1: done, 3/3" in text
    assert "…" not in text


@pytest.mark.slow
@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143)])
def test_a_stop_signal_to_a_gpus_run_keeps_every_gpus_cases_and_leaves_no_worker(
    tmp_path: Path, tiny_suite, sig: signal.Signals, code: int
) -> None:
    suite = tiny_suite(["test-sleepy"], seqlens=[16, 24, 32, 40, 48, 56])
    out = tmp_path / "out"
    proc = start(tmp_path, ["-s", str(suite), "--gpus", "all", "--spread", "--out", str(out)],
                 sleep_s=1.5)  # fmt: skip
    try:
        parts = [out / "gpu-0", out / "gpu-1"]
        assert wait_for(lambda: all(len(read_journal(p)) >= 1 for p in parts), 180)
        time.sleep(0.3)  # mid-case on both GPUs
        proc.send_signal(sig)
        text, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == code, text
    assert f"finish with: fa-bench run --resume {out}" in text
    done = {p.name: len(read_journal(p)) for p in parts}
    merged = load_results(out)
    assert len(merged.cases) == sum(done.values()) >= 2
    assert all(load_results(p).run["interrupted"] for p in parts)
    pids = worker_pids(tmp_path)
    assert len(pids) >= 2
    assert wait_for(lambda: not any(alive(p) for p in pids), 10), "a worker outlived the run"
    # --resume finishes both GPUs' parts, every case exactly once
    resume = subprocess.run([*CLI, "run", "--resume", str(out), "--no-report"], cwd=tmp_path,
                            env={**os.environ, FAKE_GPUS_ENV: "2", "FA_BENCH_TEST_SLEEP_S": "0",
                                 "FA_BENCH_TEST_PID_FILE": str(tmp_path / "pids")},
                            capture_output=True, text=True, timeout=300)  # fmt: skip
    assert resume.returncode == 0, resume.stdout + resume.stderr
    ids = [c.id for c in load_results(out).cases]
    assert len(ids) == 6 and len(set(ids)) == 6


@pytest.mark.slow
def test_sigkill_of_a_gpus_run_leaves_no_worker(tmp_path: Path, tiny_suite) -> None:
    suite = tiny_suite(["test-sleepy"], seqlens=[16, 24, 32, 40])
    out = tmp_path / "out"
    proc = start(tmp_path, ["-s", str(suite), "--gpus", "all", "--out", str(out)], sleep_s=5)
    try:
        assert wait_for(lambda: len(worker_pids(tmp_path)) >= 2, 180)
        proc.kill()
        proc.communicate(timeout=30)
    finally:
        proc.kill()
    pids = worker_pids(tmp_path)
    assert wait_for(lambda: not any(alive(p) for p in pids), 10), "a worker outlived the run"


@pytest.mark.slow
def test_a_rank_stopped_by_sigterm_exits_143_and_says_how_to_resume(
    tmp_path: Path, tiny_suite
) -> None:
    """A rank other than 0 ignored its stop: it returned its cases' exit code (0) as if it
    had finished, with no word of resuming."""
    suite = tiny_suite(["test-sleepy"], seqlens=[16, 24, 32, 40])
    out = tmp_path / "out"
    ranks = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}
    proc = start(tmp_path, ["-s", str(suite), "--spread", "--out", str(out)], sleep_s=1.5,
                 env=ranks)  # fmt: skip
    try:
        assert wait_for(lambda: len(read_journal(out / "rank-001")) >= 1, 180)
        proc.send_signal(signal.SIGTERM)
        text, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 143, text
    assert "rank 1: stopped" in text  # its progress says which rank
    assert f"the same launcher (torchrun/srun) running: fa-bench run --resume {out}" in text
    assert load_results(out / "rank-001").run["interrupted"]


@pytest.mark.slow
def test_rank_0_waiting_for_a_rank_that_never_came_shows_it_and_a_signal_ends_the_wait(
    tmp_path: Path, tiny_suite
) -> None:
    suite = tiny_suite(["naive"], seqlens=[16, 24])
    out = tmp_path / "out"
    ranks = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}
    proc = start(tmp_path, ["-s", str(suite), "--spread", "--out", str(out)], env=ranks)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout or ()), daemon=True)
    reader.start()
    try:
        waiting = wait_for(lambda: any(s.startswith("waiting for rank 1") for s in lines), 180)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        reader.join(timeout=10)
    finally:
        proc.kill()
    assert waiting, "".join(lines)
    rest = ""
    text = "".join(lines) + rest
    assert "waiting for rank 1 (0/?) to finish" in text and "at most 1:00:00" in text
    assert proc.returncode == 143, text


@pytest.mark.slow
def test_ranks_stop_and_keep_their_cases_when_torchrun_is_killed(
    tmp_path: Path, tiny_suite
) -> None:
    """torchrun SIGKILLed (a node's OOM killer, a scheduler's hard kill): its ranks ran on
    under PID 1 with their workers. Now each rank gets SIGTERM from the kernel
    (tie_to_launcher), stops as on any stop signal, and writes its finished cases."""
    suite = tiny_suite(["test-sleepy"], seqlens=[16, 24, 32, 40, 48, 56])
    out = tmp_path / "out"
    plugin = tmp_path / "sleepy.py"
    plugin.write_text(SLOW_PLUGIN, encoding="utf-8")
    env = {**os.environ, "FA_BENCH_TEST_PID_FILE": str(tmp_path / "pids"),
           "FA_BENCH_TEST_SLEEP_S": "1.5"}  # fmt: skip
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           "2", "--no-python", sys.executable, "-c", "from fa_bench.cli import main; main()",
           "run", "-s", str(suite), "--device", "cpu", "--plugin", str(plugin), "--spread",
           "--no-report", "--out", str(out), *FAST]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)  # fmt: skip
    parts = [out / "rank-000", out / "rank-001"]
    try:
        assert wait_for(lambda: all(len(read_journal(p)) >= 1 for p in parts), 240)
        proc.kill()
        proc.wait(timeout=30)
    finally:
        proc.kill()
    ended = lambda: all((p / "results.json").exists() for p in parts)  # noqa: E731
    assert wait_for(ended, 60), "a rank did not stop when torchrun died"
    for p in parts:
        doc = load_results(p)
        assert doc.run["interrupted"] and len(doc.cases) >= 1
    pids = worker_pids(tmp_path)
    assert wait_for(lambda: not any(alive(p) for p in pids), 15), "a worker outlived the run"


@pytest.mark.slow
def test_rank_0_stopped_mid_run_does_not_wait_for_the_other_ranks(
    tmp_path: Path, tiny_suite
) -> None:
    """Rank 0 stopped by SIGTERM went on to wait up to --merge-timeout (an hour) for ranks
    that might never end; a stopped run must end now, with what has ended."""
    suite = tiny_suite(["test-sleepy"], seqlens=[16, 24, 32, 40])
    out = tmp_path / "out"
    ranks = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}
    proc = start(tmp_path, ["-s", str(suite), "--spread", "--out", str(out)], sleep_s=1.5,
                 env=ranks)  # fmt: skip
    try:
        assert wait_for(lambda: len(read_journal(out / "rank-000")) >= 1, 180)
        proc.send_signal(signal.SIGTERM)
        text, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 143, text
    assert load_results(out / "rank-000").run["interrupted"]
    merged = load_results(out)
    assert merged.run["missing_ranks"] == [1] and len(merged.cases) >= 1


CHATTY_PLUGIN = """
import sys
import torch
from fa_bench.registry import register

@register("test-chatty", description="prints megabytes to stdout and stderr while it prepares")
def chatty(case, q, k, v):
    line = "x" * 1023 + "\\n"
    sys.stdout.write(line * 2048)  # 2 MiB each: far past a pipe's 64 KiB buffer
    sys.stderr.write(line * 2048)
    sys.stdout.flush()
    sys.stderr.flush()
    return lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v)
"""


@pytest.mark.slow
def test_a_worker_that_floods_its_output_does_not_stall_a_gpus_run(
    tmp_path: Path, tiny_suite
) -> None:
    """One way a multi-GPU run can hang: a child's output captured in a pipe nobody reads,
    which blocks the child once the buffer is full. The worker's stdout is the protocol
    (read by a thread all along, an implementation's prints go to stderr) and its stderr a
    file (worker.log): megabytes of prints per case on both GPUs still finish."""
    (tmp_path / "chatty.py").write_text(CHATTY_PLUGIN, encoding="utf-8")
    suite = tiny_suite(["test-chatty"], seqlens=[16, 24, 32, 40])
    out = tmp_path / "out"
    proc = start(tmp_path, ["-s", str(suite), "--gpus", "all", "--spread", "--out", str(out),
                            "--plugin", str(tmp_path / "chatty.py")])  # fmt: skip
    try:
        text, _ = proc.communicate(timeout=240)
    finally:
        proc.kill()
    assert proc.returncode == 0, text[-3000:]
    assert [c.status for c in load_results(out).cases] == [Status.OK] * 4
    assert "xxxxxxxx" not in text  # not in fa-bench's own output
    assert (out / "gpu-0" / "worker.log").stat().st_size > 4 << 20
