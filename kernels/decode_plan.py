"""decode_attention planned once and run many times: `plan_decode(...)` checks the
arguments, resolves the launch, allocates the output and the split workspaces and
(after its first run) binds the compiled kernels to their arguments; `DecodePlan.run()`
then makes the two launches with nothing else on the host.

Why: a decode call is short (20-60 us on an H200 at batch 1), and the Python of a call
(argument checks, the launch plan, allocations, and above all triton's per-launch
argument binding and specialisation, twice) measured 100-150 us of host time per call
on the H200 machine: timed call by call behind a 256 MB L2 flush, the GPU waited for the
host (`decode_tune.md`: batch 1 x 32k, 2744 GB/s as a CUDA graph, 1034 as plain calls).
A serving engine plans once per batch shape in the same way (FlashInfer's plan/run) or
replays a CUDA graph.

The bound launch calls triton's compiled kernel directly with the arguments the JIT
launch bound (`CompiledKernel.run`, as `JITFunction.run` does after its cache lookup).
That is only sound while every argument is the one the JIT launch specialised on, so a
plan holds fixed tensors (q, the caches, the lengths, the table, the outputs) and
`run()` takes none. The first `run()` launches through triton's JIT, keeps its output,
runs the bound launches and keeps them only if they reproduce that output bit for bit;
otherwise (the interpreter, another triton whose internals differ) every run goes
through the JIT and `bound_reason` says why. `run()` returns the same `o` each time.
"""

from __future__ import annotations

import torch

from fa_bench.kernels.bound_launch import Bound as _Bound
from fa_bench.kernels.bound_launch import jit_values as _values
from fa_bench.kernels.decode_attention import (
    _LN2,
    DecodeConfig,
    Launch,
    _launch_calls,
    checked,
    plan_launch,
)
from fa_bench.kernels.flash_attention import _interpreting


class DecodePlan:
    """decode_attention for fixed arguments (see the module docstring)."""

    def __init__(self, q, k_cache, v_cache, cache_seqlens, block_table, scale, launch: Launch):
        self.launch = launch
        self.o, self.lse2, self._calls = _launch_calls(
            q, k_cache, v_cache, cache_seqlens, block_table, scale, launch
        )
        self._device = q.device
        self._bound: list[_Bound] | None = None
        self.bound_reason = "not run yet"

    @property
    def pdl(self) -> bool:
        """Whether the combine kernel goes by programmatic dependent launch (Launch.pdl
        where the device takes it: sm_90 and up, not the interpreter)."""
        return any(kwargs.get("launch_pdl") for _, _, _, kwargs in self._calls)

    @property
    def bound(self) -> bool:
        """Whether run() makes the bound launches (else triton's JIT launches)."""
        return self._bound is not None

    def run(self) -> torch.Tensor:
        """Attention for the planned arguments: o (B, Sq, Hq, D), the same tensor every
        call (its lse: `lse()`)."""
        if self._bound is not None:
            for launch in self._bound:
                launch()
            return self.o
        compiled = [fn[grid](*args, **kwargs) for fn, grid, args, kwargs in self._calls]
        if self.bound_reason == "not run yet":
            self._bind(compiled)
        return self.o

    def lse(self) -> torch.Tensor:
        """The natural-log log-sum-exp of the last run, (B, Hq, Sq) fp32."""
        return self.lse2 * _LN2

    def _bind(self, compiled: list) -> None:
        if _interpreting() or self._device.type != "cuda":
            self.bound_reason = "the interpreter launches through triton's JIT"
            return
        bound = []
        for (fn, grid, args, kwargs), kernel in zip(self._calls, compiled, strict=True):
            kernel = kernel.result() if hasattr(kernel, "result") else kernel
            values = _values(fn, args, kwargs)
            if values is None or not hasattr(kernel, "run") or not hasattr(kernel, "function"):
                self.bound_reason = f"no compiled kernel to bind for {getattr(fn, '__name__', fn)}"
                return
            bound.append(_Bound(kernel, grid, values, self._device.index or 0))
        want_o, want_lse = self.o.clone(), self.lse2.clone()
        try:
            for launch in bound:
                launch()
        except Exception as exc:  # another triton's internals: stay on the JIT path
            self.bound_reason = f"bound launch failed: {type(exc).__name__}: {exc}"[:300]
            return
        if torch.equal(self.o, want_o) and torch.equal(self.lse2, want_lse):
            self._bound, self.bound_reason = bound, "bound"
        else:
            self.bound_reason = "bound launch differed from the JIT launch"


def plan_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    *,
    cache_seqlens: torch.Tensor,
    block_table: torch.Tensor | None = None,
    scale: float | None = None,
    num_splits: int | None = None,
    config: DecodeConfig | None = None,
) -> DecodePlan:
    """A DecodePlan of decode_attention(q, k_cache, v_cache, ...) (its arguments, checks
    and launch rules; the values of cache_seqlens and block_table are checked here, once).
    The plan keeps these tensors: change their contents between runs if you like (a new
    token's K/V, new lengths within the capacity), not their storage."""
    q, k_cache, v_cache, scale_f = checked(
        q, k_cache, v_cache, cache_seqlens, block_table, scale, num_splits, config
    )
    launch = plan_launch(q, k_cache, block_table, num_splits, config)
    return DecodePlan(q, k_cache, v_cache, cache_seqlens, block_table, scale_f, launch)
