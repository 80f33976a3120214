"""The packed dK/dV kernel's clamped loads compiled for sm_90 on a CPU
(tools/gpu/variants_ptxas.py in a fresh process, lengths of unknown alignment as a packed
sequence's always are): every CLAMP mode compiles, with a window, softcap and ALiBi too,
and the clamped kernels spill less than the masked one, whose 2-D row masks on every
streamed load were the packed backward's register cost.

Measured (bf16, head_dim 128, 128 x 64 tiles, 8 warps, 3 stages, bytes of spill stores):
triton 3.6.0 masked 736, CLAMP 1 588, CLAMP 2 460, CLAMP 2 with the masked loop 2 stages
deep (the default launch) 220 (dense, whole tiles: 172); triton 3.9 masked 440, CLAMP 1
328, CLAMP 2 348.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

TOOL = Path(__file__).resolve().parent.parent / "tools" / "gpu" / "variants_ptxas.py"
LINE = re.compile(r"^(\S+)\s+(dkdv|dq)\s+smem (\d+) regs\s+(\d+) spills (\d+)/(\d+)")


@pytest.mark.slow
def test_clamped_packed_dkdv_compiles_and_spills_less_than_the_masked():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    names = ["varlen-heads-fast", "varlen-clamp1", "varlen-clamp", "varlen-clamp-window"]
    names += ["varlen-clamp-softcap", "varlen-clamp-diag2"]
    done = subprocess.run(
        [sys.executable, str(TOOL), "--ragged", *names], capture_output=True, text=True,
        env=env, timeout=1500,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    rows = {}
    for line in done.stdout.splitlines():
        m = LINE.match(line)
        if m:
            rows[(m[1], m[2])] = int(m[5])
    missing = [(n, k) for n in names for k in ("dkdv", "dq") if (n, k) not in rows]
    assert not missing, (missing, done.stdout[-3000:])
    masked = rows[("varlen-heads-fast", "dkdv")]
    assert rows[("varlen-clamp1", "dkdv")] < masked, rows
    assert rows[("varlen-clamp", "dkdv")] < masked, rows
    assert rows[("varlen-clamp-diag2", "dkdv")] < masked, rows  # the default launch
