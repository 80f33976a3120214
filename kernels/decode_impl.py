"""Our decode kernel (`fa_bench.kernels.decode_attention`) behind the `triton` name: the
builder `triton` dispatches decode cases here (kernels/triton_impl.py).

The benchmark hands a decode case's cache dense, in SDPA layout (B, Hkv, S_max, D); the
kernel takes flash-attn's `flash_attn_with_kvcache` layout. Outside the timed span this
adapter makes that layout: a contiguous case gets a (B, S_max, Hkv, D) copy of the cache,
a paged one the pages and block table of fa_bench.run.decode_inputs.paged_cache; the
lengths become cache_seqlens (B,) int32. The call is planned here
(fa_bench.kernels.decode_plan: arguments and values checked once, the launch resolved,
outputs allocated, the kernels compiled and bound), so the timed call is the two kernel
launches; q and o are transposed views (the kernel takes any strides whose last one is
1). A q other than the planned one (never, in a run) takes a plain decode_attention call.
`Prepared.backend` says which layout ran, the launch (splits, key block, warps, stages),
whether a sweep fixed the split count, and whether the launches are bound.

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
    kernel's heuristic picks it); `{"fused_combine": bool}` and `{"merge_tile": bool}`
    how the splits are merged (DecodeConfig's fields of those names; else the
    heuristic's)."""
    try:
        from fa_bench.kernels.decode_attention import DecodeConfig, decode_attention
        from fa_bench.kernels.decode_plan import plan_decode
    except ImportError as exc:  # a checkout without the kernel module
        raise Unsupported(f"decode kernel not built: {exc}") from exc

    num_splits = (options or {}).get("num_splits")
    config = DecodeConfig(fused_combine=(options or {}).get("fused_combine"),
                          merge_tile=(options or {}).get("merge_tile"))  # fmt: skip
    seqlens = torch.tensor(case.context_lengths(), dtype=torch.int32, device=q.device)
    if case.page_size:
        k_cache, v_cache, table = paged_cache(case, k, v)
        layout = f"paged (pages, {case.page_size}, Hkv, D), shuffled block table"
    else:
        k_cache, v_cache = (t.transpose(1, 2).contiguous() for t in (k, v))
        table = None
        layout = "contiguous (B, S_max, Hkv, D) copy"

    # Checked, planned and (on a GPU) compiled and bound here, outside the timed span
    # (kernels/decode_plan.py: the host work of a plain call would be timed otherwise).
    plan = plan_decode(q.transpose(1, 2), k_cache, v_cache, cache_seqlens=seqlens,
                       block_table=table, num_splits=num_splits, config=config)  # fmt: skip
    plan.run()
    planned = (q.data_ptr(), q.shape, q.stride())

    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # k, v (the dense inputs) are not read: the caches built above are the kernel's.
        if (q.data_ptr(), q.shape, q.stride()) == planned:
            return plan.run().transpose(1, 2)
        # another q than planned: a plain call
        o = decode_attention(q.transpose(1, 2), k_cache, v_cache, cache_seqlens=seqlens,
                             block_table=table, num_splits=num_splits, config=config,
                             check_values=False)  # fmt: skip
        return cast(torch.Tensor, o).transpose(1, 2)

    if q.device.type == "cuda":
        torch.cuda.synchronize(q.device)
    # what the kernel launches (the heuristic's choices, or the fixed split count's)
    launch = plan.launch
    source = "heuristic" if num_splits is None else "fixed splits"
    order = ", interleaved" if launch.interleave else ""
    how = "planned launch" if plan.bound else f"JIT launch ({plan.bound_reason})"
    combine = ""
    if launch.num_splits > 1:
        combine = ", fused combine" if launch.fused_combine else ", combine kernel"
        combine += " (tile)" if launch.merge_tile else ""
        if plan.pdl:
            combine += " (PDL)"
    return Prepared(
        fn,
        backend=f"triton-decode: {layout}; {source}: {launch.num_splits} splits{order}, "
        f"block_n {launch.block_n}, {launch.num_warps} warps, {launch.num_stages} stages"
        f"{combine}; {how}",
    )
