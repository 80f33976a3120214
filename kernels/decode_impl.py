"""Our decode kernel (`fa_bench.kernels.decode_attention`) behind the `triton` name: the
builder `triton` dispatches decode cases here (kernels/triton_impl.py).

The benchmark hands a decode case's cache dense, in SDPA layout (B, Hkv, S_max, D); the
kernel takes flash-attn's `flash_attn_with_kvcache` layout. Outside the timed span this
adapter makes that layout: a contiguous case gets a (B, S_max, Hkv, D) copy of the cache,
a paged one the pages and block table of fa_bench.run.decode_inputs.paged_cache; the
lengths become cache_seqlens (B,) int32. The timed call passes q and o as transposed
views (the kernel takes any strides whose last one is 1) and skips the kernel's value
checks, which read the lengths and block table back to the host: they run once here.
`Prepared.backend` says which layout ran and the launch (splits, key block, warps,
stages), and whether a sweep fixed the split count.

Like triton_impl, the kernel module is imported inside the builder: triton decides
whether to interpret the kernels when they are defined (TRITON_INTERPRET, set by the
runner for CPU workers).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import cast

import torch

from fa_bench.case import Case, DType, Mode
from fa_bench.registry import Prepared, Unsupported
from fa_bench.run.decode_inputs import paged_cache

# The decode kernel's head dims (fa_bench.kernels.decode_attention's docstring): multiples
# of 8 up to 256.
HEAD_DIM_MULTIPLE = 8
MAX_HEAD_DIM = 256


def check(case: Case, device: object) -> str | None:
    """Why our decode kernel cannot run `case` on `device`, or None."""
    if case.head_dim % HEAD_DIM_MULTIPLE or case.head_dim > MAX_HEAD_DIM:
        return (
            f"the decode kernel takes head_dim a multiple of {HEAD_DIM_MULTIPLE} up to "
            f"{MAX_HEAD_DIM}, got {case.head_dim}"
        )
    return interpreter_reason(case, device)


def interpreter_reason(case: Case, device: object) -> str | None:
    """Why a Triton kernel of ours cannot run `case` on a CPU `device`, or None: on a CPU
    they run only in the interpreter, whose bf16 tl.dot is wrong."""
    if getattr(device, "type", str(device)) == "cpu":
        if os.environ.get("TRITON_INTERPRET") != "1":
            return "CPU runs need the Triton interpreter (TRITON_INTERPRET=1)"
        if case.dtype is DType.BF16:
            return "bf16 is wrong in the Triton CPU interpreter (tl.dot on bf16 operands)"
    return None


def with_decode(support: dict) -> dict:
    """A prefill registration's `register(...)` keywords (modes, dtypes, devices, check)
    extended to decode cases: Mode.DECODE added, decode cases checked by `check`."""
    prefill_check: Callable[[Case, object], str | None] | None = support.get("check")

    def check_any(case: Case, device: object) -> str | None:
        if case.mode is Mode.DECODE:
            return check(case, device)
        return prefill_check(case, device) if prefill_check else None

    return {**support, "modes": (*support["modes"], Mode.DECODE), "check": check_any}


def build(
    case: Case, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, options: dict | None = None
) -> Prepared:
    """The decode builder. `options={"num_splits": n}` fixes the split count (else the
    kernel's heuristic picks it)."""
    try:
        from fa_bench.kernels.decode_attention import decode_attention, plan_launch
    except ImportError as exc:  # a checkout without the kernel module
        raise Unsupported(f"decode kernel not built: {exc}") from exc

    num_splits = (options or {}).get("num_splits")
    seqlens = torch.tensor(case.context_lengths(), dtype=torch.int32, device=q.device)
    if case.page_size:
        k_cache, v_cache, table = paged_cache(case, k, v)
        layout = f"paged (pages, {case.page_size}, Hkv, D), shuffled block table"
    else:
        k_cache, v_cache = (t.transpose(1, 2).contiguous() for t in (k, v))
        table = None
        layout = "contiguous (B, S_max, Hkv, D) copy"

    def call(q: torch.Tensor, check_values: bool) -> torch.Tensor:
        o = decode_attention(q.transpose(1, 2), k_cache, v_cache, cache_seqlens=seqlens,
                             block_table=table, num_splits=num_splits,
                             check_values=check_values)  # fmt: skip
        return cast(torch.Tensor, o).transpose(1, 2)  # return_lse=False: o alone

    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # k, v (the dense inputs) are not read: the caches built above are the kernel's.
        return call(q, check_values=False)

    # Validate the lengths and table once, and compile (on a GPU) outside the timed span.
    call(q, check_values=True)
    if q.device.type == "cuda":
        torch.cuda.synchronize(q.device)
    # what the kernel launches (the heuristic's choices, or the fixed split count's)
    launch = plan_launch(q.transpose(1, 2), k_cache, table, num_splits)
    source = "heuristic" if num_splits is None else "fixed splits"
    order = ", interleaved" if launch.interleave else ""
    return Prepared(
        fn,
        backend=f"triton-decode: {layout}; {source}: {launch.num_splits} splits{order}, "
        f"block_n {launch.block_n}, {launch.num_warps} warps, {launch.num_stages} stages",
    )
