"""Deliberately failing implementations for the runner's failure-handling tests.

Loaded with `--plugin tests/plugins/faulty_impls.py`; each misbehaves in one way.
"""

from __future__ import annotations

import os
import time

import torch

from fa_bench.registry import register


def _reference(q, k, v, causal):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)


@register(
    "test-crash", description="kills its own process, as a segfault or CUDA fatal error would"
)
def crash(case, q, k, v):
    def fn(q, k, v):
        os._exit(17)

    return fn


@register("test-hang", description="never returns")
def hang(case, q, k, v):
    def fn(q, k, v):
        while True:
            time.sleep(1)

    return fn


@register("test-oom", description="raises torch's out-of-memory error")
def oom(case, q, k, v):
    def fn(q, k, v):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 64.00 GiB")

    return fn


@register("test-raise", description="raises an ordinary exception")
def raises(case, q, k, v):
    def fn(q, k, v):
        raise RuntimeError("deliberate failure")

    return fn


@register("test-wrong", description="fast and wrong: drops the softmax scale")
def wrong(case, q, k, v):
    def fn(q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(
            q, k, v, is_causal=case.causal, scale=1.0
        )

    return fn
