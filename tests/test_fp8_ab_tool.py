"""tools/gpu/fp8_ab.py (session 8's one-process A/B of fp8 launches), on the CPU: the
parent goes on after a role whose child stalled or died (a new child with the roles after
it), stops once a child has finished, and writes the rows fp8_pick.py reads, with the
summary; the picked table takes the faster role per length."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _load(name: str):
    path = ROOT / "tools" / "gpu" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _bench(role, n, tflops):
    return dict(kind="bench", role=role, label=role, head_dim=128, n=n, causal=True, ms=1.0,
                tflops=tflops)  # fmt: skip


def _check(role, passed=True):
    return dict(kind="check", role=role, label=role, head_dim=128, shape=[1, 2, 2, 4096, 4096, 1],
                passed=passed, err=0.01, tol=0.1, lse2_err=1e-4)  # fmt: skip


def test_the_parent_goes_on_after_a_stalled_role(tmp_path, monkeypatch):
    ab = _load("fp8_ab")
    monkeypatch.setenv("OUT", str(tmp_path))
    calls = []
    env = dict(kind="env", device="H200", torch="2.11", triton="3.6.0")
    # child 1: role a passes, b starts and hangs; child 2 (c alone) times both
    scripts = [
        [env, dict(kind="start", role="a"), _check("a"), dict(kind="start", role="b")],
        [env, dict(kind="start", role="c"), _check("c"), dict(kind="start", role="bench"),
         _bench("c", 4096, 760.0), _bench("bf16", 4096, 570.0), dict(kind="done")],
    ]  # fmt: skip

    def fake_run(cmd, lines, log_path, label, stall_s):
        calls.append(cmd[cmd.index("--roles") + 1])
        with open(lines, "a") as f:
            for row in scripts[len(calls) - 1]:
                f.write(json.dumps(row) + "\n")
        status = "killed: no progress" if len(calls) == 1 else "ok"
        return dict(child=label, status=status, seconds=1.0)

    monkeypatch.setattr(ab, "run_watched", fake_run)
    assert ab.parent(["a", "b", "c"], "4096:1", True) == 0
    assert calls == ["a,b,c", "c"]
    doc = json.loads((tmp_path / "fp8_ab.json").read_text())
    assert [c["status"] for c in doc["children"]] == ["killed: no progress", "ok"]
    assert {r["kind"] for r in doc["rows"]} == {"check", "bench"}
    md = (tmp_path / "fp8_ab.md").read_text()
    assert "H200" in md and "760.0" in md and "1.333" in md


def test_the_pick_takes_the_faster_role_per_length():
    pick = _load("fp8_pick")
    rows = [_check("ws-c3-persist"), _check("ws-c3-lpt"), _check("ws-c3-lptx", passed=False),
            _bench("ws-c3-persist", 4096, 728.0), _bench("ws-c3-lpt", 4096, 790.0),
            _bench("ws-c3-lptx", 4096, 900.0),  # failed its check: never picked
            _bench("ws-c3-persist", 16384, 815.0), _bench("ws-c3-lpt", 16384, 905.0),
            _bench("ws-c3", 16384, 884.0), _bench("bf16", 4096, 565.0)]  # fmt: skip
    assert pick.table(dict(rows=rows)) == "128/1/0=ws-c3-lpt"
