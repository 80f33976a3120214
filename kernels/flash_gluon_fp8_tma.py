"""TMA helpers of the Gluon fp8 forward's host side (kernels/flash_gluon_fp8.py): the
16-byte alignment test, why the kernel cannot run some inputs (fp8_gluon_reason), V's
K-major storage padded for TMA, and the tensor descriptors (moved out of
flash_gluon_fp8.py to keep it under 400 lines)."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from fa_bench.kernels import flash_gluon

if TYPE_CHECKING:
    import torch

_TMA_ALIGN = 16
HEAD_DIMS = (64, 128)


def _aligned(t: Any, dims: tuple[int, ...], unit: int) -> bool:
    size = t.element_size()
    if t.stride(unit) != 1 or t.data_ptr() % _TMA_ALIGN:
        return False
    return not any((t.stride(d) * size) % _TMA_ALIGN for d in dims)


def fp8_gluon_reason(q: Any, k: Any, v: Any, allow_v_copy: bool = False) -> str | None:
    """Why the Gluon fp8 kernel cannot run these (already validated) fp8 inputs, or None.
    `allow_v_copy`: a V not stored K-major with 16-byte aligned rows is accepted (the
    launch copies it into such storage, `padded_v`)."""
    import os

    import torch

    if q.device.type != "cuda":
        return f"q is on {q.device}: the Gluon kernel needs a CUDA device (sm_90)"
    if os.environ.get("TRITON_INTERPRET") == "1":
        return "TRITON_INTERPRET=1: Gluon kernels do not run in the Triton interpreter"
    cap = torch.cuda.get_device_capability(q.device)
    if cap != (9, 0):
        return f"compute capability {cap[0]}.{cap[1]}: the Gluon fp8 kernel is written for sm_90"
    head_dim = q.shape[-1]
    if head_dim not in HEAD_DIMS:
        return f"head_dim={head_dim}: the Gluon fp8 kernel takes {HEAD_DIMS}"
    for name, t in (("q", q), ("k", k)):
        if not _aligned(t, (0, 1, 2), 3):
            return f"{name}: base or strides {tuple(t.stride())} not 16-byte aligned (TMA)"
    if not allow_v_copy and not _aligned(v, (0, 1, 3), 2):
        # (with seqlen_k 1 torch may give the size-1 dimension any stride: copied too)
        return (
            f"v: strides {tuple(v.stride())} (seqlen_k={v.shape[2]}) are not K-major "
            "(fp8_v_layout) with 16-byte aligned rows (TMA)"
        )
    return flash_gluon._api_reason()


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
