"""Shared fixtures: tiny suites and fast timing so runner tests finish in seconds."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

# Triton decides at kernel definition whether to interpret, so the flag must be set before
# any test imports fa_bench.kernels: on a CPU-only machine our kernels run interpreted.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# pytest-xdist's workers start with COLUMNS=80 and LINES=24 set, and Rich fixes a console's
# width at creation from COLUMNS: the CLI's module-level console would then stay 80 wide in
# tests that widen it through CliRunner's env, as it does not in a plain `pytest`.
os.environ.pop("COLUMNS", None)
os.environ.pop("LINES", None)

HERE = Path(__file__).parent
FAULTY = str(HERE / "plugins" / "faulty_impls.py")
FAST = ["--max-time", "0.05", "--min-samples", "3", "--target-noise", "0.05"]

# pytest-timeout's per-test limit is pyproject's 300 s; an end-to-end test may wait on its own
# subprocesses for longer (torchrun gets 600 s), and a GPU test may compile (torch.compile of
# FlexAttention in fp32 took over 300 s on the H200 with 12 test workers compiling at once),
# so those tiers get more.
LONG_TIMEOUT_S = 900


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        long = item.get_closest_marker("slow") or item.get_closest_marker("gpu")
        if long and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(LONG_TIMEOUT_S))


def write_suite(path: Path, impls: list[str], **axes: object) -> Path:
    base = {
        "modes": ["fwd"],
        "dtypes": ["fp32"],
        "batch": 1,
        "heads_q": 2,
        "seqlens": [16, 32],
        "head_dims": [16],
        "causal": [False],
    }
    base.update(axes)
    lines = ['name = "tiny"', 'description = "test suite"', f"impls = {impls!r}"]
    for key, value in base.items():
        lines.append(f"{key} = {_toml(value)}")
    path.write_text("\n".join(lines) + "\n")
    return path


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, str):
        return f'"{value}"'
    return str(value)


@pytest.fixture
def tiny_suite(tmp_path: Path):
    def make(impls: list[str], **axes: object) -> Path:
        return write_suite(tmp_path / "tiny.toml", impls, **axes)

    return make
