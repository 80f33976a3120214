"""The attack harness (tools/attack/) counts what it is shown: tracebacks, lost cases and
exit codes outside the expected set. The fast tests feed its judging functions made-up
outcomes; the slow ones run it against a fake `fa-bench` (a script whose misbehaviour is
known) and, briefly, against the real one."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOOL = ROOT / "tools" / "attack"


@pytest.fixture(scope="module")
def harness():
    """The harness's modules (a developer tool, not installed: imported from its folder)."""
    sys.path.insert(0, str(TOOL))
    try:
        import attack
        import core

        yield core, attack
    finally:
        sys.path.remove(str(TOOL))
        for name in ("attack", "core", "gen_faults", "gen_files", "gen_flags", "gen_suites"):
            sys.modules.pop(name, None)  # top-level names of a tool: not for other tests


def _write_run(folder: Path, planned: list[int], recorded: list[int]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    case = {"impl": "x", "mode": "fwd", "seqlen_q": 0}
    (folder / "plan.json").write_text(
        json.dumps({"cases": [dict(case, seqlen_q=n) for n in planned]})
    )
    cases = [dict(case, seqlen_q=n, status="ok") for n in recorded]
    (folder / "results.json").write_text(json.dumps({"cases": cases}))


def test_judge_counts_tracebacks_and_unexpected_exit_codes(harness) -> None:
    core, _ = harness
    out = core.Outcome("c", "n", [], [])
    step = core.Step(["run"], frozenset({2}))
    core.judge(out, step, 2, "error: bad value")
    core.judge(out, step, 1, f"x\n{core.TRACEBACK}\n  File ...")
    core.judge(out, step, 1, f"error: {core.INTERNAL}: KeyError")
    core.judge(out, step, None, "")
    assert out.exit_codes == [2, 1, 1, None]
    assert out.tracebacks == 2
    assert out.unexpected == [
        "step 2: exit 1, expected 2",
        "step 3: exit 1, expected 2",
        "step 4: timed out",
    ]


def test_lost_cases_counts_missing_and_duplicated_cases(harness, tmp_path: Path) -> None:
    core, _ = harness
    _write_run(tmp_path / "a", [5, 6, 7, 8], [5, 6, 7, 8])
    assert core.lost_cases(tmp_path / "a") == (0, "")
    _write_run(tmp_path / "b", [5, 6, 7, 8], [8, 6, 6, 9])  # 5 and 7 missing, 6 twice
    lost, note = core.lost_cases(tmp_path / "b")
    assert lost == 3 and "3 of 4" in note
    _write_run(tmp_path / "c", [1, 2], [])
    (tmp_path / "c" / "results.json").unlink()  # a run that never wrote its results
    assert core.lost_cases(tmp_path / "c")[0] == 2
    assert core.lost_cases(tmp_path / "never-planned") == (0, "")


def test_shows_tells_eaten_markup_from_text_not_quoted(harness) -> None:
    core, _ = harness
    check = core.shows("{d}/q1[/y]q2/out")
    assert check(Path("/w"), "error: --out /w/q1[/y]q2/out is a file") == []
    assert check(Path("/w"), "error: no such value") == []  # not quoted: nothing to judge
    assert check(Path("/w"), "error: --out /w/q1q2/out is a file") == [
        "markup eaten: output shows '/w/q1q2/out' for '/w/q1[/y]q2/out'"
    ]
    assert core.shows("m[[set]]n")(Path("/w"), "key 'm[]n'") != []


def test_summary_rows_add_up(harness) -> None:
    core, attack = harness
    o = [
        core.Outcome("flags", "a", [], [2], tracebacks=1),
        core.Outcome("flags", "b", [], [0], unexpected=["step 1: exit 0, expected 2"]),
        core.Outcome("journals", "c", [], [0, 0], lost=4, findings=["x"]),
    ]
    rows = {r["category"]: r for r in attack.summarize(o)}
    assert rows["flags"] == {"category": "flags", "inputs": 2, "tracebacks": 1, "lost_cases": 0,
                             "unexpected_exits": 1, "other_findings": 0}  # fmt: skip
    assert rows["total"]["inputs"] == 3 and rows["total"]["lost_cases"] == 4


FAKE = """\
import json, sys
from pathlib import Path
args = sys.argv[1:]
if "crash" in args:
    print("Traceback (most recent call last):\\n  boom", file=sys.stderr)
    sys.exit(1)
if "-o" in args:
    out = Path(args[args.index("-o") + 1])
    out.mkdir(parents=True, exist_ok=True)
    cases = [{"impl": "x", "seqlen_q": n} for n in range(3)]
    (out / "plan.json").write_text(json.dumps({"cases": cases}))
    kept = cases[:1] if "lose" in args else cases
    (out / "results.json").write_text(json.dumps({"cases": kept}))
sys.exit(2 if "bad" in args else 0)
"""


@pytest.mark.slow
def test_harness_counts_a_fake_fa_bench(harness, tmp_path: Path) -> None:
    """Five inputs with known outcomes through the harness's own runner (2 workers)."""
    core, attack = harness
    fake = tmp_path / "fake.py"
    fake.write_text(textwrap.dedent(FAKE))
    bad, ran = core.BAD_INPUT, core.RAN
    attacks = [
        core.Attack("flags", "refused", [core.Step(["bad"], bad)]),
        core.Attack("flags", "accepted", [core.Step(["fine"], bad)]),
        core.Attack("flags", "traceback", [core.Step(["crash"], bad)]),
        core.Attack("journals", "all kept", [core.Step(["-o", "{d}/out"], ran)], keeps="out"),
        core.Attack(
            "journals", "two lost", [core.Step(["lose", "-o", "{d}/out"], ran)], keeps="out"
        ),
    ]
    outcomes = attack.run_all(attacks, tmp_path / "w", [sys.executable, str(fake)], 2, False)
    by = {o.name: o for o in outcomes}
    assert [o.name for o in outcomes] == [a.name for a in attacks]
    assert by["refused"].clean and by["all kept"].clean
    assert by["accepted"].unexpected == ["step 1: exit 0, expected 2"]
    assert by["traceback"].tracebacks == 1
    assert by["two lost"].lost == 2
    total = attack.summarize(outcomes)[-1]
    assert (total["inputs"], total["tracebacks"], total["lost_cases"]) == (5, 1, 2)
    assert total["unexpected_exits"] == 2  # "accepted" and "traceback" (exit 1)


@pytest.mark.slow
def test_quick_mode_against_fa_bench_writes_every_outcome(tmp_path: Path) -> None:
    """The real thing, three flag inputs: the JSON holds each with its exit codes."""
    out = tmp_path / "attack.json"
    proc = subprocess.run(
        [sys.executable, str(TOOL / "attack.py"), "--quick", "--category", "flags",
         "--json", str(out)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    assert len(doc["outcomes"]) == 3 == doc["summary"][-1]["inputs"]
    assert all(o["exit_codes"] and o["category"] == "flags" for o in doc["outcomes"])
    assert "category" in proc.stdout and "total" in proc.stdout
