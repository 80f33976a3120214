"""The Gluon backward's TMA descriptors (issue 18): the (B, H, S, D) tensors' boxes and the
lse2/delta rows (padded to 16-byte strides where they must be). On their own so that the
launch plan (flash_gluon_bwd_plan) and the kernel's host side (flash_gluon_bwd) both take
them without importing each other."""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


def _descriptor(t: Any, rows: int, cols: int = 0) -> Any:
    """A 4-D TMA descriptor over (B, H, S, D) (a tensor or a planned launch's stand-in)
    with a [1, 1, rows, cols or D] box: bounds per head."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    block = [1, 1, rows, cols or t.shape[3]]
    layout = _box_layout(tuple(block), t.dtype)
    return TensorDescriptor(t, list(t.shape), list(t.stride()), block, layout)


@functools.cache
def _box_layout(block: tuple, dtype: Any) -> Any:
    """The box's shared layout, cached: building it was a third of a descriptor's host
    time for the forward (kernels/flash_gluon_plan.py), and a backward builds twelve."""
    import torch
    from triton.experimental.gluon import language as gl

    dtypes = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16, torch.float32: gl.float32}
    return gl.NVMMASharedLayout.get_default_for(list(block), dtypes[dtype])


@functools.cache
def row_layout() -> Any:
    """The shared layout of the lse2/delta tiles ([1, rows] fp32, unswizzled: the kernel
    reads each as a plain vector)."""
    from triton.experimental.gluon import language as gl

    return gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)


def tma_rows(t: torch.Tensor) -> torch.Tensor:
    """(batch, heads, seq) fp32 as the 2-D (batch · heads, seq') tensor the kernel's row
    descriptors read: a view when seq is a multiple of 4 and the rows are contiguous,
    else a copy with seq zero-padded to one (TMA needs 16-byte row strides; the padding
    is read only by rows past seq_q, whose Q and dO are zeros too)."""
    import torch.nn.functional as F

    flat = t.reshape(-1, t.shape[-1])
    if flat.shape[1] % 4 or flat.stride(0) % 4 or flat.stride(1) != 1:
        flat = F.pad(flat, (0, -flat.shape[1] % 4)).contiguous()
    return flat


def _row_descriptor(t: Any, rows: int) -> Any:
    """A 2-D TMA descriptor over `tma_rows(t)` with a [1, rows] box: bounds per head. A
    planned launch's stand-in (no reshape) must have rows that are a view: contiguous,
    seq a multiple of 4 (flash_gluon_bwd_plan.plannable)."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    if hasattr(t, "reshape"):
        flat = tma_rows(t)
        shape, strides = list(flat.shape), list(flat.stride())
    else:
        flat, seq = t, t.shape[-1]
        shape, strides = [int(math.prod(t.shape[:-1])), seq], [seq, 1]
    return TensorDescriptor(flat, shape, strides, [1, rows], row_layout())
