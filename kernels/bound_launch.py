"""A triton kernel launch bound to fixed arguments: the compiled kernel called directly
with what `JITFunction.run` would pass it after its cache lookup, without the per-launch
binding and specialisation (~100 µs of host per launch on the H200 machine).

Sound only while every argument is the one the JIT launch specialised on: the callers
(kernels/decode_plan.py, kernels/flash_gluon_plan.py) bind a launch for fixed tensors
and check the bound launch against the JIT's once. Imports nothing of ours, so any
kernel's host module can use it.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any


class Bound:
    """One compiled kernel with its grid and every argument (constexprs included, in the
    kernel's parameter order: what JITFunction.run passes to CompiledKernel.run)."""

    def __init__(self, compiled: Any, grid: tuple, values: list, device: int) -> None:
        from triton import knobs
        from triton.runtime.driver import driver

        self.compiled, self.values, self.knobs = compiled, values, knobs.runtime
        self.grid = (*grid, 1, 1)[:3]
        self.device, self.stream_of = device, driver.active.get_current_stream

    def __call__(self) -> None:
        c, hooks = self.compiled, self.knobs
        stream = self.stream_of(self.device)
        # as JITFunction.run: the metadata the launch hooks get (None without hooks)
        meta = c.launch_metadata(self.grid, stream, *self.values)
        g0, g1, g2 = self.grid
        c.run(g0, g1, g2, stream, c.function, c.packed_metadata, meta,
              hooks.launch_enter_hook, hooks.launch_exit_hook, *self.values)  # fmt: skip


def jit_values(fn: Any, args: tuple, kwargs: dict) -> list | None:
    """Every parameter of the jit function `fn` in order, from a launch's args and
    keywords (launch options such as num_warps are not parameters); None if one is
    missing."""
    names = list(getattr(fn, "arg_names", ()))
    given = dict(zip(names, args, strict=False))
    given.update((k, v) for k, v in kwargs.items() if k in names)
    if not names or len(given) != len(names):
        return None
    return [given[n] for n in names]


def recall(plans: OrderedDict, key: Any) -> Any:
    """The plan kept under `key` (None if none), marked most recently used."""
    plan = plans.get(key)
    if plan is not None:
        plans.move_to_end(key)
    return plan


def remember(plans: OrderedDict, key: Any, plan: Any, limit: int) -> None:
    """Keep `plan` under `key` as the most recently used, dropping the least recently used
    past `limit` (read per call, so a module's limit may change)."""
    plans[key] = plan
    plans.move_to_end(key)
    while len(plans) > limit:
        plans.popitem(last=False)
