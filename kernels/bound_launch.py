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
        self.raw = _expanded(compiled, values)

    def __call__(self) -> None:
        c, hooks = self.compiled, self.knobs
        stream = self.stream_of(self.device)
        g0, g1, g2 = self.grid
        if self.raw is not None and hooks.launch_enter_hook is None:
            launch, head, args = self.raw
            launch(g0, g1, g2, stream, c.function, *head, c.packed_metadata, None, None,
                   hooks.launch_exit_hook, *args)  # fmt: skip
            return
        # as JITFunction.run: the metadata the launch hooks get (None without hooks)
        meta = c.launch_metadata(self.grid, stream, *self.values)
        c.run(g0, g1, g2, stream, c.function, c.packed_metadata, meta,
              hooks.launch_enter_hook, hooks.launch_exit_hook, *self.values)  # fmt: skip


def _expanded(compiled: Any, values: list) -> tuple | None:
    """(the launcher's C entry, its fixed arguments, `values` with every TMA descriptor
    already encoded), or None (then the launch goes through CompiledKernel.run).
    triton's NVIDIA launcher encodes each host descriptor into a CUtensorMap on every
    call (`make_tensordesc_arg`, one cuTensorMapEncodeTiled each); a bound launch's
    descriptors never change, so they are encoded once here. Reads triton 3.6's launcher
    wrapper (`wrap_handle_tensordesc`'s closure): another triton's layout gives None,
    and the callers' first-replay check compares the bound launch with the JIT's either
    way."""
    try:
        from triton.backends.nvidia.driver import make_tensordesc_arg

        run = compiled.run
        inner = run.launch
        head = (run.launch_cooperative_grid, run.launch_pdl, None, None)
        if run.global_scratch_size or run.profile_scratch_size:
            return None  # scratch is allocated per launch
        if not hasattr(inner, "__code__"):  # no descriptor: the C entry itself
            return inner, head, list(values)
        cells = (cell.cell_contents for cell in inner.__closure__ or ())
        free = dict(zip(inner.__code__.co_freevars, cells, strict=True))
        launcher, where = free["launcher"], free["tensordesc_indices"]
        meta = free["tensordesc_meta"]
        args: list = []
        for i, value in enumerate(values):
            if i in where:
                args.extend(make_tensordesc_arg(value, meta[len([j for j in where if j < i])]))
            else:
                args.append(value)
        return launcher, head, args
    except (AttributeError, ImportError, KeyError, TypeError, ValueError):
        return None


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


def signature(t: Any) -> tuple:
    """What a plan's key holds of a tensor (or a stand-in for one): its address, shape,
    strides and dtype."""
    return (t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.dtype)


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
