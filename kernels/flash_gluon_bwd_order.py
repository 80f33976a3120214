"""The causal Gluon backward's grid order (issue 18, session 15): how many heads' key
blocks the grid interleaves, chosen by a model of the CTAs' dispatch. Imports neither
triton nor torch.

Why: a causal CTA's work is its count of query blocks, from all of them (the first key
block) down to one or two (the last), and the grid runs each head's key blocks together,
heaviest first, so that their dQ reduce-adds share the head's workspace in L2. Each
head's key blocks end light, but the grid's last wave still holds the last heads' heavy
first blocks: dispatched when most of the work is done, they finish alone. At 4k causal
(bf16, head_dim 128, 64 heads of 32 key blocks on 132 SMs) the list-scheduling model
below puts the makespan 6.5% above the work divided evenly, and 0.3% above with four
heads interleaved (each key block of the four heads in turn: the heaviest of four heads
first, the workspaces of four heads in L2). At 16k (16 heads of 128 key blocks) the
head-major order is within 0.2% already. Every key block of a head has the same work
without the causal mask: the order does not matter there. Measured on the H200 (session
15 call 1, bf16 causal, `fa-bench run`) the groups gained less than the model promised:
+1.7% at d128 4k, +2-3% at 1k and 2k, +0.5% at d64 4k (docs/kernel.md, session 15).

`grid_position(pid, blocks, heads, group)` is the order the kernel runs: its grid is
(group, key blocks, heads / group), dispatched x fastest, so the CTA at linear position
pid holds key block pid // group % blocks of head (pid // (group · blocks)) · group +
pid % group (flash_gluon_bwd_kernels._bwd_ws reads both from its program ids). The
model also takes groups that do not divide the heads (a ragged last group); the launch
takes only divisors.
"""

from __future__ import annotations

import functools
import heapq

# a CTA's fixed work (K and V loaded, dK and dV stored), in query-block steps
CTA_OVERHEAD_STEPS = 2
# the interleaved heads' dQ workspaces (fp32) and Q/dO (their dtype) may fill at most this
# share of L2: session 5's key-block-major order (every head at once) was bound by its
# reduce-adds at 4k causal, the workspaces of all heads not fitting
L2_SHARE = 0.5
# the model's makespans within this of each other are a tie: the fewer heads win
TIE = 0.002


def grid_position(pid: int, blocks: int, heads: int, group: int) -> tuple[int, int]:
    """(key block, batch · head) of the CTA at linear position `pid` (key block fastest)
    of a (blocks, heads) grid that runs `group` heads' key blocks interleaved: key block 0
    of each head of the group, then key block 1 of each, ...; the last group holds what
    is left of the heads. `group` 1 is the head-major order."""
    span = group * blocks
    first = (pid // span) * group
    size = min(group, heads - first)
    rest = pid - first * blocks
    return rest // size, first + rest % size


def makespan(work: list[int], heads: int, group: int, sms: int) -> int:
    """When the last CTA ends if each of `sms` SMs takes the next CTA in grid order when
    its last one ends (one CTA per SM), `work[kb]` the steps of key block kb of any head."""
    blocks = len(work)
    free = [0] * sms
    end = 0
    for pid in range(blocks * heads):
        kb, _ = grid_position(pid, blocks, heads, group)
        t = heapq.heappop(free) + work[kb] + CTA_OVERHEAD_STEPS
        end = max(end, t)
        heapq.heappush(free, t)
    return end


@functools.lru_cache(maxsize=256)
def causal_head_group(seq_q: int, seq_k: int, block_m: int, block_n: int, heads: int,
                      head_bytes: int, sms: int, l2_bytes: int) -> int:  # fmt: skip
    """How many heads' key blocks the causal grid interleaves (1: a head's key blocks
    together): the power of two dividing `heads` with the shortest modelled makespan
    (`makespan`), the fewest heads on a tie, whose heads' `head_bytes` (the fp32 dQ
    workspace and Q, dO of one key/value head) fit `L2_SHARE` of L2."""
    if heads < 2 or sms < 1:
        return 1
    q_blocks = -(-seq_q // block_m)
    # bottom-right causal: key block kb sees the query blocks from its diagonal on
    work = [q_blocks - max(kb * block_n - (seq_k - seq_q), 0) // block_m
            for kb in range(-(-seq_k // block_n))]  # fmt: skip
    groups = [
        g for g in (2, 4, 8, 16, 32, 64) if heads % g == 0 and g * head_bytes <= L2_SHARE * l2_bytes
    ]
    if not groups or len(work) * heads <= sms:  # no group fits L2; or one wave, all at once
        return 1
    best, best_time = 1, makespan(work, heads, 1, sms)
    for group in groups:
        time = makespan(work, heads, group, sms)
        if time < best_time * (1 - TIE):
            best, best_time = group, time
    return best
