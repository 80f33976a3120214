"""CPU tests of tools/gpu/fp8_pick.py --table: the Gluon fp8 launch per causality and timed
length from the check's rows, as $FA_BENCH_FP8_GLUON_TABLE ranges the dispatch takes."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from fa_bench.kernels import flash_gluon_fp8_table as table

ROOT = Path(__file__).resolve().parents[1]
PICK = ROOT / "tools" / "gpu" / "fp8_pick.py"


def _module():
    spec = importlib.util.spec_from_file_location("fp8_pick", PICK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _bench(role, tflops, n=4096, causal=False):
    return dict(kind="bench", role=role, head_dim=128, n=n, causal=causal, tflops=tflops)


# call B's do_bench figures (2026-11-30), and a role that failed a check
CALL_B = [
    dict(kind="check", role="ws-persist", passed=True),
    dict(kind="check", role="ws-bad", passed=False),
    _bench("ws-persist", 819.6), _bench("ws", 823.0),
    _bench("ws-persist", 836.3, n=16384), _bench("ws", 842.5, n=16384),
    _bench("ws-persist", 730.3, causal=True), _bench("ws", 702.0, causal=True),
    _bench("ws-persist", 794.3, n=16384, causal=True), _bench("ws", 832.8, n=16384, causal=True),
    _bench("ws-bad", 999.0), _bench("ws-bad", 999.0, causal=True),
]  # fmt: skip


def test_table_takes_the_best_role_per_length(monkeypatch):
    text = _module().table(dict(rows=CALL_B))
    assert text == "128/0/0=ws,128/1/0=ws-persist,128/1/8192=ws"
    # what the dispatch then takes
    monkeypatch.setenv(table.TABLE_ENV, text)
    assert table.table_role(128, True, 4096) == "ws-persist"
    assert table.table_role(128, True, 16384) == "ws"
    assert table.table_role(128, False, 4096) == "ws"


def test_table_uses_the_bf16_ratio_and_knows_only_valid_roles():
    rows = [*CALL_B, _bench("bf16", 600.0, n=4096), _bench("bf16", 600.0, n=16384),
            _bench("ws-lazy", 830.0), _bench("ws-lazy", 800.0, n=16384)]  # fmt: skip
    assert _module().table(dict(rows=rows)) == (
        "128/0/0=ws-lazy,128/0/8192=ws,128/1/0=ws-persist,128/1/8192=ws"
    )
    assert _module().table(dict(rows=rows), {"ws", "ws-persist"}).startswith("128/0/0=ws,")
    assert _module().table({}) == ""


@pytest.mark.slow
def test_the_command_line_prints_the_table(tmp_path):
    path = tmp_path / "fp8_gluon.json"
    path.write_text(json.dumps(dict(rows=CALL_B)))
    out = subprocess.run([sys.executable, str(PICK), "--table", str(path)],
                         capture_output=True, text=True, check=True)  # fmt: skip
    assert out.stdout.strip() == "128/0/0=ws,128/1/0=ws-persist,128/1/8192=ws"
