"""The persistent fp8 launch's tile plan (Fp8GluonConfig.lpt; session 8).

The persistent kernel (kernels/flash_gluon_fp8_persist.py) walks a fixed tile order
(causal: the (batch, head)s in L2-sized groups, heaviest query tiles first within each
group). Without a plan CTA p takes tiles p, p + P, p + 2P, ... (round robin). Causal tiles
differ in work (a tile's key blocks grow with its position) and the order restarts from
the heaviest at every group, so the round robin leaves some SMs with far more work than
others: at 4k causal, d128, 4 × 16 heads, 192-row tiles (1408 tiles, groups of 24 heads,
132 CTAs) the busiest CTA gets 1.22 × the mean (a model counting key blocks per
consumer), the tail of the run on a few SMs.

The plan hands the same order out greedily instead: each tile, in order, goes to the CTA
with the least work so far (what a dynamic scheduler would do, computed once on the host
from the tiles' key-block counts: the busiest CTA then gets 1.02 × the mean). A CTA's
tiles keep their order (concurrent CTAs stay on the same group's K/V, as before). The
kernel reads its tile ids from one int32 tensor: P + 1 offsets, then the tile ids, CTA
p's at [offsets[p], offsets[p + 1]).

`tile_order` mirrors the kernel's `_tile_at` (the tests check both against each other
through a stand-in on the GPU, and the order's properties on the CPU).
"""

from __future__ import annotations

import functools
import heapq
from typing import Any

# a tile's fixed cost, in consumer key blocks: its first QKᵀ with nothing to overlap, the
# Q load, the epilogue (partly under the next tile's matmuls)
TILE_COST = 2.0
# a consumer whose rows all lie past seq_q only passes the ring on (_idle): a fraction of
# a block's work per block
IDLE_COST = 0.1


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def kv_end(row0: int, rows: int, seq_q: int, seq_k: int, block_n: int, causal: bool) -> int:
    """flash_gluon_kernels._kv_bounds' n_end: the key blocks rows [row0, row0 + rows) see."""
    n_blocks = _cdiv(seq_k, block_n)
    if not causal:
        return n_blocks
    return min(max(_cdiv(row0 + rows + seq_k - seq_q, block_n), 0), n_blocks)


def tile_order(shape: tuple[int, int, int, int], rows: int, bh_group: int,
               causal: bool) -> list[tuple[int, int]]:  # fmt: skip
    """(flat (batch, head) index, first row) of every tile t in the persistent kernel's
    order (`_tile_at`); shape = (n_bh, heads_q, seq_q, seq_k)."""
    n_bh, _heads_q, seq_q, _seq_k = shape
    n_m = _cdiv(seq_q, rows)
    tiles = []
    for t in range(n_m * n_bh):
        if causal:
            grp = t // (n_m * bh_group)
            first = grp * bh_group
            size = min(bh_group, n_bh - first)
            r = t - grp * (n_m * bh_group)
            tiles.append((first + r % size, (n_m - 1 - r // size) * rows))
        else:
            tiles.append((t // n_m, (t % n_m) * rows))
    return tiles


def tile_cost(row0: int, shape: tuple[int, int, int, int], consumers: int, block_m: int,
              block_n: int, causal: bool, own_end: bool = False) -> float:  # fmt: skip
    """A tile's work in consumer key blocks: every consumer with rows steps through the
    key blocks of the tile's last row (own_end: of its own last row), and only passes on
    the others."""
    _n_bh, _heads_q, seq_q, seq_k = shape
    n_end = kv_end(row0, consumers * block_m, seq_q, seq_k, block_n, causal)
    cost = TILE_COST
    for c in range(consumers):
        r0 = row0 + c * block_m
        mine = 0 if r0 >= seq_q else n_end
        if own_end and r0 < seq_q:
            mine = min(kv_end(r0, block_m, seq_q, seq_k, block_n, causal), n_end)
        cost += mine + IDLE_COST * (n_end - mine)
    return cost


def lpt_plan(shape: tuple[int, int, int, int], ctas: int, consumers: int, block_m: int,
             block_n: int, bh_group: int, causal: bool,
             own_end: bool = False) -> list[int]:  # fmt: skip
    """The plan's int32 values: ctas + 1 offsets, then each CTA's tile ids in order."""
    for name, value in (("ctas", ctas), ("consumers", consumers), ("block_m", block_m),
                        ("block_n", block_n), ("bh_group", bh_group)):  # fmt: skip
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"lpt_plan: {name}={value!r}: expected a positive int")
    tiles = tile_order(shape, consumers * block_m, bh_group, causal)
    mine: list[list[int]] = [[] for _ in range(ctas)]
    heap = [(0.0, p) for p in range(ctas)]
    for t, (_bh, row0) in enumerate(tiles):
        load, p = heapq.heappop(heap)
        mine[p].append(t)
        cost = tile_cost(row0, shape, consumers, block_m, block_n, causal, own_end)
        heapq.heappush(heap, (load + cost, p))
    offsets = [0]
    for ids in mine:
        offsets.append(offsets[-1] + len(ids))
    return offsets + [t for ids in mine for t in ids]


def busiest_share(plan: list[int], costs: list[float]) -> float:
    """The busiest CTA's work ÷ the mean, for a plan and the tiles' costs."""
    ctas = len(plan) - len(costs) - 1
    loads = [sum(costs[t] for t in plan[ctas + 1 + plan[p] : ctas + 1 + plan[p + 1]])
             for p in range(ctas)]  # fmt: skip
    return max(loads) / (sum(loads) / ctas)


@functools.lru_cache(maxsize=32)
def plan_tensor(device: Any, shape: tuple[int, int, int, int], ctas: int, consumers: int,
                block_m: int, block_n: int, bh_group: int, causal: bool,
                own_end: bool = False) -> Any:  # fmt: skip
    """lpt_plan as an int32 tensor on `device`, built once per launch shape (the timed
    calls reuse it)."""
    import torch

    values = lpt_plan(shape, ctas, consumers, block_m, block_n, bh_group, causal, own_end)
    return torch.tensor(values, dtype=torch.int32, device=device)


def launch_plan(device: Any, cfg: Any, shape: tuple[int, int, int, int], ctas: int,
                bh_group: int, causal: bool) -> Any:  # fmt: skip
    """The persistent launch's `plan` argument for an Fp8GluonConfig: plan_tensor where
    cfg.lpt, else None (a constexpr: the round-robin launch's code is unchanged)."""
    if not cfg.lpt:
        return None
    return plan_tensor(device, shape, ctas, cfg.consumers, cfg.block_m, cfg.block_n, bh_group,
                       bool(causal), cfg.own_end)  # fmt: skip
