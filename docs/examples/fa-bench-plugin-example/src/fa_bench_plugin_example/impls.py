"""Imported by fa-bench through the `fa_bench.impls` entry point: registers `example-sdpa`."""

from __future__ import annotations

import torch.nn.functional as F

from fa_bench.registry import register


def _check(case, device) -> str | None:
    # SDPA's is_causal aligns the mask top-left; fa-bench's cases are bottom-right aligned.
    if case.causal and case.seqlen_q != case.seqlen_k:
        return "example-sdpa: causal needs seqlen_q == seqlen_k"
    return None


@register(
    "example-sdpa",
    description="torch SDPA with GQA, from the fa-bench-plugin-example package",
    check=_check,
)
def build(case, q, k, v):
    gqa = case.heads_q != case.heads_kv

    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=case.causal, enable_gqa=gqa)

    return fn
