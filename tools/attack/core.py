"""The attack harness's model: one hostile input (`Attack`), how it is run, and how its
outcome is judged (`Outcome`).

An attack is a list of steps (each one `fa-bench` command line, or a signal sent to the
step before it) run in a fresh work folder, with the exit codes each step may end with.
The outcome counts what the issue asks for: Python tracebacks in any output, cases lost
(a planned case absent from results.json, or present twice), and exit codes outside the
expected set; `checks` add findings of their own (a status, an escaped string).
"""

from __future__ import annotations

import json
import os
import re
import resource
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

TRACEBACK = "Traceback (most recent call last)"
# cli.py's message for an exception that escaped a command: a bug even without --debug.
INTERNAL = "internal error (a bug in fa-bench)"
FAST = ["--max-time", "0.05", "--min-samples", "3", "--warmup", "0", "--no-report",
        "--no-telemetry"]  # fmt: skip
BAD_INPUT = frozenset({2})
RAN = frozenset({0, 1})  # a run whose cases may fail: they are recorded results


@dataclass
class Step:
    """One command (`argv` after `fa-bench`; "{d}" is the work folder) and how it may end.

    `signals`: (when, signal) pairs sent to its process group; `when` is seconds after the
    start, or "journal:N" (once the run folder's journal holds N lines). `background`: start
    it and go on with the next step at once (two writers at the same time)."""

    argv: list[str]
    expect: frozenset[int] = BAD_INPUT
    signals: list[tuple[str, int]] = field(default_factory=list)
    background: bool = False
    limits: dict[int, int] = field(default_factory=dict)  # resource.RLIMIT_* -> soft/hard
    action: Callable[[Path], None] | None = None  # done in the work folder before the command


@dataclass
class Attack:
    category: str
    name: str
    steps: list[Step]
    setup: Callable[[Path], None] | None = None
    # A run folder (relative to the work folder) whose planned cases must all be in its
    # results.json exactly once after the last step.
    keeps: str | None = None
    checks: list[Callable[[Path, str], list[str]]] = field(default_factory=list)
    timeout_s: float = 60.0


@dataclass
class Outcome:
    category: str
    name: str
    argv: list[list[str]]
    exit_codes: list[int | None]
    tracebacks: int = 0  # steps whose output held a traceback or cli.py's internal error
    lost: int = 0
    unexpected: list[str] = field(default_factory=list)
    findings: list[str] = field(default_factory=list)
    seconds: float = 0.0
    output_tail: str = ""

    @property
    def clean(self) -> bool:
        return not (self.tracebacks or self.lost or self.unexpected or self.findings)


_TAG = re.compile(r"\[/?[\w#.= -]*\]")


def shows(text: str) -> Callable[[Path, str], list[str]]:
    """A check: where the output quotes `text`, it quotes it as written. A finding when
    the text with its bracketed tags removed (what Rich prints of markup) is there but the
    text itself is not; nothing when the message does not quote it at all."""

    def check(work: Path, output: str) -> list[str]:
        want = text.replace("{d}", str(work))
        eaten = _TAG.sub("", want)
        if want in output or len(eaten) < 3 or eaten not in output:
            return []
        return [f"markup eaten: output shows {eaten!r} for {want!r}"]

    return check


def _fill(argv: list[str], work: Path) -> list[str]:
    return [a.replace("{d}", str(work)) for a in argv]


def _journal_lines(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except OSError:
        return 0


def _wait_for(when: str, start: float, journal: Path, proc: subprocess.Popen, limit: float) -> None:
    while proc.poll() is None and time.monotonic() - start < limit:
        if when.startswith("journal:"):
            if _journal_lines(journal) >= int(when.split(":")[1]):
                return
        elif time.monotonic() - start >= float(when):
            return
        time.sleep(0.02)


def _start(step: Step, exe: list[str], work: Path, env: dict[str, str]) -> subprocess.Popen:
    def limit() -> None:
        for which, value in step.limits.items():
            resource.setrlimit(which, (value, value))

    return subprocess.Popen(
        [*exe, *_fill(step.argv, work)], cwd=work, env=env, stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
        preexec_fn=limit if step.limits else None,
    )  # fmt: skip


def _finish(proc: subprocess.Popen, deadline: float) -> tuple[int | None, str]:
    try:
        out, _ = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
        return proc.returncode, out.decode("utf-8", "replace")
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the process group we started, workers too
        out, _ = proc.communicate()
        return None, out.decode("utf-8", "replace")


def run_attack(attack: Attack, work: Path, exe: list[str]) -> Outcome:
    """Run every step of `attack` in `work` and judge the result."""
    start = time.monotonic()
    work.mkdir(parents=True, exist_ok=True)
    if attack.setup is not None:
        attack.setup(work)
    env = {**os.environ, "COLUMNS": "400", "PYTHONUNBUFFERED": "1"}
    out = Outcome(attack.category, attack.name, [_fill(s.argv, work) for s in attack.steps], [])
    deadline = start + attack.timeout_s
    texts: list[str] = []
    pending: list[tuple[Step, subprocess.Popen]] = []
    journal = work / (attack.keeps or "out") / "journal.jsonl"
    for step in attack.steps:
        if step.action is not None:
            step.action(work)
        proc = _start(step, exe, work, env)
        for when, sig in step.signals:
            _wait_for(when, time.monotonic(), journal, proc, deadline - time.monotonic())
            if proc.poll() is None:
                os.killpg(proc.pid, sig)
        if step.background:
            pending.append((step, proc))
            continue
        for s, p in [*pending, (step, proc)]:
            code, text = _finish(p, deadline)
            judge(out, s, code, text)
            texts.append(text)
        pending = []
    for s, p in pending:
        code, text = _finish(p, deadline)
        judge(out, s, code, text)
        texts.append(text)
    if attack.keeps is not None:
        out.lost, note = lost_cases(work / attack.keeps)
        if note:
            out.findings.append(note)
    joined = "\n".join(texts)
    for check in attack.checks:
        out.findings.extend(check(work, joined))
    out.seconds = round(time.monotonic() - start, 2)
    out.output_tail = joined[-1500:]
    return out


def judge(out: Outcome, step: Step, code: int | None, text: str) -> None:
    """Count one finished step: its exit code, a traceback in its output."""
    out.exit_codes.append(code)
    if TRACEBACK in text or INTERNAL in text:
        out.tracebacks += 1
    if code is None:
        out.unexpected.append(f"step {len(out.exit_codes)}: timed out")
    elif code not in step.expect:
        want = "/".join(str(c) for c in sorted(step.expect))
        out.unexpected.append(f"step {len(out.exit_codes)}: exit {code}, expected {want}")


def _case_key(d: dict, keys: list[str]) -> str:
    return json.dumps([d.get(k) for k in keys])


def lost_cases(folder: Path) -> tuple[int, str]:
    """(planned cases absent from results.json or present more than once, a note)."""
    try:
        plan = json.loads((folder / "plan.json").read_text())
        planned = plan["cases"]
    except (OSError, ValueError, KeyError, TypeError):
        return 0, ""  # nothing was planned: nothing to lose
    if not planned:
        return 0, ""
    keys = sorted(planned[0])
    try:
        cases = json.loads((folder / "results.json").read_text())["cases"]
        got = [_case_key(c, keys) for c in cases]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return len(planned), f"results.json unreadable or absent ({type(exc).__name__})"
    counts = Counter(got)
    lost = sum(1 for c in planned if counts[_case_key(c, keys)] != 1)
    note = f"{lost} of {len(planned)} planned cases missing or duplicated" if lost else ""
    return lost, note
