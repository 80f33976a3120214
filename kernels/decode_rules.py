"""Launch rules of the decode heuristic added in session 11 (issue 20), beside
kernels/decode_config.py's, which calls them from `resolve` (they take its constants as
arguments and import only the split model, kernels/decode_splits.py): the deeper
pipeline with half the splits (`deeper`) and one block loop for Sq > 1
(`one_loop_default`). Each has a
development switch in the environment for a GPU script's A/B in process
(tools/gpu/decode_s11_ab.py); docs/kernel.md ("Decoding", session 11) has the
measurements."""

from __future__ import annotations

import os

from fa_bench.kernels.decode_splits import Tile, slots, split_cost

# Session 11: a launch of up to 8 splits (the tile merge's one chunk) that the model times
# the same with twice the bytes in flight per program (contiguous: 3 stages in place of
# 2; paged: 64-key blocks in place of 32) takes that deeper pipeline and half the splits,
# while the programs still cover every SM: the last program of a row block merges rows x
# splits partials at the kernel's end (session 7: the combine's share 5.6-8 us at Sq 4
# against 3.4 at Sq 1). Call 2 (tools/gpu/decode_s11_ab.py): 1.01-1.04 at batch 8 x 8k-32k
# for 8 rows and more, 1.18 where 8 splits of 32 rows took two merge chunks, but 0.95 at
# batch 1 x 1k (32 programs on 132 SMs: each program's chain is the time there); with the
# coverage condition, call 3: 1.030 on geometric mean over 13 batch-8 shapes, worst 0.998.
# $FA_BENCH_DECODE_DEEP=0 / 1 overrides it (a GPU script's A/B in process).
DEEP_ENV = "FA_BENCH_DECODE_DEEP"
_DEEP = True
_DEEP_MAX_SPLITS = 8
# Session 11: with Sq > 1 a sequence's last key block holds the causal diagonal, which the
# two-loop split reads after draining the unmasked loop's pipeline (session 7); one loop
# streams it with the rest. Call 4 (tools/gpu/decode_s11_ab.py --switch one-loop): 1.005-
# 1.015 x two loops on all 7 Sq-4 shapes (batch 1 x 32k to batch 64 x 8k, contiguous and
# paged). $FA_BENCH_DECODE_ONE_LOOP=0 / 1 overrides it.
ONE_LOOP_ENV = "FA_BENCH_DECODE_ONE_LOOP"
_ONE_LOOP_MULTI = True


def _switch(name: str, default: bool) -> bool:
    """`default`, or the environment's 0 / 1 (ValueError naming another value)."""
    env = os.environ.get(name, "")
    if env not in ("", "0", "1"):
        raise ValueError(f"${name} is {env!r}; valid: 0, 1")
    return default if env == "" else env == "1"


def one_loop_default(seq_q: int) -> bool:
    """Whether the heuristic streams every key block through one loop at `seq_q` tokens."""
    return seq_q > 1 and _switch(ONE_LOOP_ENV, _ONE_LOOP_MULTI)


def deeper(
    programs: int, capacity: int, sms: int, tile: Tile, base: tuple[int, int],
    deep: tuple[int, int],
) -> int | None:  # fmt: skip
    """The split count for `deep` (block_n, stages: twice `base`'s bytes in flight per
    program) where the session-11 rule takes it over `base` (see `_DEEP`), else None:
    fewer splits but a program for every SM, every program resident at once, modelled no
    slower."""
    if not _switch(DEEP_ENV, _DEEP):
        return None
    s0, cost0 = split_cost(programs, capacity, base[0], sms, tile, base[1])
    s1, cost1 = split_cost(programs, capacity, deep[0], sms, tile, deep[1])
    if (
        s0 > _DEEP_MAX_SPLITS
        or s1 >= s0
        or programs * s1 < sms
        or programs * s1 > slots(tile, *deep) * sms
        or cost1 > cost0 * (1 + 1e-9)
    ):
        return None
    return s1
