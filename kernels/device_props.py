"""The CUDA device's SM count and L2 size, read once per device.

The launch planners size grids and tile orders by them (the persistent forwards' CTA
count, decoding's split count, the causal backward's head groups); reading the
properties costs a driver call, so each device's pair is cached. Off CUDA both are 0,
which every caller takes as "no GPU to plan for".
"""

from __future__ import annotations

import functools
from typing import Any


def sm_count(device: Any = None) -> int:
    """`device`'s SM count (a torch.device, a CUDA index, or None for the current
    device); 0 for a non-CUDA device or where CUDA is absent."""
    index = _index(device)
    return 0 if index is None else _props(index)[0]


def l2_bytes(device: Any = None) -> int:
    """`device`'s L2 cache in bytes (as `sm_count`: 0 off CUDA)."""
    index = _index(device)
    return 0 if index is None else _props(index)[1]


def _index(device: Any) -> int | None:
    import torch

    if not isinstance(device, int) and device is not None and torch.device(device).type != "cuda":
        return None
    if not torch.cuda.is_available():
        return None
    if isinstance(device, int):
        return device
    if device is None or torch.device(device).index is None:
        return torch.cuda.current_device()
    return torch.device(device).index


@functools.cache
def _props(index: int) -> tuple[int, int]:
    import torch

    p = torch.cuda.get_device_properties(index)
    return int(p.multi_processor_count), int(getattr(p, "L2_cache_size", 0) or 0)
