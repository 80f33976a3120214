"""TMA helpers of the Gluon fp8 forward's host side (kernels/flash_gluon_fp8.py): the
16-byte alignment test, V's K-major storage padded for TMA, and the tensor descriptors
(moved out of flash_gluon_fp8.py to keep it under 400 lines)."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

_TMA_ALIGN = 16


def _aligned(t: Any, dims: tuple[int, ...], unit: int) -> bool:
    size = t.element_size()
    if t.stride(unit) != 1 or t.data_ptr() % _TMA_ALIGN:
        return False
    return not any((t.stride(d) * size) % _TMA_ALIGN for d in dims)


def padded_v(v: torch.Tensor) -> torch.Tensor:
    """V (B, H, S, D) stored K-major with each (D, ·) row padded to a multiple of 16 bytes
    (TMA's stride rule): the same values, a copy unless already so."""
    import torch

    if _aligned(v, (0, 1, 3), 2):
        return v
    batch, heads, seq, dim = v.shape
    padded = -(-seq // _TMA_ALIGN) * _TMA_ALIGN
    store = torch.empty((batch, heads, dim, padded), dtype=v.dtype, device=v.device)
    view = store[..., :seq]
    view.copy_(v.transpose(-1, -2))
    return view.transpose(-1, -2)


@functools.cache
def _smem_layout(block: tuple[int, ...], bf16: bool) -> Any:
    """The NVMMA shared layout of a TMA box (cached: it is asked for at every call)."""
    from triton.experimental.gluon import language as gl

    return gl.NVMMASharedLayout.get_default_for(list(block), gl.bfloat16 if bf16 else gl.float8e4nv)


def _descriptor(t: torch.Tensor, block: list[int]) -> Any:
    """A 4-D TMA descriptor over t with box `block`: bounds per (batch, head)."""
    import torch
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    layout = _smem_layout(tuple(block), t.dtype == torch.bfloat16)
    return TensorDescriptor(t, list(t.shape), list(t.stride()), block, layout)
