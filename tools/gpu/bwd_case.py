"""The standard suite's backward as `fa-bench run --mode bwd` times it, for the GPU tools
of issue 18 (tools/gpu/bwd_timeline.py, bwd_power.py, gluon_bwd_host.py): one implementation at
16k tokens, hidden 2048 (or the heads given), compiled and warmed. Not installed."""

from __future__ import annotations

from typing import Any

import torch

from fa_bench import registry
from fa_bench.case import Case
from fa_bench.run.execute import _timed_call, make_inputs


def standard_bwd(
    impl_name: str,
    dtype: str,
    head_dim: int,
    n: int,
    causal: bool,
    heads: int | None = None,
    warm: int = 3,
    device: str | torch.device = "cuda",
) -> tuple[Any, Any, tuple]:
    """(closure, before, (the case, what they keep alive)): the timed call and the grads'
    reset of `fa-bench run`'s bwd mode (the backward replayed on one forward's graph),
    after `warm` calls (compiled, planned)."""
    registry.load()  # idempotent: the built-in implementations
    heads = heads or 2048 // head_dim
    case = Case(impl_name, "bwd", dtype, 16384 // n, heads, heads, n, n, head_dim, causal)
    impl = registry.get(impl_name)
    q, k, v, do = make_inputs(case, torch.device(device))
    prep = impl.prepare(case, q, k, v, None)
    closure, before = _timed_call(case, impl, prep.fn, q, k, v, do)
    for _ in range(warm):
        before()
        closure()
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
    return closure, before, (case, q, k, v, do, prep)
