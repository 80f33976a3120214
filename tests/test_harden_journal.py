"""Issue 16, part J: the journal and the run folder survive torn lines, garbage, a full
disk, a second writer, repeated Ctrl-C, a flooding worker and a mangled plan.json."""

from __future__ import annotations

import errno
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import ClassVar

import pytest
from rich.console import Console

from fa_bench.case import Case, Status
from fa_bench.commands.run import RunRequest, run_command
from fa_bench.errors import UsageError
from fa_bench.results import files
from fa_bench.results.files import (
    JOURNAL,
    WRITE_ERROR_EXIT,
    append_journal,
    load_results,
    scan_journal,
)
from fa_bench.results.record import CaseRecord
from fa_bench.run import runner
from fa_bench.run.plan import PLAN, PLAN_SCHEMA, PlanError, load_plan, new_plan, save_plan
from fa_bench.run.runner import RunOptions, Worker


def _cases(n: int) -> list[Case]:
    return [Case("naive", "fwd", "fp32", 1, 2, 2, 16 * (i + 1), 16 * (i + 1), 8, i % 2 == 0)
            for i in range(n)]  # fmt: skip


def _record(case: Case, note: str = "fixture") -> CaseRecord:
    return CaseRecord.failed(case, Status.ERROR, note, "cpu")


def _folder(tmp_path: Path, n: int) -> tuple[Path, list[Case]]:
    """A run folder with a plan of `n` CPU cases and an empty journal."""
    out = tmp_path / "run"
    out.mkdir()
    cases = _cases(n)
    save_plan(out, new_plan(cases, RunOptions(device="cpu"), [], ["fa-bench", "run"]))
    return out, cases


def _resume(out: Path, **kw: object) -> tuple[int, str, str]:
    con, err = io.StringIO(), io.StringIO()
    req = RunRequest(resume=out, **{"report": False, **kw})  # type: ignore[arg-type]
    code = run_command(req, console=Console(file=con, width=300),
                       err_console=Console(file=err, width=300))  # fmt: skip
    return code, con.getvalue(), err.getvalue()


class _NoWorker:
    """Stands in for CaseRunner: records each case as an error without a subprocess."""

    ran: ClassVar[list[str]] = []

    def __init__(self, *args: object, **kw: object) -> None:
        self.env = None

    def run(self, case: Case, options: dict | None = None) -> CaseRecord:
        _NoWorker.ran.append(case.id)
        return _record(case, "rerun")

    def close(self, kill: bool = False) -> None:
        pass


@pytest.fixture
def no_worker(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    _NoWorker.ran = []
    monkeypatch.setattr(runner, "CaseRunner", _NoWorker)
    return _NoWorker.ran


# --- item 1: torn and garbage lines ---------------------------------------------------


@pytest.mark.parametrize("cut", [2, 41, 133])
def test_append_after_a_torn_tail_starts_a_new_line(tmp_path: Path, cut: int) -> None:
    cases = _cases(3)
    append_journal(tmp_path, _record(cases[0]))
    append_journal(tmp_path, _record(cases[1]))
    path = tmp_path / JOURNAL
    data = path.read_bytes()
    path.write_bytes(data[:-cut])  # the second record torn (a crash, a full disk)
    append_journal(tmp_path, _record(cases[2]))
    scan = scan_journal(tmp_path)
    assert [r.id for r in scan.records] == [cases[0].id, cases[2].id]
    assert [n for n, _ in scan.bad] == [2]
    assert path.read_bytes().startswith(data[:-cut] + b"\n")  # torn bytes kept, not glued


def test_bad_lines_anywhere_are_skipped_and_reported(tmp_path: Path) -> None:
    cases = _cases(3)
    good = [json.dumps(_record(c).to_json()) for c in cases]
    unknown_status = json.loads(good[1])
    unknown_status["status"] = "exploded"
    no_id = json.loads(good[2])
    del no_id["impl"]
    lines = [good[0], '"just a string"', '{"bar": [2]}', "[7, 8]", json.dumps(unknown_status),
             "\x00\xff garbage", json.dumps(no_id), "null", good[2]]  # fmt: skip
    (tmp_path / JOURNAL).write_bytes("\n".join(lines).encode("latin-1") + b"\n")
    scan = scan_journal(tmp_path)
    assert [r.id for r in scan.records] == [cases[0].id, cases[2].id]
    assert [n for n, _ in scan.bad] == [2, 3, 4, 5, 6, 7, 8]
    warning = scan.warning(tmp_path / JOURNAL)
    assert warning is not None and "7 unreadable" in warning and "2, 3, 4, 5, 6, 7, 8" in warning


def test_resume_over_bad_lines_reruns_their_cases_and_writes_results(
    tmp_path: Path, no_worker: list[str]
) -> None:
    out, cases = _folder(tmp_path, 4)
    for c in cases[:3]:
        append_journal(out, _record(c, "first run"))
    path = out / JOURNAL
    lines = path.read_text().splitlines()
    lines[1] = lines[1][:-17]  # case 1's record torn mid-file
    lines.insert(0, '{"status": "ok"}')
    path.write_text("\n".join(lines) + "\n")
    for _ in range(2):  # a second resume must work too
        code, _, err = _resume(out)
        assert code == 1, err  # every record is an `error`: exit 1, not a crash
        assert "skipped 2 unreadable lines" in err.replace("\n", "")
    assert no_worker == [cases[1].id, cases[3].id]  # the torn case and the missing one
    doc = load_results(out)
    assert [r.id for r in doc.cases] == [c.id for c in cases]  # each exactly once
    assert [r.error for r in doc.cases] == ["first run", "rerun", "first run", "rerun"]


def test_a_full_disk_is_a_clear_exit_keeping_the_journal(
    tmp_path: Path, no_worker: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    out, cases = _folder(tmp_path, 5)
    calls = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        calls.append(fd)
        if len(calls) > 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_fsync(fd)

    monkeypatch.setattr(files.os, "fsync", fsync)
    code, _, err = _resume(out)
    assert code == WRITE_ERROR_EXIT == 74
    flat = err.replace("\n", "")
    assert "No space left on device" in flat and f"fa-bench run --resume {out}" in flat
    assert "Traceback" not in err
    monkeypatch.setattr(files.os, "fsync", real_fsync)
    kept = [r.id for r in scan_journal(out).records]
    assert kept[:2] == [cases[0].id, cases[1].id]
    code, _, err = _resume(out)  # the disk has room again: the run finishes
    assert code == 1 and [r.id for r in load_results(out).cases] == [c.id for c in cases]


def test_results_write_error_is_a_write_error(tmp_path: Path) -> None:
    out, cases = _folder(tmp_path, 1)
    (out / "results.csv.tmp").mkdir()  # the CSV's temp path cannot be written
    with pytest.raises(files.JournalWriteError) as info:
        files.write_results(out, files.build_document({}, {}, [_record(cases[0])]))
    assert "results.csv" in str(info.value)


# --- item 6: one writer per run folder -----------------------------------------------

_HOLDER = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
os.write(fd, str(os.getpid()).encode())
print("locked", flush=True)
time.sleep(60)
"""


def _holder(out: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, str(out / "run.lock")],
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
    return proc


def test_a_second_writer_is_refused_naming_the_holder(tmp_path: Path, no_worker: list[str]) -> None:
    out, _ = _folder(tmp_path, 2)
    holder = _holder(out)
    try:
        code, _, err = _resume(out)
        assert code == 2 and f"PID {holder.pid}" in err.replace("\n", "")
        assert no_worker == [] and not (out / JOURNAL).exists()
    finally:
        holder.kill()  # SIGKILL: the kernel drops its flock with it
        holder.wait()
    code, _, err = _resume(out)
    assert code == 1 and len(no_worker) == 2, err


def test_the_lock_is_held_for_the_whole_run_and_released(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fa_bench.run.folder_lock import FolderBusy, FolderLock

    out, _ = _folder(tmp_path, 3)
    seen = []

    class Probe(_NoWorker):
        def run(self, case: Case, options: dict | None = None) -> CaseRecord:
            with pytest.raises(FolderBusy, match=f"PID {os.getpid()}"):
                FolderLock(out, "--resume").acquire()
            seen.append(case.id)
            return _record(case)

    monkeypatch.setattr(runner, "CaseRunner", Probe)
    assert _resume(out)[0] == 1 and len(seen) == 3
    with FolderLock(out):  # released at the end
        pass
    with pytest.raises(UsageError, match="cannot lock"):
        FolderLock(out / PLAN / "sub").acquire()  # a file where a folder is needed


# --- item 13: Ctrl-C three times, worker.log, plan.json ------------------------------


def test_three_sigints_still_write_json_and_csv(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import fa_bench.commands.run as run_cmd

    out, cases = _folder(tmp_path, 3)
    append_journal(out, _record(cases[0]))

    def interrupted_parts(parts: list, progress: object) -> list:
        try:
            os.kill(os.getpid(), signal.SIGINT)  # the first Ctrl-C stops the cases
            time.sleep(1)
        except KeyboardInterrupt:
            return [(None, True)]
        raise AssertionError("SIGINT did not interrupt")

    real_frame = files.to_frame

    def to_frame(doc: object) -> object:  # two more while results.csv is being written
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.1)
        return real_frame(doc)  # type: ignore[arg-type]

    monkeypatch.setattr(run_cmd, "run_parts", interrupted_parts)
    monkeypatch.setattr(files, "to_frame", to_frame)
    before = signal.getsignal(signal.SIGINT)
    code, _, err = _resume(out, report=True)
    assert code == 130
    assert (out / "results.json").exists() and (out / "results.csv").exists()
    assert len(load_results(out).cases) == 1
    flat = err.replace("\n", "")
    assert "report skipped" in flat and f"--resume {out}" in flat
    assert signal.getsignal(signal.SIGINT) is before  # the handler is restored


def test_worker_log_is_cut_to_its_tail_at_worker_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / runner.WORKER_LOG
    line = b"flood " * 20 + b"\n"
    with open(log, "wb") as f:
        for _ in range(runner.WORKER_LOG_MAX // len(line) + 1000):
            f.write(line)
        f.write(b"the last words\n")

    def no_spawn(*args: object, **kw: object) -> None:
        raise RuntimeError("no subprocess in this test")

    monkeypatch.setattr(runner.subprocess, "Popen", no_spawn)
    with pytest.raises(RuntimeError, match="no subprocess"):
        Worker(RunOptions(device="cpu"), tmp_path)
    data = log.read_bytes()
    assert len(data) <= runner.WORKER_LOG_KEEP + 100
    assert data.endswith(b"the last words\n")
    assert data.split(b"\n")[1] == line.rstrip(b"\n")  # cut at a line start


def test_a_small_worker_log_is_left_alone(tmp_path: Path) -> None:
    log = tmp_path / "w.log"
    log.write_bytes(b"x" * 5000)
    runner.trim_log(log, limit=5000, keep=100)
    assert log.read_bytes() == b"x" * 5000
    runner.trim_log(log, limit=4000, keep=100)
    assert log.read_bytes().endswith(b"x" * 100) and len(log.read_bytes()) < 200


def _mangle(doc: dict, how: str) -> object:
    if how == "top-level list":
        return [doc]
    if how == "run null, old schema":
        return {**doc, "schema": "fa-bench-plan/1", "run": None, "options": {}}
    if how == "run a string":
        return {**doc, "run": "yesterday"}
    if how == "run without resumed":
        run = dict(doc["run"])
        del run["resumed"]
        return {**doc, "run": {**run, "resumed": 5}}
    if how == "cases a dict":
        return {**doc, "cases": {"a": 1}}
    if how == "a case a number":
        return {**doc, "cases": [3]}
    if how == "options a list":
        return {**doc, "run": {**doc["run"], "options": [1]}}
    if how == "suites a string":  # would fail only when results.json is written, after the run
        return {**doc, "run": {**doc["run"], "suites": "smoke"}}
    if how == "env a number":
        return {**doc, "run": {**doc["run"], "env": 12}}
    raise AssertionError(how)


@pytest.mark.parametrize("how", ["top-level list", "run null, old schema", "run a string",
                                 "run without resumed", "cases a dict", "a case a number",
                                 "options a list", "suites a string", "env a number"])  # fmt: skip
def test_a_mangled_plan_is_exit_2_naming_plan_json(
    tmp_path: Path, how: str, no_worker: list[str]
) -> None:
    out, _ = _folder(tmp_path, 2)
    doc = json.loads((out / PLAN).read_text())
    assert doc["schema"] == PLAN_SCHEMA
    (out / PLAN).write_text(json.dumps(_mangle(doc, how)))
    with pytest.raises(PlanError, match=r"plan\.json"):
        load_plan(out)
    code, _, err = _resume(out)
    assert code == 2 and "plan.json" in err and no_worker == []


def test_a_mangled_layout_is_exit_2(tmp_path: Path) -> None:
    out, _ = _folder(tmp_path, 1)
    (out / "layout.json").write_text(json.dumps([{"kind": "gpu", "parts": [0]}]))
    code, _, err = _resume(out)
    assert code == 2 and "layout.json" in err


# --- end to end, with the real worker ------------------------------------------------


@pytest.mark.slow
def test_a_run_with_a_torn_and_a_foreign_line_resumes_to_each_case_once(tmp_path: Path) -> None:
    from conftest import FAST
    from typer.testing import CliRunner

    from fa_bench.cli import app

    out = tmp_path / "e2e"
    args = ["run", "--impl", "naive", "--impl", "sdpa-math", "--mode", "fwd", "--dtype", "fp32",
            "--seqlen", "32", "--seqlen", "48", "--head-dim", "16", "--heads", "2", "--batch",
            "1", "--no-report", "--out", str(out), *FAST]  # fmt: skip
    first = CliRunner().invoke(app, args)
    assert first.exit_code == 0, first.output
    planned = json.loads((out / PLAN).read_text())["cases"]
    path = out / JOURNAL
    data = path.read_bytes()
    lines = data.splitlines(keepends=True)
    # The third record loses its last 29 bytes mid-file; a foreign object joins at the top.
    lines[2] = lines[2][:-30] + b"\n"
    path.write_bytes(b'{"id": "x", "status": "fine"}\n' + b"".join(lines)[:-11])
    for _ in range(2):
        again = CliRunner().invoke(app, ["run", "--resume", str(out), "--no-report"])
        assert again.exit_code == 0, again.output
        assert "unreadable line" in again.output
    ids = [r.id for r in load_results(out).cases]
    assert len(ids) == len(set(ids)) == len(planned)
    journaled = [r.id for r in scan_journal(out).records]  # the torn case ran once more, once
    assert sorted(journaled) == sorted(ids)


def test_a_write_error_in_another_command_is_exit_74(monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    import fa_bench.cli as cli

    def full_disk(*args: object, **kw: object) -> int:
        raise files.JournalWriteError(errno.EDQUOT, "cannot write S/journal.jsonl: quota gone")

    monkeypatch.setattr(cli, "sweep_command", full_disk)
    result = CliRunner().invoke(cli.app, ["sweep", "--device", "cpu"])
    assert result.exit_code == WRITE_ERROR_EXIT
    assert "S/journal.jsonl: quota gone" in result.output and "internal error" not in result.output


def test_sweep_refuses_a_folder_another_process_writes(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from fa_bench.cli import app

    out = tmp_path / "sweep-here"
    out.mkdir()
    holder = _holder(out)
    try:
        result = CliRunner().invoke(app, ["sweep", "--device", "cpu", "--out", str(out),
                                          "--seqlen", "64", "--head-dim", "16"])  # fmt: skip
        assert result.exit_code == 2, result.output
        assert f"PID {holder.pid}" in result.output.replace("\n", "")
        assert not (out / JOURNAL).exists()
    finally:
        holder.kill()
        holder.wait()


def test_a_write_error_on_one_gpu_stops_the_parts_and_is_raised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fa_bench.run import multi

    stopped = []

    def run_plan(plan: object, out: Path, on_event: object, stop: object = None) -> tuple:
        if out.name == "gpu1":
            raise files.JournalWriteError(errno.ENOSPC, f"cannot write {out}/journal.jsonl")
        while not stop.is_set():  # type: ignore[attr-defined]
            time.sleep(0.01)
        stopped.append(out.name)
        return None, True

    monkeypatch.setattr(multi, "run_plan", run_plan)
    parts = [multi.Part(i, None, tmp_path / f"gpu{i}") for i in (0, 1, 2)]  # type: ignore[arg-type]
    with pytest.raises(files.JournalWriteError, match=r"gpu1/journal\.jsonl"):
        multi.run_parts(parts, None)
    assert sorted(stopped) == ["gpu0", "gpu2"]


def test_ctrl_c_may_end_the_wait_for_other_ranks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import fa_bench.commands.run as run_cmd
    from fa_bench.run.distributed import Rank
    from fa_bench.run.interrupts import InterruptGuard

    raising = []

    def waiting(*args: object, **kw: object) -> None:
        raising.append(guard.raising)
        raise KeyboardInterrupt

    monkeypatch.setattr(run_cmd, "wait_and_merge", waiting)
    guard = InterruptGuard()
    guard.hold()
    rank = Rank(rank=0, world_size=2, local_rank=0, launcher="torchrun")
    req = RunRequest(merge_timeout_s=5.0)
    quiet = Console(file=io.StringIO())
    merged = run_cmd._merge(req, "rank", False, [], rank, tmp_path, guard, False, quiet)
    assert merged is None
    assert raising == [True] and guard.raising is False  # held again for the writing


def test_a_journal_that_cannot_be_read_is_exit_2(tmp_path: Path, no_worker: list[str]) -> None:
    out, _ = _folder(tmp_path, 2)
    (out / JOURNAL).mkdir()  # a folder where the journal should be
    code, _, err = _resume(out)
    assert code == 2 and "journal.jsonl" in err and no_worker == []


@pytest.mark.slow
@pytest.mark.parametrize("after_s", [0.15, 0.4])
def test_ctrl_c_while_the_app_imports_is_a_quiet_130(tmp_path: Path, after_s: float) -> None:
    """The console script's import of the app (torch: about a second) is interruptible
    without a traceback; a later signal reaches the app's own handling (also 130)."""
    script = "from fa_bench.entry import main; main()"
    args = ["run", "-s", "smoke", "--no-report", "-o", str(tmp_path / "out")]
    proc = subprocess.Popen([sys.executable, "-c", script, *args], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    time.sleep(after_s)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err, err
