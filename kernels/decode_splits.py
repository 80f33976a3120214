"""The decode heuristic's split model (kernels/decode_config.py `resolve` uses it): the
shared memory and resident programs of a split launch, and the split count that
minimises the modelled time of the busiest SM. docs/kernel.md ("Decoding") has the
measurements it rests on."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

MAX_SPLITS = 128
# Splits (`choose_num_splits`): the bytes the GPU must have in flight to read at its
# bandwidth, the shared memory of an SM, and the fewest key blocks per split.
_INFLIGHT_BYTES = 12 << 20
_SMEM_PER_SM = 228 << 10
_SMEM_RESERVED = 1 << 10
_MAX_SLOTS = 4
_MIN_BLOCKS_PER_SPLIT = 4


def _cdiv(n: int, d: int) -> int:
    return (n + d - 1) // d


def kv_buffers(num_stages: int, paged: bool) -> int:
    """K/V blocks a program holds in shared memory (triton 3.6's pipeliner, read off the
    sm_90 TTGIR): num_stages - 1 for a contiguous cache; for a paged one the table read
    takes two stages, so one buffer below 5 stages and two from 5 on."""
    if paged:
        return 1 if num_stages < 5 else 2
    return max(1, num_stages - 1)


@dataclass(frozen=True)
class Tile:
    """What the shared memory of one program depends on besides its Launch."""

    block_rows: int
    head_dim_pad: int
    itemsize: int
    paged: bool


def smem_bytes(tile: Tile, block_n: int, num_stages: int) -> int:
    """A split program's shared memory: its K/V buffers, q and the P tile (the compiled
    sm_90 kernels' `shared` to the byte for d128 bf16: 38912 at 64 keys and 2 stages)."""
    kv = kv_buffers(num_stages, tile.paged) * 2 * block_n * tile.head_dim_pad * tile.itemsize
    return kv + tile.block_rows * (tile.head_dim_pad + block_n) * tile.itemsize


def slots(tile: Tile, block_n: int, num_stages: int) -> int:
    """Split programs resident on one SM at once: as many as its shared memory holds, at
    most `_MAX_SLOTS`."""
    smem = smem_bytes(tile, block_n, num_stages) + _SMEM_RESERVED
    return max(1, min(_MAX_SLOTS, _SMEM_PER_SM // smem))


def _saturation(tile: Tile, block_n: int, num_stages: int, sms: int) -> float:
    """Programs per SM that keep `_INFLIGHT_BYTES` in flight over the GPU."""
    per_program = kv_buffers(num_stages, tile.paged) * 2 * block_n * tile.head_dim_pad
    return _INFLIGHT_BYTES / (per_program * tile.itemsize) / sms


@functools.lru_cache(maxsize=4096)  # called per launch: a loop over up to 128 counts
def choose_num_splits(
    programs: int, capacity: int, block_n: int, sms: int, tile: Tile, num_stages: int
) -> int:
    """Splits per sequence that minimise the modelled time of the slowest SM.

    Each of the programs · S programs streams ceil(blocks / S) key blocks; the SMs take
    them round robin, so the busiest SM streams ceil(programs · S / sms) of them, and
    while fewer programs run than keep `_INFLIGHT_BYTES` in flight the GPU reads below its
    bandwidth. Time ~ ceil(blocks / S) · max(ceil(programs · S / sms), saturation / sms).
    Split counts that put more programs on an SM than fit at once (shared memory, at most
    `_MAX_SLOTS`) are out (a second partial wave measured 9-13% slower), so is a split of
    fewer than `_MIN_BLOCKS_PER_SPLIT` blocks; ties go to fewer splits; at most MAX_SPLITS."""
    blocks = _cdiv(capacity, block_n)
    saturation = _saturation(tile, block_n, num_stages, sms)
    resident = slots(tile, block_n, num_stages)
    most = min(MAX_SPLITS, max(1, blocks // _MIN_BLOCKS_PER_SPLIT))
    best, best_cost = 1, math.inf
    for s in range(1, most + 1):
        per_sm = _cdiv(programs * s, sms)
        if s > 1 and per_sm > resident:
            break
        cost = _cdiv(blocks, s) * max(per_sm, saturation)
        if cost < best_cost * (1 - 1e-9):
            best, best_cost = s, cost
    return best


def split_cost(
    programs: int, capacity: int, block_n: int, sms: int, tile: Tile, num_stages: int
) -> tuple[int, float]:
    """(`choose_num_splits`' count, its modelled time in keys streamed by the busiest SM:
    comparable across key blocks and stages)."""
    s = choose_num_splits(programs, capacity, block_n, sms, tile, num_stages)
    per_sm = max(_cdiv(programs * s, sms), _saturation(tile, block_n, num_stages, sms))
    return s, _cdiv(_cdiv(capacity, block_n), s) * per_sm * block_n
