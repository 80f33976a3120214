"""Builders that return something other than a function, for tests/test_harden_plugins.py.

Loaded with `--plugin tests/plugins/harden_bad_builders.py`; each returns one bad value.
"""

from __future__ import annotations

import torch

from fa_bench.registry import Prepared, register


@register("hb-returns-str", description="returns a string")
def returns_str(case, q, k, v):
    return "not a function"


@register("hb-returns-int", description="returns an int")
def returns_int(case, q, k, v):
    return 7


@register("hb-returns-tensor", description="returns its output instead of a function")
def returns_tensor(case, q, k, v):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v)


@register("hb-prepared-none", description="returns a Prepared without a function")
def prepared_none(case, q, k, v):
    return Prepared(fn=None, backend="nothing")  # type: ignore[arg-type]


@register("hb-good", description="SDPA: a well-behaved builder beside the bad ones")
def good(case, q, k, v):
    def fn(q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=case.causal)

    return fn
