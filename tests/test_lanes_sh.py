"""tools/gpu/lanes.sh on a CPU with dummy steps (no nvidia-smi: one lane after the other):
the lead's `LANE0='name:cap:cmd;...'` form, a ';' inside a command refused (exit 2, the
step named, nothing run) unless escaped as '\\;' or given in a LANE file, exit codes."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # subprocesses

SCRIPT = Path(__file__).resolve().parent.parent / "tools" / "gpu" / "lanes.sh"


def _run(tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess, Path]:
    out = tmp_path / "out"
    full = {k: v for k, v in os.environ.items() if not k.startswith("LANE")}
    full.update(env, OUT=str(out), PATH=os.environ["PATH"])
    proc = subprocess.run(["bash", str(SCRIPT)], env=full, capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)  # fmt: skip
    return proc, out


def _log(out: Path) -> str:
    return (out / "lanes.log").read_text()


def test_the_lead_form_runs_every_step_with_its_own_out(tmp_path):
    proc, out = _run(
        tmp_path,
        LANE0='a:10:echo "one two" > $OUT/a.txt && echo more >> $OUT/a.txt 2>&1;b:10:exit 3',
        LANE1="c:1:sleep 5;d:10:echo d",
    )
    assert proc.returncode == 0, proc.stderr
    assert (out / "a" / "a.txt").read_text() == "one two\nmore\n"
    assert (out / "d" / "console.log").read_text() == "d\n"
    log = _log(out)
    # each step's own exit code (a timeout is 124): the log once said 0 for every step
    assert "a: exit 0" in log and "b: exit 3" in log and "c: exit 124" in log
    assert log.index("c: start") > log.index("b: exit")  # one GPU: lane 1 after lane 0
    assert (out / "lanes.tgz").exists()


@pytest.mark.parametrize(
    "lane, named",
    [
        # session 6 call D: VB_NAMES's ';' split the step, the pieces ran as two steps
        ('gv:5:true;vb:80:VB_NAMES="packed mixed;equal 8x2048" LIMIT=75 bash x.sh', "step 2 ('vb:"),
        ("x:5:echo a; echo b", "step 2 (' echo b')"),
        ("x:5:echo a;y:10:echo 'it;s'", "step 2 ('y:10:echo 'it')"),
        ("x:five:echo a", "cap 'five'"),
        ("x:0:echo a", "cap '0'"),
        ("x y:5:echo a", "name 'x y'"),
        ("x:5:echo (", "bash cannot parse"),
    ],
)
def test_a_step_that_would_be_split_wrongly_is_refused_before_anything_runs(tmp_path, lane, named):
    proc, out = _run(tmp_path, LANE0="first:5:touch $OUT/ran", LANE1=lane)
    assert proc.returncode == 2
    assert "LANE1" in proc.stderr and named in proc.stderr, proc.stderr
    assert not out.exists()  # not even the first lane's step ran


def test_an_escaped_separator_is_a_plain_semicolon_in_the_command(tmp_path):
    proc, out = _run(tmp_path, LANE0=r'v:10:X="a\;b" && echo "$X" > $OUT/v.txt\; echo done')
    assert proc.returncode == 0, proc.stderr
    assert (out / "v" / "v.txt").read_text() == "a;b\n"
    assert (out / "v" / "console.log").read_text() == "done\n"


def test_a_lane_file_takes_one_step_a_line_and_never_splits(tmp_path):
    lane = tmp_path / "lane0.txt"
    lane.write_text(
        "# the lead's steps\n"
        'vb:10:VB_NAMES="packed mixed;equal 8x2048" && echo "$VB_NAMES" > $OUT/n.txt\n'
        "\n"
        "two:10:echo a; echo b\n"
    )
    proc, out = _run(tmp_path, LANE0_FILE=str(lane), LANE0="ignored:5:false")
    assert proc.returncode == 0, proc.stderr
    assert (out / "vb" / "n.txt").read_text() == "packed mixed;equal 8x2048\n"
    assert (out / "two" / "console.log").read_text() == "a\nb\n"
    assert "ignored" not in _log(out)


def test_a_bad_line_in_a_lane_file_is_named_and_a_missing_file_refused(tmp_path):
    lane = tmp_path / "lane1.txt"
    lane.write_text("ok:5:true\nnot a step\n")
    proc, _ = _run(tmp_path, LANE1_FILE=str(lane))
    assert proc.returncode == 2 and "LANE1 step 2 ('not a step')" in proc.stderr
    proc, _ = _run(tmp_path, LANE0_FILE=str(tmp_path / "nope"))
    assert proc.returncode == 2 and "LANE0_FILE=" in proc.stderr and "nope" in proc.stderr


def test_two_gpus_run_the_lanes_side_by_side_each_on_its_gpu(tmp_path):
    fake = tmp_path / "bin"
    fake.mkdir()
    smi = fake / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'GPU 0: H200'\necho 'GPU 1: H200'\n")
    smi.chmod(0o755)
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LANE")}
    env.update(
        PATH=f"{fake}{os.pathsep}{os.environ['PATH']}",
        OUT=str(out),
        LANE0="a:10:sleep 1 && echo $CUDA_VISIBLE_DEVICES > $OUT/gpu",
        LANE1="b:10:sleep 1 && echo $CUDA_VISIBLE_DEVICES > $OUT/gpu",
    )
    proc = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert (out / "a" / "gpu").read_text() == "0\n" and (out / "b" / "gpu").read_text() == "1\n"
    log = _log(out)
    assert log.index("b: start") < log.index("a: exit")  # side by side
