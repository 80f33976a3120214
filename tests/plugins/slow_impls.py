"""A slow implementation for tests/test_signals.py: every case takes a known while.

Loaded with `--plugin tests/plugins/slow_impls.py`. `test-slow` appends the PID of the
process that prepares it (the worker) to $FA_BENCH_TEST_PID_FILE, sleeps
$FA_BENCH_TEST_SLEEP_S seconds (default 1) while it prepares, then runs SDPA: a run of
it can be signalled mid-case, after a known number of cases, without racing the clock.
"""

from __future__ import annotations

import os
import time

import torch

from fa_bench.registry import register


@register("test-slow", description="sleeps while it prepares, then SDPA; logs the worker's PID")
def slow(case, q, k, v):
    pid_file = os.environ.get("FA_BENCH_TEST_PID_FILE")
    if pid_file:
        with open(pid_file, "a", encoding="utf-8") as f:
            f.write(f"{os.getpid()}\n")
    time.sleep(float(os.environ.get("FA_BENCH_TEST_SLEEP_S", "1")))

    def fn(q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=case.causal)

    return fn
