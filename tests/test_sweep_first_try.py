"""`fa-bench sweep` on the first try (issue 15, items 4 and 9): the plan and its estimate
before the first config, one progress line per config in a log, `sweep --resume`, comma
lists and repeated flags alike, a fully pruned space refused, a CPU without --device cpu
refused.

Most tests replace the timing worker with `FakeRunner` (in process, instant): what is
tested is the command around it, which the worker does not change. The slow test at the
end runs the real worker under Triton's CPU interpreter and interrupts it.
"""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import ClassVar

import pytest
from rich.console import Console
from typer.testing import CliRunner

from fa_bench import cli
from fa_bench.case import Case, Status
from fa_bench.results.files import JOURNAL
from fa_bench.results.record import CaseRecord, Latency
from fa_bench.run.runner import RunOptions
from fa_bench.run.timing import TimingConfig
from fa_bench.sweep import execute as sweep_execute
from fa_bench.sweep.plan import CPU_SPACE, SWEEP_PLAN, describe_estimate, estimate_s
from fa_bench.sweep.progress import SweepProgress
from fa_bench.sweep.space import Point

# One shape, forward only: the heuristic's config, the 2 × 2 product and the rules' tile
# (pruned: longer than the 64-token sequence).
SMALL = ["sweep", "--device", "cpu", "-s", "smoke", "--mode", "fwd", "--dtype", "fp32",
         "--seqlen", "64", "--head-dim", "32", "--batch", "1", "--heads", "2",
         "--kv-heads", "2", "--no-causal"]  # fmt: skip
PROGRESS_LINE = re.compile(r"^sweep (\d+)/(\d+) \d+:\d\d:\d\d eta \d+:\d\d:\d\d ", re.M)


class FakeRunner:
    """CaseRunner's interface without a worker: a config's latency is its tile area, so
    the best is known; `interrupt_after` raises KeyboardInterrupt (a Ctrl-C) at that run.
    `runs` lists every config that finished, over every sweep of the test."""

    runs: ClassVar[list[str]] = []
    interrupt_after: ClassVar[int | None] = None
    seen_output: ClassVar[list[str]] = []  # what stdout held when the first config started

    def __init__(self, opts: RunOptions, out_dir: Path, stop: object = None) -> None:
        self.env = {"hostname": "fake", "gpus": []}

    def run(self, case: Case, options: dict | None = None) -> CaseRecord:
        cls = type(self)
        if not cls.seen_output:
            cls.seen_output.append(sys.stdout.buffer.getvalue().decode())  # type: ignore[attr-defined]
        if cls.interrupt_after is not None and len(cls.runs) >= cls.interrupt_after:
            cls.interrupt_after = None
            raise KeyboardInterrupt
        fields = (options or {})["config"]
        ms = fields["block_m"] * fields["block_n"] / 1000
        cls.runs.append(f"{case.id}#{fields}")
        lat = Latency(ms, ms, ms, ms, ms, ms, 0.0, 3, [ms] * 3, 0.001)
        return CaseRecord.for_case(case, "cpu", Status.OK, latency_ms=lat, tflops=1 / ms,
                                   backend="triton (sweep)", accuracy={"passed": True})  # fmt: skip

    def close(self, kill: bool = False) -> None:
        pass


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> type[FakeRunner]:
    FakeRunner.runs, FakeRunner.interrupt_after, FakeRunner.seen_output = [], None, []
    monkeypatch.setattr(sweep_execute, "CaseRunner", FakeRunner)
    return FakeRunner


def _sweep(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli.app, list(args))
    return result.exit_code, result.output


def _doc(out: Path) -> dict:
    return json.loads((out / "sweep.json").read_text())


def test_plan_and_estimate_are_printed_before_the_first_config(
    tmp_path: Path, fake: type[FakeRunner]
) -> None:
    code, text = _sweep(*SMALL, "--out", str(tmp_path / "s"))
    assert code == 0, text
    before = fake.seen_output[0]
    # cases × configs, what is measured and pruned (and why), the estimate and its terms
    assert "1 case × up to 4 configs" in before and "= 6 points: 5 to measure" in before
    assert "1 pruned (redundant 1)" in before
    assert "estimate: at most about" in before and "--max-time 1 s" in before
    assert "--timeout 300 s" in before and "interpreter" in before
    assert "sweep 1/" not in before  # said before any config ran


def test_the_estimate_is_made_of_the_options() -> None:
    opts = RunOptions(device="cuda", timing=TimingConfig(max_time_s=2.0, warmup_ms=500.0),
                      timeout_s=300.0)  # fmt: skip
    # 5 s worker start + 12 builds × 3 s over 4 processes + 100 × (0.5 + 2 + 0.5)
    assert estimate_s(100, 12, 4, opts) == pytest.approx(5 + 9 + 300)
    line = describe_estimate(100, 12, 4, opts, budget_minutes=3)
    assert "at most about 5 min" in line and "--budget-minutes 3 stops it" in line
    assert estimate_s(0, 12, 4, opts) == 0


def test_progress_in_a_log_is_one_plain_line_per_config(
    tmp_path: Path, fake: type[FakeRunner]
) -> None:
    code, text = _sweep(*SMALL, "--out", str(tmp_path / "s"))
    assert code == 0, text
    lines = PROGRESS_LINE.findall(text)
    assert [int(done) for done, _ in lines] == [1, 2, 3, 4, 5]
    assert {total for _, total in lines} == {"5"}
    assert "\x1b[" not in text  # no live display's escape codes in a log
    last = next(x for x in text.splitlines() if x.startswith("sweep 5/5"))
    # latency is the tile area / 1000 ms: bm16-bn16 (0.256 ms) is the best
    assert "bm32-bn32-w4-s1 ok 1.02 ms · best bm16-bn16-w4-s1 256 µs" in last
    # the closing summary is a line per case, its case id whole
    case_id = _doc(tmp_path / "s")["cases"][0]["case_id"]
    assert f"best {case_id}: bm16-bn16-w4-s1" in text


def test_on_a_terminal_progress_stays_the_live_bar() -> None:
    console = Console(force_terminal=True, width=80, record=True)
    case = Case("triton", "fwd", "fp32", 1, 2, 2, 64, 64, 32, False)
    point = Point(case, {"block_m": 16, "block_n": 16, "num_warps": 4, "num_stages": 1}, False)
    row = {"id": point.id, "case_id": case.id, "label": point.label, "status": "ok",
           "error": None, "latency_ms": {"median": 1.0}}  # fmt: skip
    with SweepProgress(console, total=1) as progress:
        assert progress.bar is not None
        progress("start", point, None)
        progress("done", point, row)
    assert not PROGRESS_LINE.search(console.export_text())


def test_resume_finishes_an_interrupted_sweep_with_each_config_once(
    tmp_path: Path, fake: type[FakeRunner]
) -> None:
    out = tmp_path / "s"
    fake.interrupt_after = 2  # Ctrl-C while the third config runs
    code, text = _sweep(*SMALL, "--out", str(out))
    assert code == 130, text
    assert f"finish with: fa-bench sweep --resume {out}" in text.replace("\n", "")
    partial = _doc(out)  # the configs measured so far are kept in sweep.json
    assert partial["run"]["stopped"] == "interrupted" and partial["run"]["measured"] == 2
    assert (out / SWEEP_PLAN).exists()

    code, text = _sweep("sweep", "--resume", str(out))
    assert code == 0, text
    # the rules' pruned tile comes last: not journaled yet
    assert "resuming: 2 points already in the journal, 3 to measure" in text
    doc = _doc(out)
    ids = [r["id"] for r in doc["rows"]]
    assert len(ids) == len(set(ids)) == doc["run"]["points"] == 6
    assert doc["run"]["stopped"] is None and len(doc["run"]["resumed"]) == 1
    assert sorted(fake.runs) == sorted(set(fake.runs)) and len(fake.runs) == 5
    assert doc["cases"][0]["best"] == "bm16-bn16-w4-s1"
    # the journal holds both calls' rows, once each
    journal = [json.loads(x)["id"] for x in (out / JOURNAL).read_text().splitlines()]
    assert sorted(journal) == sorted(ids)


def test_resume_takes_the_sweeps_own_options_and_refuses_others(
    tmp_path: Path, fake: type[FakeRunner]
) -> None:
    out, cache = tmp_path / "s", tmp_path / "tuning.json"
    fake.interrupt_after = 1
    save = ["--save-best", "--min-gain", "0", "--tuning-cache", str(cache)]
    assert _sweep(*SMALL, *save, "--max-time", "0.05", "--out", str(out))[0] == 130
    assert not cache.exists()  # an interrupted sweep saves nothing: its best is not known
    code, text = _sweep("sweep", "--resume", str(out), "--seqlen", "128", "--block-m", "64")
    assert code == 2, text
    assert "drop --seqlen, --block-m" in text
    code, text = _sweep("sweep", "--resume", str(tmp_path / "nothing"))
    assert code == 2 and "not a folder" in text
    empty = tmp_path / "empty"
    empty.mkdir()
    code, text = _sweep("sweep", "--resume", str(empty))
    assert code == 2 and "no sweep-plan.json there" in text
    # a new sweep into the folder is refused: it holds one to resume
    code, text = _sweep(*SMALL, "--out", str(out))
    assert code == 2 and f"--resume {out}" in text.replace("\n", "")
    # --budget-minutes is this call's stop rule, so it may be given; the rest is the plan's
    code, text = _sweep("sweep", "--resume", str(out), "--budget-minutes", "5")
    assert code == 0, text
    doc = _doc(out)
    assert doc["run"]["timing"]["max_time_s"] == 0.05 and doc["run"]["budget_minutes"] == 5
    # --save-best of the plan, done when the sweep is complete
    entries = json.loads(cache.read_text())["entries"]
    assert [e["config"]["block_m"] for e in entries] == [16]


def test_comma_lists_and_repeated_flags_plan_the_same_sweep(
    tmp_path: Path, fake: type[FakeRunner]
) -> None:
    comma = ["--block-m", "16,32", "--block-n", "16,32", "--warps", "2,4", "--stages", "1,2"]
    repeated = ["--block-m", "16", "--block-m", "32", "--block-n", "16", "--block-n", "32",
                "--warps", "2", "--warps", "4", "--stages", "1", "--stages", "2"]  # fmt: skip
    mixed = ["--block-m", "16", "--block-m", "32", "--block-n", "16,32", "--warps", "2,4",
             "--stages", "1", "--stages", "2"]  # fmt: skip
    plans = []
    for i, flags in enumerate((comma, repeated, mixed)):
        code, text = _sweep(*SMALL, *flags, "--out", str(tmp_path / str(i)))
        assert code == 0, text
        plan = json.loads((tmp_path / str(i) / SWEEP_PLAN).read_text())
        plans.append((plan["run"]["space"], [p["fields"] for p in plan["points"]]))
    assert plans[0] == plans[1] == plans[2]
    assert plans[0][0] == {"block_m": [16, 32], "block_n": [16, 32], "warps": [2, 4],
                           "stages": [1, 2]}  # fmt: skip
    code, text = _sweep(*SMALL, "--warps", "4,x", "--out", str(tmp_path / "bad"))
    assert code == 2 and "--warps" in text and "'x'" in text


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--block-m", "512"], "--block-m 512"),  # past FlashConfig's largest tile
        (["--block-m", "17,33"], "--block-m 17,33"),  # not powers of two
        (["--block-m", "128", "--block-n", "128"], "--block-m 128"),  # longer than 64 tokens
        (["--warps", "3"], "--warps 3"),
    ],
)
def test_a_space_pruned_for_every_case_exits_2_naming_the_flag(
    tmp_path: Path, fake: type[FakeRunner], flags: list[str], named: str
) -> None:
    out = tmp_path / "s"
    code, text = _sweep(*SMALL, *flags, "--out", str(out))
    assert code == 2, text
    assert named in text and "pruned for every case" in text
    assert not fake.runs and not (out / "sweep.json").exists() and not (out / JOURNAL).exists()


def test_without_a_gpu_the_sweep_asks_for_device_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    code, text = _sweep("sweep")
    assert code == 2, text
    flat = " ".join(text.split())
    assert "interpreter" in flat and "pass --device cpu" in flat


def test_device_cpu_sweeps_a_tiny_default_space(tmp_path: Path, fake: type[FakeRunner]) -> None:
    code, text = _sweep(*SMALL, "--no-rules", "--out", str(tmp_path / "s"))
    assert code == 0, text
    plan = json.loads((tmp_path / "s" / SWEEP_PLAN).read_text())
    assert plan["run"]["space"] == CPU_SPACE.to_dict()
    assert len(plan["points"]) == 1 + CPU_SPACE.size  # the heuristic's + 2 × 2 tiles


@pytest.mark.slow
def test_interrupted_interpreter_sweep_resumes_end_to_end(tmp_path: Path) -> None:
    """The real worker under the CPU interpreter, output to a pipe (a log): one line per
    config as it finishes, Ctrl-C after the second, then --resume finishes the rest."""
    out = tmp_path / "s"
    env = {**os.environ, "COLUMNS": "80"}
    argv = [sys.executable, "-m", "fa_bench.cli", *SMALL, "--max-time", "0.05",
            "--min-samples", "3", "--target-noise", "0.2", "--out", str(out)]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                            text=True)  # fmt: skip
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:  # lines arrive while it runs: a log shows progress
        seen.append(line)
        if line.startswith("sweep 2/5"):
            proc.send_signal(signal.SIGINT)
            break
    rest = proc.communicate(timeout=120)[0]
    text = "".join(seen) + rest
    assert proc.returncode == 130, text
    assert "fa-bench sweep --resume" in text
    first = _doc(out)["run"]["measured"]
    assert 2 <= first < 5
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "fa_bench.cli", "sweep", "--resume", str(out)],
                          capture_output=True, text=True, env=env, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert time.monotonic() - t0 < 300
    doc = _doc(out)
    ids = [r["id"] for r in doc["rows"]]
    assert len(ids) == len(set(ids)) == 6 and doc["run"]["measured"] == 5
    assert all(r["status"] in ("ok", "pruned") for r in doc["rows"])
    assert f"sweep {first + 1}/5" in done.stdout and "sweep 5/5" in done.stdout


def test_resume_skips_torn_or_foreign_journal_lines_and_measures_those_points_again(
    tmp_path: Path, fake: type[FakeRunner]
) -> None:
    out = tmp_path / "s"
    fake.interrupt_after = 3
    assert _sweep(*SMALL, "--out", str(out))[0] == 130
    journal = out / JOURNAL
    lines = journal.read_text().splitlines()
    first = json.loads(lines[0])
    wrong = {**json.loads(lines[1]), "case_id": "another/case"}  # not this plan's row
    journal.write_text("\n".join([lines[0], json.dumps(wrong), '{"id": "x"}', lines[2][:20]])
                       + "\n")  # fmt: skip
    code, text = _sweep("sweep", "--resume", str(out))
    assert code == 0, text
    assert "3 lines skipped" in text and "resuming: 1 point already" in text
    doc = _doc(out)
    assert len({r["id"] for r in doc["rows"]}) == len(doc["rows"]) == 6
    assert next(r for r in doc["rows"] if r["id"] == first["id"]) == first  # kept as it was


def test_resume_of_a_broken_plan_exits_2_naming_the_file(
    tmp_path: Path, fake: type[FakeRunner]
) -> None:
    out = tmp_path / "s"
    fake.interrupt_after = 1
    assert _sweep(*SMALL, "--out", str(out))[0] == 130
    plan = json.loads((out / SWEEP_PLAN).read_text())
    for key, value in (("compile_jobs", "x"), ("space", {"block_m": [0]})):
        broken = {**plan, "run": {**plan["run"], key: value}}
        (out / SWEEP_PLAN).write_text(json.dumps(broken))
        code, text = _sweep("sweep", "--resume", str(out))
        assert code == 2, text
        assert f"{SWEEP_PLAN}: invalid plan" in text.replace("\n", "")
    # planned on a GPU, resumed where there is none: refused before any point runs
    (out / SWEEP_PLAN).write_text(json.dumps({**plan, "options": {**plan["options"],
                                                                  "device": "cuda"}}))  # fmt: skip
    code, text = _sweep("sweep", "--resume", str(out))
    flat = " ".join(text.split())
    assert code == 2 and f"--resume {out}: planned on GPU 0, but here no CUDA device" in flat
    assert len(fake.runs) == 1  # the first call's config only


def test_the_compile_phase_in_a_log_prints_a_line_per_tenth(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from fa_bench.sweep import precompile as sweep_compile
    from fa_bench.sweep.space import SweepSpace, sweep_points

    def fake_precompile(groups: list, *, on_progress: object, **kw: object) -> tuple[dict, dict]:
        n = len(groups)
        for done in [1, 2, 2, *range(3, n + 1)]:  # a wait that ended with nothing new: 2 twice
            on_progress(done, n)  # type: ignore[operator]
        return {}, {"built": n, "failed": 0, "wall_s": 1.0, "stopped": None}

    monkeypatch.setattr(sweep_compile, "precompile", fake_precompile)
    cases = [Case("triton", "fwd", "fp32", 1, 2, 2, 256, 256, 32, False)]
    space = SweepSpace(block_m=(16, 32, 64, 128, 256), block_n=(16, 32, 64, 128, 256),
                       warps=(4,), stages=(1,))  # fmt: skip
    points = sweep_points(cases, space, capability=None, smem_limit_bytes=None, with_rules=False)
    n = len(sweep_compile.compile_groups(points))
    assert n >= 20
    console = Console(file=io.StringIO(), width=80)  # not a terminal
    opts = RunOptions(device="cuda", timeout_s=300.0)
    sweep_compile.compile_phase(2, points, opts, None, console, console)
    text = console.file.getvalue()  # type: ignore[attr-defined]
    lines = [int(d) for d in re.findall(rf"^compiling (\d+)/{n} groups, \d+ s$", text, re.M)]
    step = n // 10
    assert lines == sorted({*range(step, n + 1, step), n})  # each once, about ten in all
    assert "\x1b[" not in text and f"compiled {n} configs" in text
