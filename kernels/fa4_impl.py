"""Registers FlashAttention-4 (`flash_attn.cute`, the flash-attn-4 package) as `fa4`.

FA4's kernels are written in the CuTe DSL and compiled at the first call of each shape
(no CUDA compiler needed), for sm90 (Hopper) and sm100 (Blackwell); the builder makes that
first call, outside the timed span. What this adapter relies on, read in flash-attn-4
4.0.0b36's `flash_attn/cute/interface.py`:

- `flash_attn_func(q, k, v, softmax_scale=None, causal=False, ...)` takes (batch, seqlen,
  heads, head_dim) tensors and returns a tuple `(out, lse)` (lse is None unless asked for
  or needed by a backward). It accepts any layout whose last dimension is contiguous with
  16-byte aligned strides (`maybe_contiguous`), so our tensors go in as transposed views.
- GQA natively: K and V may have fewer heads (heads_q % heads_kv == 0).
- `causal` is aligned bottom-right when seqlen_q != seqlen_k, as flash-attn's and ours.
- fp16 and bf16; head_dim a multiple of 8, 8..256 on sm90, 8..128 or 256 on sm100/sm110.

The case model has dense attention only; FA4 also takes `window_size`, `softcap` and, in
`flash_attn_varlen_func`, packed batches (`cu_seqlens_*`) and paged KV (`page_table`,
`seqused_k`). A new case axis adds its keyword in `_dense_kwargs` (or a variant beside
`_dense` that calls the varlen function) and drops its line from `_check`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from fa_bench.case import Case, DType, Mode
from fa_bench.kernels import peers
from fa_bench.registry import Prepared, Unsupported, register

FA4 = peers.Peer(
    what="FlashAttention-4",
    dist="flash-attn-4",
    module="flash_attn.cute",
    attr="flash_attn_func",
    extra="fa4",
    min_capability=(9, 0),
)


def _capability(device: object) -> tuple[int, int]:
    """The GPU's compute capability; sm90's rules where there is none (a CPU test fake)."""
    if getattr(device, "type", str(device)) == "cuda" and torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability(device)  # type: ignore[arg-type]
        return major, minor
    return (9, 0)


def _check(case: Case, device: object) -> str | None:
    """Why `fa4` cannot run this case on `device`, or None (FA4's own input checks)."""
    d = case.head_dim
    if d % 8:
        return f"FA4 needs head_dim a multiple of 8 (16 bytes), got {d}"
    major = _capability(device)[0]
    if major == 9 and not 8 <= d <= 256:
        return f"FA4 on sm90 takes head_dim 8..256, got {d}"
    if major in (10, 11) and not (8 <= d <= 128 or d == 256):
        return f"FA4 on sm100 takes head_dim 8..128 or 256, got {d}"
    return None


def _dense_kwargs(case: Case) -> dict:
    """The keywords of `flash_attn_func` that the case sets (the scale is its default,
    1/sqrt(head_dim), as ours)."""
    return {"causal": case.causal}


def _dense(case: Case, func: Callable) -> Callable[..., torch.Tensor]:
    kwargs = _dense_kwargs(case)

    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out = func(peers.bshd(q), peers.bshd(k), peers.bshd(v), **kwargs)
        # (out, lse) in 4.0.0b36; a bare tensor would unpack along the batch, so check.
        return (out[0] if isinstance(out, tuple) else out).transpose(1, 2)

    return fn


def build(case: Case, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Prepared:
    """The `fa4` builder: import, check the GPU, compile (the first call), return fn."""
    reason = peers.device_reason(FA4, q)
    if reason is not None:
        raise Unsupported(reason)
    fn = _dense(case, peers.load(FA4))
    peers.warm_up(fn, q, k, v, backward=case.mode is not Mode.FWD)
    return Prepared(fn, backend=f"{FA4.module}.{FA4.attr}")


register(
    "fa4",
    description=(
        "FlashAttention-4 (flash-attn-4: flash_attn.cute, CuTe DSL kernels for sm90/sm100), "
        "GQA native, bottom-right causal"
    ),
    modes=(Mode.FWD, Mode.BWD, Mode.FWD_BWD),
    dtypes=(DType.FP16, DType.BF16),
    devices=("cuda",),
    check=_check,
    availability=lambda: peers.availability(FA4),
)(build)
