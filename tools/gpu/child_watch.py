"""The GPU check tools' child processes (gluon_check.py, gluon_bwd_check.py,
fp8_gluon_check.py): each child appends JSON lines to one file as it goes, and the parent
kills a child whose file stops growing, so a kernel that deadlocks on an mbarrier costs
the stall time, not the whole device call. A developer tool, not installed."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path


def emit(path: str, row: dict) -> None:
    """Append one JSON line: what the parent reads, and its sign of progress."""
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")


def run_watched(cmd: list[str], lines: str, log_path: Path, label: str, stall_s: float) -> dict:
    """Run `cmd`, killing it when `lines` stops growing for `stall_s` seconds. Its stdout
    and stderr go to `log_path` (a pipe could fill and block it); a failed child's status
    carries the log's tail."""
    start = time.time()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=log)
        last_size, last_change = -1, time.time()
        while proc.poll() is None:
            time.sleep(0.5)
            size = os.path.getsize(lines) if os.path.exists(lines) else 0
            if size != last_size:
                last_size, last_change = size, time.time()
            elif time.time() - last_change > stall_s:
                proc.kill()
                proc.wait()
                status = f"killed: no progress for {stall_s:.0f} s"
                return dict(child=label, status=status, seconds=round(time.time() - start, 1))
    tail = Path(log_path).read_text()[-1500:]
    status = "ok" if proc.returncode == 0 else f"exit {proc.returncode}: {tail}"
    return dict(child=label, status=status, seconds=round(time.time() - start, 1))
