"""tools/gpu/fp8_gluon_report.py: the summary of the Gluon fp8 GPU check (what the lead
reads after a call): correctness per role with failures named, TFLOP/s per shape with the
best fp8 role ÷ the bf16 forward against the 1.3× target, errors listed."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _report():
    path = ROOT / "tools" / "gpu" / "fp8_gluon_report.py"
    spec = importlib.util.spec_from_file_location("fp8_gluon_report", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _bench(role, tflops=None, error=None, n=4096, causal=False):
    row = dict(kind="bench", role=role, head_dim=128, n=n, causal=causal)
    row.update(dict(tflops=tflops) if tflops is not None else dict(error=error))
    return row


DOC = dict(
    env=dict(device="H200", torch="2.11", triton="3.6.0"),
    children=[dict(child="ws", status="ok", seconds=12.0),
              dict(child="ws-nopp", status="killed: no progress for 25 s", seconds=30.0)],
    rows=[
        dict(kind="check", role="ws", label="fp8-ws-m64-n128-s4", head_dim=128,
             shape=[1, 2, 2, 1, 1, False], passed=True, err=0.01, tol=0.1, lse2_err=1e-4,
             tl_lse2_err=2e-4),
        dict(kind="check", role="ws", label="fp8-ws-m64-n128-s4", head_dim=128,
             shape=[1, 4, 1, 1504, 784, True], passed=False, err=0.3, tol=0.1, lse2_err=1e-4),
        _bench("bf16", 600.0), _bench("tl-fp8", 750.0), _bench("ws", 800.0),
        _bench("ws-emu2", error="CompilationError: x"),
        _bench("bf16", 620.0, causal=True), _bench("ws", 700.0, causal=True),
        dict(_bench("ws-emu2", 900.0, causal=True), failed_checks=True),
    ],
)  # fmt: skip


def test_summary_names_failures_ratios_and_errors():
    text = _report().markdown(DOC)
    assert "- ws-nopp: killed: no progress for 25 s (30.0 s)" in text
    assert "| ws | fp8-ws-m64-n128-s4 | 128 | 1/2 | 0.3000 / 0.1000 |" in text
    assert "[1, 4, 1, 1504, 784, True]: rule" in text
    # 800 / 600 = 1.333 meets the target; 700 / 620 = 1.129 does not
    assert "| 128 | 4k | no | 600.0 | 750.0 | 800.0 | err | ws | 1.333 | yes |" in text
    # a role that failed a check is shown marked and never the best
    assert "| 128 | 4k | yes | 620.0 | - | 700.0 | 900.0 ✗ | ws | 1.129 | no |" in text
    assert "- ws-emu2 d128 4096 causal=False: CompilationError: x" in text


def _pick():
    path = ROOT / "tools" / "gpu" / "fp8_pick.py"
    spec = importlib.util.spec_from_file_location("fp8_pick", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.pick


def test_pick_takes_the_best_ratio_per_causality_among_roles_that_passed():
    rows = [
        dict(kind="check", role="ws-bad", passed=False),
        dict(kind="check", role="ws-persist", passed=True),
    ]
    for n in (4096, 16384):
        rows += [
            _bench("bf16", 600.0, n=n), _bench("bf16", 500.0, n=n, causal=True),
            _bench("ws", 780.0, n=n), _bench("ws", 700.0, n=n, causal=True),
            _bench("ws-persist", 800.0, n=n), _bench("ws-persist", 690.0, n=n, causal=True),
            _bench("ws-bad", 999.0, n=n), _bench("ws-bad", 999.0, n=n, causal=True),
            _bench("tl-fp8", 999.0, n=n), _bench("tl-fp8", 999.0, n=n, causal=True),
        ]  # fmt: skip
    # ws-ahead timed at 4k only: not every shape, not chosen
    rows.append(_bench("ws-ahead", 2000.0, n=4096))
    assert _pick()(dict(rows=rows)) == "ws-persist,ws"
    assert _pick()({}) == "ws,ws"
    # without the bf16 baseline: plain TFLOP/s
    no_base = [r for r in rows if r.get("role") != "bf16"]
    no_base.append(_bench("ws-ahead", 1.0, n=16384))
    no_base += [_bench("ws-ahead", 1.0, n=n, causal=True) for n in (4096, 16384)]
    assert _pick()(dict(rows=no_base)) == "ws-ahead,ws"
    # roles the kernel does not know (an older check's) are never picked
    assert _pick()(dict(rows=no_base), {"ws", "ws-persist"}) == "ws-persist,ws"
