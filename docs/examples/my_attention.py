"""An fa-bench plugin: attention computed a block of queries at a time ("mine").

Benchmark it with `fa-bench run --plugin my_attention.py -i mine` (docs/plugins.md).
tests/test_plugins_first_try.py runs this very file, so the page and the code agree.
"""

from __future__ import annotations

import math

import torch

from fa_bench.registry import Unsupported, register

BLOCK = 64  # queries per block: the scores held at once are BLOCK x seqlen_k per head


def _check(case, device) -> str | None:
    """Why a case cannot run, said before anything is allocated (None: it can)."""
    if case.head_dim > 256:
        return f"mine keeps head_dim <= 256, not {case.head_dim}"
    return None


def _availability() -> str | None:
    """Why mine cannot run on this machine at all (None: it can)."""
    if not hasattr(torch, "softmax"):
        return "this torch has no softmax"
    return None


@register(
    "mine",
    description="attention a block of 64 queries at a time (docs/examples/my_attention.py)",
    modes=("fwd", "bwd", "fwd_bwd"),
    dtypes=("fp32", "fp16", "bf16"),
    devices=("cuda", "cpu"),
    check=_check,
    availability=_availability,
)
def build(case, q, k, v):
    """The builder: called once per case with its inputs, (batch, heads, seqlen, head_dim)
    tensors; K and V have `case.heads_kv` heads. Everything here is outside the timed span;
    the function it returns is what fa-bench times, checks and differentiates."""
    sq, sk = case.seqlen_q, case.seqlen_k
    if case.causal and sq > sk:
        # Bottom-right aligned causal masking: the first sq - sk queries see no key.
        raise Unsupported(f"mine: causal with seqlen_q ({sq}) > seqlen_k ({sk})")
    group = case.heads_q // case.heads_kv
    scale = 1.0 / math.sqrt(case.head_dim)
    key_pos = torch.arange(sk, device=q.device)

    def fn(q, k, v):
        if group > 1:  # grouped-query attention: each KV head serves `group` query heads
            k = k.repeat_interleave(group, dim=1)
            v = v.repeat_interleave(group, dim=1)
        blocks = []
        for start in range(0, sq, BLOCK):
            qb = q[:, :, start : start + BLOCK]
            s = (qb @ k.transpose(-2, -1)) * scale
            if case.causal:  # query i sees keys j <= i + (sk - sq)
                rows = torch.arange(start, start + qb.shape[2], device=q.device)
                s = s.masked_fill(key_pos[None, :] > rows[:, None] + (sk - sq), float("-inf"))
            blocks.append(torch.softmax(s, dim=-1) @ v)
        return torch.cat(blocks, dim=2)

    return fn
