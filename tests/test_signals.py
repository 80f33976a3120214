"""Stop signals and orphans (issue 15, item 3): SIGTERM and SIGHUP end a run as Ctrl-C
does (results written, worker stopped, the resume command, exit 128 + signal), and a
worker never outlives the fa-bench that started it.

The end-to-end tests start fa-bench (or a stand-in parent) in a subprocess and are slow;
the guard and the command's exit code are also checked in-process.
`test-slow` (tests/plugins/slow_impls.py) sleeps while it prepares and logs the worker's
PID, so a signal lands mid-case after a known number of finished cases.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from rich.console import Console

from fa_bench.case import Case, Status
from fa_bench.commands.run import RunRequest, run_command
from fa_bench.results.files import append_journal, load_results, read_journal
from fa_bench.results.record import CaseRecord
from fa_bench.run.interrupts import Interrupted, InterruptGuard, stop_exit_code
from fa_bench.run.plan import new_plan, save_plan
from fa_bench.run.runner import RunOptions

SLOW_PLUGIN = str(Path(__file__).parent / "plugins" / "slow_impls.py")
FAST = ["--max-time", "0.05", "--min-samples", "3", "--target-noise", "0.5", "--warmup", "0"]
CLI = [sys.executable, "-c", "from fa_bench.cli import main; main()"]


STOPS = [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129)]


@pytest.fixture(autouse=True)
def _unhandled_signals_fail_the_test():
    """An in-process SIGTERM or SIGHUP that fa-bench does not handle fails the test
    instead of killing pytest (their default action)."""

    def fail(signum: int, frame: object) -> None:
        raise AssertionError(f"{signal.Signals(signum).name} reached no fa-bench handler")

    old = {sig: signal.signal(sig, fail) for sig in (signal.SIGTERM, signal.SIGHUP)}
    yield
    for sig, handler in old.items():
        signal.signal(sig, handler)


@pytest.mark.parametrize(("sig", "code"), STOPS)
def test_the_guard_stops_on_each_signal_then_holds_the_next(sig: int, code: int) -> None:
    before = signal.getsignal(sig)
    with InterruptGuard() as guard:
        with pytest.raises(Interrupted) as stopped:  # a KeyboardInterrupt, as Ctrl-C was
            os.kill(os.getpid(), sig)
            time.sleep(2)
        assert isinstance(stopped.value, KeyboardInterrupt) and stopped.value.signum == sig
        os.kill(os.getpid(), signal.SIGTERM)  # a second one, of any kind, is held
        time.sleep(0.05)
        assert guard.count == 2 and guard.signum == sig and guard.exit_code == code
    assert signal.getsignal(sig) is before  # restored
    assert stop_exit_code(None) == 130


def test_an_ignored_signal_stays_ignored() -> None:
    """`nohup fa-bench run ...` ignores SIGHUP so that the run outlives the terminal."""
    before = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with InterruptGuard() as guard:
            os.kill(os.getpid(), signal.SIGHUP)
            time.sleep(0.05)
        assert guard.count == 0 and signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, before)


@pytest.mark.parametrize(("sig", "code"), STOPS)
def test_run_stopped_by_a_signal_writes_results_and_exits_128_plus_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sig: int, code: int
) -> None:
    """In-process: the signal lands while the cases run (run_parts stands in for them),
    two more while results.csv is written: they are held, and skip the report."""
    import fa_bench.commands.run as run_cmd
    from fa_bench.results import files

    out = tmp_path / "run"
    out.mkdir()
    cases = [Case("naive", "fwd", "fp32", 1, 1, 1, n, n, 16, False) for n in (8, 16, 24)]
    save_plan(out, new_plan(cases, RunOptions(device="cpu"), [], ["fa-bench", "run"]))
    append_journal(out, CaseRecord.failed(cases[0], Status.ERROR, "fixture", "cpu"))

    def stopped_parts(parts: list, progress: object) -> list:
        try:
            os.kill(os.getpid(), sig)
            time.sleep(2)
        except KeyboardInterrupt:
            return [(None, True)]
        raise AssertionError(f"{sig} did not stop the cases")

    real_frame = files.to_frame

    def to_frame(doc: object) -> object:
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), sig)
        time.sleep(0.1)
        return real_frame(doc)  # type: ignore[arg-type]

    monkeypatch.setattr(run_cmd, "run_parts", stopped_parts)
    monkeypatch.setattr(files, "to_frame", to_frame)
    con, err = io.StringIO(), io.StringIO()
    got = run_command(RunRequest(resume=out, report=True), console=Console(file=con, width=300),
                      err_console=Console(file=err, width=300))  # fmt: skip
    assert got == code, err.getvalue()  # the first signal's
    assert (out / "results.json").exists() and (out / "results.csv").exists()
    assert len(load_results(out).cases) == 1 and load_results(out).run["interrupted"] is True
    assert f"fa-bench run --resume {out}" in err.getvalue() and "report skipped" in err.getvalue()
    assert "Ctrl-C" in err.getvalue() if sig == signal.SIGINT else sig.name in err.getvalue()


def alive(pid: int) -> bool:
    """Running, not a zombie: a dead orphan may wait unreaped under a container's PID 1."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


def wait_until(check: Callable[[], bool], timeout_s: float, step_s: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(step_s)
    return check()


def wait_for(proc: subprocess.Popen, check: Callable[[], bool], timeout_s: float, what: str):
    """Wait for `check`; on failure, the run's own output says why."""
    if not wait_until(check, timeout_s):
        proc.kill()
        stdout, stderr = proc.communicate(timeout=30)
        pytest.fail(f"{what}; exit {proc.returncode}\n{stdout}\n{stderr}")


def pids(path: Path) -> list[int]:
    return [int(s) for s in path.read_text().split()] if path.exists() else []


def start_run(tmp_path: Path, suite: Path, out: Path, sleep_s: float, report: bool = False):
    env = {**os.environ, "FA_BENCH_TEST_PID_FILE": str(tmp_path / "pids"),
           "FA_BENCH_TEST_SLEEP_S": str(sleep_s)}  # fmt: skip
    args = ["run", "-s", str(suite), "--device", "cpu", "--plugin", SLOW_PLUGIN,
            "--out", str(out), *([] if report else ["--no-report"]), *FAST]  # fmt: skip
    return subprocess.Popen([*CLI, *args], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_a_stop_signal_mid_run_keeps_results_stops_the_worker_and_resume_finishes(
    tmp_path: Path, tiny_suite, sig: signal.Signals, code: int
) -> None:
    suite = tiny_suite(["test-slow"], seqlens=[16, 24, 32, 40])
    out = tmp_path / "out"
    # SIGTERM also writes the report (one signal: the page is quick and not skipped).
    proc = start_run(tmp_path, suite, out, 1.5, report=sig == signal.SIGTERM)
    try:
        wait_for(proc, lambda: len(read_journal(out)) >= 1, 120, "no case finished")
        time.sleep(0.3)  # into the next case's 1.5 s preparation: mid-case
        proc.send_signal(sig)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == code, stdout + stderr
    flat = (stdout + stderr).replace("\n", "")
    assert f"fa-bench run --resume {out}" in flat and "results.json" in flat
    assert sig.name in stderr and "Traceback" not in stderr
    partial = load_results(out)
    kept = {c.id for c in partial.cases}
    assert partial.run["interrupted"] is True and 1 <= len(kept) < 4
    assert (out / "report.html").exists() == (sig == signal.SIGTERM)
    assert all(c.status.value == "ok" for c in partial.cases)  # the stopped case: not an error
    # The worker was stopped with the run, not left to finish its case under PID 1.
    workers = set(pids(tmp_path / "pids"))
    assert workers and wait_until(lambda: not any(alive(p) for p in workers), 5), workers
    assert "Traceback" not in (out / "worker.log").read_text()

    done = subprocess.run([*CLI, "run", "--resume", str(out), "--no-report"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "FA_BENCH_TEST_SLEEP_S": "0"})  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    final = load_results(out)
    ids = [c.id for c in final.cases]
    assert len(ids) == len(set(ids)) == 4 and kept <= set(ids)
    assert all(c.status.value == "ok" for c in final.cases)


@pytest.mark.slow
def test_a_scheduler_signalling_every_process_loses_no_case(tmp_path: Path, tiny_suite) -> None:
    """Slurm signals every process of a job step, the worker too (here: first). The worker
    leaves the stop to its runner, so the case it was running is not recorded as an error
    (which --resume would keep) but left for --resume."""
    suite = tiny_suite(["test-slow"], seqlens=[16, 24, 32])
    out = tmp_path / "out"
    proc = start_run(tmp_path, suite, out, 2)
    try:
        wait_for(proc, lambda: len(pids(tmp_path / "pids")) >= 2, 120, "no second case")
        os.kill(pids(tmp_path / "pids")[-1], signal.SIGTERM)  # mid-case
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 143, stdout + stderr
    partial = load_results(out)
    assert len(partial.cases) >= 1 and all(c.status.value == "ok" for c in partial.cases)


@pytest.mark.slow
def test_a_killed_run_takes_its_worker_along(tmp_path: Path, tiny_suite) -> None:
    """SIGKILL cannot be handled: the worker itself notices that its runner is gone."""
    suite = tiny_suite(["test-slow"], seqlens=[16, 24])
    out = tmp_path / "out"
    proc = start_run(tmp_path, suite, out, 60)  # a case that would outlive the test
    try:
        wait_for(proc, lambda: bool(pids(tmp_path / "pids")), 120, "the case never started")
        worker = pids(tmp_path / "pids")[0]
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
        assert wait_until(lambda: not alive(worker), 5), f"worker {worker} outlived its runner"
    finally:
        proc.kill()
        for pid in pids(tmp_path / "pids"):
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
    assert "Traceback" not in (out / "worker.log").read_text()


# A parent that starts a child tied to it by the portable ties alone (no prctl), then
# waits to be killed; the child "runs a case" (sleeps) in its main thread meanwhile.
_PARENT = textwrap.dedent(
    """
    import subprocess, sys, time
    child = subprocess.Popen([sys.executable, "-c", sys.argv[1]], stdin=subprocess.PIPE)
    print(child.pid, flush=True)
    time.sleep(600)
    """
)
_CHILD = textwrap.dedent(
    """
    import os, time
    from fa_bench.run import lifeline
    lifeline.set_death_signal = lambda *a: False  # as on a system without prctl
    lifeline.Lifeline(os.getppid()).start()
    time.sleep(600)
    """
)


@pytest.mark.slow
def test_without_prctl_the_worker_still_exits_with_its_parent(tmp_path: Path) -> None:
    parent = subprocess.Popen([sys.executable, "-c", _PARENT, _CHILD], stdout=subprocess.PIPE,
                              text=True, start_new_session=True)  # fmt: skip
    child = 0
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        time.sleep(1.5)  # the child imports and ties itself
        assert alive(child)
        parent.kill()
        parent.wait(timeout=30)
        assert wait_until(lambda: not alive(child), 5), "the child outlived its parent"
    finally:
        parent.kill()
        if child and alive(child):
            os.kill(child, signal.SIGKILL)


SWEEP = ["sweep", "-s", "smoke", "--device", "cpu", "--dtype", "fp32", "--mode", "fwd",
         "--seqlen", "40", "--head-dim", "16", "--batch", "1", "--heads", "2", "--kv-heads", "1",
         "--no-causal", "--block-m", "16,32", "--block-n", "16,32", "--warps", "4",
         "--stages", "1", *FAST]  # fmt: skip


@pytest.mark.slow
def test_sweep_stopped_by_sigterm_keeps_what_it_measured_and_resumes(tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.Popen([*CLI, *SWEEP, "--out", str(out)], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    journal = out / "journal.jsonl"
    measured = lambda: sum(  # noqa: E731
        json.loads(s)["status"] != "pruned" for s in journal.read_text().splitlines() if s
    ) if journal.exists() else 0  # fmt: skip
    try:
        wait_for(proc, lambda: measured() >= 1, 180, "no config measured")
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 143, stdout + stderr
    doc = json.loads((out / "sweep.json").read_text())
    assert doc["run"]["stopped"] == "interrupted"
    ok = {r["id"] for r in doc["rows"] if r["status"] == "ok"}
    assert 1 <= len(ok) < 5 and "SIGTERM" in stderr and "Traceback" not in stderr
    assert f"fa-bench sweep --resume {out}" in stderr.replace("\n", "")

    done = subprocess.run([*CLI, "sweep", "--resume", str(out)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    rows = json.loads((out / "sweep.json").read_text())["rows"]
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids)) and ok <= set(ids) and doc["run"]["points"] == len(ids)
    assert all(r["status"] in ("ok", "pruned") for r in rows)


@pytest.mark.slow
def test_closing_the_terminal_keeps_results(tmp_path: Path, tiny_suite) -> None:
    """The real SIGHUP: the run's terminal goes away (its pty is closed), so every later
    write to it fails; the results are still written and the exit is 129."""
    import pty
    import select

    suite = tiny_suite(["test-slow"], seqlens=[16, 24, 32, 40])
    out = tmp_path / "out"
    env = {**os.environ, "FA_BENCH_TEST_PID_FILE": str(tmp_path / "pids"),
           "FA_BENCH_TEST_SLEEP_S": "1.5"}  # fmt: skip
    args = ["run", "-s", str(suite), "--device", "cpu", "--plugin", SLOW_PLUGIN,
            "--out", str(out), "--no-report", *FAST]  # fmt: skip
    os.chdir(tmp_path)  # the child's working folder (pytest restores it)
    pid, master = pty.fork()  # the child leads a new session, the pty its terminal
    if pid == 0:
        os.execve(sys.executable, [*CLI, *args], env)
    deadline = time.monotonic() + 120
    try:
        while not read_journal(out) and time.monotonic() < deadline:
            if select.select([master], [], [], 0.1)[0]:
                try:
                    os.read(master, 65536)  # keep the pty drained, so the run never blocks
                except OSError:
                    break
        assert read_journal(out), "no case finished"
        time.sleep(0.3)
        os.close(master)  # the terminal goes away: the kernel sends SIGHUP
        master = -1
        status: list[int] = []

        def ended() -> bool:
            got, code = os.waitpid(pid, os.WNOHANG)
            status.extend([code] if got == pid else [])
            return bool(status)

        assert wait_until(ended, 60), "the run did not end after its terminal closed"
        pid = 0
    finally:
        if master >= 0:
            os.close(master)
        if pid:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status[0]) == 129
    partial = load_results(out)
    assert partial.run["interrupted"] is True and 1 <= len(partial.cases) < 4
    workers = set(pids(tmp_path / "pids"))
    assert wait_until(lambda: not any(alive(p) for p in workers), 5), workers


@pytest.mark.slow
def test_a_stop_signal_in_the_compile_phase_stops_the_builds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The sweep's builders are stopped with it (terminated), not waited for."""
    from fa_bench.sweep import precompile as sweep_compile
    from fa_bench.sweep.space import SweepSpace, sweep_points

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    seen: list = []  # the processes the phase stopped

    def children() -> list:
        kids = real()
        seen.extend(kids)
        return kids

    def stopped(*args: object, **kw: object) -> None:
        time.sleep(0.5)  # the builders have started (they are importing torch)
        raise Interrupted(signal.SIGTERM)

    real = sweep_compile.active_children
    monkeypatch.setattr(sweep_compile, "active_children", children)
    monkeypatch.setattr(sweep_compile, "_collect", stopped)
    space = SweepSpace(block_m=(16, 32), block_n=(16,), warps=(4,), stages=(1,))
    case = Case("triton", "fwd", "fp32", 1, 2, 2, 40, 40, 16, False)
    points = sweep_points([case], space, capability=None, smem_limit_bytes=None,
                          with_rules=False)  # fmt: skip
    with pytest.raises(KeyboardInterrupt):
        sweep_compile.precompile(sweep_compile.compile_groups(points), device="cpu", gpu=None,
                                 jobs=2)  # fmt: skip
    assert seen and all(p.exitcode == -signal.SIGTERM for p in seen)


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux's")
def test_a_sweep_builder_dies_with_the_sweep() -> None:
    """The builders' initializer asks for the parent-death signal (prctl's own answer)."""
    code = ("import ctypes; from fa_bench.sweep.precompile import _init; _init(None); "
            "v = ctypes.c_int(); ctypes.CDLL(None).prctl(2, ctypes.byref(v), 0, 0, 0); "
            "print(v.value)")  # fmt: skip
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    assert got.stdout.strip() == str(int(signal.SIGKILL)), got.stderr


@pytest.mark.slow
def test_a_worker_whose_reader_went_away_exits_without_a_traceback(tmp_path: Path) -> None:
    """Its protocol pipe broken (the runner gone), the worker's first write fails: a quiet
    exit, not a BrokenPipeError traceback in worker.log."""
    args = {"options": RunOptions(device="cpu", telemetry=False).to_dict(),
            "parent_pid": os.getpid()}  # fmt: skip
    log = tmp_path / "worker.log"
    with open(log, "wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "fa_bench.run.worker", json.dumps(args)],
                                cwd=tmp_path, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=err)  # fmt: skip
    assert proc.stdout is not None
    proc.stdout.close()  # nobody reads the protocol any more; stdin stays open
    try:
        proc.wait(timeout=120)  # it ends by itself, after its import, at its first write
    finally:
        proc.kill()
    stderr = log.read_text()
    assert "Traceback" not in stderr and "BrokenPipeError" not in stderr, stderr


@pytest.mark.slow
def test_a_worker_whose_runner_died_before_it_started_exits_at_once() -> None:
    """The runner died while the worker was starting, before prctl could take hold."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a PID that no longer runs: the runner, died meanwhile
    code = (f"from fa_bench.run.lifeline import Lifeline; Lifeline({gone.pid}).start(); "
            "import time; time.sleep(60)")  # fmt: skip
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE)
    try:
        assert child.wait(timeout=30) == 0  # at once and quietly, its stdin still open
    finally:
        child.kill()
