"""Implementations for tests/test_harden_values.py: non-finite outputs and CPU allocator
failures, each misbehaving in one way.

Loaded with `--plugin tests/plugins/value_impls.py` (or imported by the tests).
"""

from __future__ import annotations

import torch

from fa_bench.registry import register


def _sdpa(q, k, v, causal):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)


@register("value-nan-out", description="a third of the output is NaN")
def nan_out(case, q, k, v):
    def fn(q, k, v):
        o = _sdpa(q, k, v, case.causal)
        mask = torch.zeros_like(o, dtype=torch.bool)
        mask[..., ::3, :] = True
        return o.masked_fill(mask, float("nan"))

    return fn


class _InfGrad(torch.autograd.Function):
    """Identity forward; the backward puts -inf in the first element of the grad."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        g = g.contiguous().clone()
        g.view(-1)[0] = float("-inf")
        return g


@register("value-inf-grad", description="right output, one -inf in dq", modes=("fwd_bwd", "bwd"))
def inf_grad(case, q, k, v):
    def fn(q, k, v):
        return _sdpa(_InfGrad.apply(q), k, v, case.causal)

    return fn


@register("value-cpu-alloc", description="raises the CPU allocator's out-of-memory error")
def cpu_alloc(case, q, k, v):
    def fn(q, k, v):
        raise RuntimeError(
            "[enforce fail at alloc_cpu.cpp:119] data. DefaultCPUAllocator: "
            "can't allocate memory: you tried to allocate 987654321000 bytes. Error code 12"
        )

    return fn


@register("value-memoryerror", description="raises a plain MemoryError while preparing")
def memory_error(case, q, k, v):
    raise MemoryError()
