"""Whether the Gluon forward for sm_90 can run these inputs (issue 21): `gluon_reason`
(None when it can) and what it rests on, the triton version (`version_reason`) and its
Gluon API (`_api_reason`).

Moved out of kernels/flash_gluon.py (which re-exports every name here), unchanged but for
one thing: `gluon_reason` keeps its answers in a bounded cache keyed on everything the
answer depends on (each tensor's shape, strides, dtype, device and base alignment, and
TRITON_INTERPRET), because the dispatch asks it inside every timed forward call and the
checks (the device capability above all) were ~10% of a short call's host time on the
H200 (tools/gpu/host_cost.py). Anything that is not a tensor is checked uncached.

Importing this module touches no device and no triton.
"""

from __future__ import annotations

import functools
import os
from collections import OrderedDict
from typing import Any

HEAD_DIMS = (64, 128, 256)
_TMA_ALIGN = 16

# Gluon is experimental and its API moves between triton releases (3.9 renamed the TMA
# copies, for one): the kernels are written for, and compiled against, 3.6.
GLUON_TRITON = "3.6"


def version_reason(version: str) -> str | None:
    """Why a triton of this version cannot build the kernels (None for 3.6.x)."""
    if version.split(".")[:2] != GLUON_TRITON.split("."):
        return (
            f"triton {version}: the Gluon kernels are written for triton {GLUON_TRITON}.x's "
            "Gluon API (experimental, it changes between releases)"
        )
    return None


@functools.cache
def _api_reason() -> str | None:
    """Why this triton's Gluon cannot build the kernels: none at all, another version."""
    try:
        import triton
        from triton.experimental.gluon import language as gl
        from triton.experimental.gluon.language.nvidia import hopper
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor  # noqa: F401
    except Exception as e:  # an old triton, or one without Gluon
        return f"triton has no usable Gluon ({type(e).__name__}: {e})"
    reason = version_reason(getattr(triton, "__version__", "?"))
    if reason:
        return reason
    missing = [
        name
        for name in ("warpgroup_mma", "warpgroup_mma_wait", "fence_async_shared")
        if not hasattr(hopper, name)
    ]
    if not hasattr(gl, "warp_specialize"):
        missing.append("warp_specialize")
    if missing:
        return f"triton {triton.__version__}'s Gluon lacks {', '.join(missing)}"
    return None


def _tensor_reason(name: str, t: Any) -> str | None:
    import torch

    if not isinstance(t, torch.Tensor):
        return f"{name} is a {type(t).__name__}, not a tensor"
    if t.dim() != 4:
        return f"{name} has shape {tuple(t.shape)}, expected (batch, heads, seqlen, head_dim)"
    if t.dtype not in (torch.float16, torch.bfloat16):
        return f"{name}.dtype={t.dtype}: the Gluon forward takes float16 and bfloat16"
    if t.stride(-1) != 1:
        return f"{name}.stride()={tuple(t.stride())}: the last stride must be 1 (TMA)"
    size = t.element_size()
    if t.data_ptr() % _TMA_ALIGN or any((s * size) % _TMA_ALIGN for s in t.stride()[:-1]):
        return f"{name}: base or strides {tuple(t.stride())} not 16-byte aligned (TMA)"
    return None


# gluon_reason's answers, least recently used first; bounded so that a process that sees
# many shapes (a sweep, a suite) keeps a few hundred small tuples, not one per call.
MAX_REASONS = 256
_REASONS: OrderedDict[tuple, str | None] = OrderedDict()


def _reason_key(q: Any, k: Any, v: Any) -> tuple | None:
    """What `_reason` reads of its inputs and the environment, or None when one of q, k, v
    is not a plain tensor (checked uncached: a non-tensor's check is cheap and rare, and a
    tensor subclass, a FakeTensor say, may not give its address)."""
    import torch

    key: list = [os.environ.get("TRITON_INTERPRET") == "1"]
    for t in (q, k, v):
        if type(t) is not torch.Tensor:
            return None
        key.append((t.shape, t.stride(), t.dtype, t.device, t.data_ptr() % _TMA_ALIGN))
    return tuple(key)


def gluon_reason(q: Any, k: Any, v: Any, causal: bool) -> str | None:
    """Why the Gluon kernel cannot run these inputs, or None if it can."""
    del causal  # both are supported
    key = _reason_key(q, k, v)
    if key is None:
        return _reason(q, k, v)
    try:
        reason = _REASONS[key]
    except KeyError:
        reason = _REASONS[key] = _reason(q, k, v)
        if len(_REASONS) > MAX_REASONS:
            _REASONS.popitem(last=False)
    else:
        _REASONS.move_to_end(key)
    return reason


def _reason(q: Any, k: Any, v: Any) -> str | None:
    """gluon_reason's checks, uncached."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        reason = _tensor_reason(name, t)
        if reason:
            return reason
    if os.environ.get("TRITON_INTERPRET") == "1":
        return "TRITON_INTERPRET=1: Gluon kernels do not run in the Triton interpreter"
    if q.device.type != "cuda" or k.device != q.device or v.device != q.device:
        return (
            f"q, k, v on {q.device}, {k.device}, {v.device}: the Gluon kernel needs one CUDA device"
        )
    import torch

    cap = torch.cuda.get_device_capability(q.device)
    if cap != (9, 0):
        return (
            f"compute capability {cap[0]}.{cap[1]}: the Gluon kernel is written for sm_90 (Hopper)"
        )
    if not (q.dtype == k.dtype == v.dtype):
        return f"dtypes q {q.dtype}, k {k.dtype}, v {v.dtype} differ"
    batch, heads_q, _, head_dim = q.shape
    if k.shape != v.shape or k.shape[0] != batch or k.shape[3] != head_dim:
        return f"shapes q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} do not match"
    if heads_q % k.shape[1]:
        return f"heads_q={heads_q} is not a multiple of heads_kv={k.shape[1]}"
    if head_dim not in HEAD_DIMS:
        return f"head_dim={head_dim}: the Gluon kernel takes {HEAD_DIMS}"
    if min(q.shape[2], k.shape[2]) < 1:
        return f"seqlen_q={q.shape[2]}, seqlen_k={k.shape[2]}: both must be at least 1"
    return _api_reason()
