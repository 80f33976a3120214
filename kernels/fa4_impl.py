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

Decode cases (Mode.DECODE) run `flash_attn_varlen_func(q, k, v, seqused_k=...,
page_table=..., causal=True)`: q (batch, Sq, heads, head_dim) with no cu_seqlens_q, the
cache contiguous (batch, S_max, heads_kv, head_dim) or paged (num_pages, page_size,
heads_kv, head_dim) with page_table (batch, max_pages) int32, and seqused_k (batch,) int32
the context lengths; causal aligns bottom-right to each sequence's seqused_k. Read in the
public source from fa4-v4.0.0.beta0 to beta27 (the last tag this session could read; paged
KV on sm90 from beta10 on; split-KV refused on sm90, so num_splits stays 1); b36 itself
could not be read, so the builder checks that the installed function takes `page_table`
and `seqused_k` and records unsupported, naming them, where it does not.

The case model has no window or softcap; FA4 also takes `window_size` and `softcap`. A new
case axis adds its keyword in `_dense_kwargs` and drops its line from `_check`.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable

import torch

from fa_bench.case import PREFILL_MODES, Case, DType, Mode
from fa_bench.kernels import peers
from fa_bench.registry import Prepared, Unsupported, register
from fa_bench.run.decode_inputs import paged_cache

FA4 = peers.Peer(
    what="FlashAttention-4",
    dist="flash-attn-4",
    module="flash_attn.cute",
    attr="flash_attn_func",
    extra="fa4",
    min_capability=(9, 0),
)
# Its varlen entry point: decode cases (ragged lengths, paged caches).
FA4_VARLEN = dataclasses.replace(FA4, attr="flash_attn_varlen_func")
_DECODE_KEYWORDS = ("seqused_k", "page_table", "causal")


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


def _decode(
    case: Case, func: Callable, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> tuple[Callable[..., torch.Tensor], str]:
    """A decode case's fn and its layout's label. The flash-attn layout of the cache (a
    (B, S_max, Hkv, D) copy, or paged_cache's pages) is made here, outside the timed span."""
    try:
        params = list(inspect.signature(func).parameters.values())
    except (TypeError, ValueError):  # no signature to read: nothing is verified
        params = []
    missing = [name for name in _DECODE_KEYWORDS if name not in {p.name for p in params}]
    if missing and not any(p.kind is p.VAR_KEYWORD for p in params):
        raise Unsupported(
            f"{FA4_VARLEN.module}.{FA4_VARLEN.attr} takes no {', '.join(missing)}: this "
            "flash-attn-4 cannot run a decode case (varlen KV, paged cache)"
        )
    seqused_k = torch.tensor(case.context_lengths(), dtype=torch.int32, device=q.device)
    if case.page_size:
        k_cache, v_cache, table = paged_cache(case, k, v)
        layout = f"page_table, page {case.page_size}"
    else:
        k_cache, v_cache = (peers.bshd(t).contiguous() for t in (k, v))
        table, layout = None, "contiguous (B, S_max, Hkv, D) copy"

    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # k, v (the dense inputs) are not read: the caches above are FA4's.
        out = func(peers.bshd(q), k_cache, v_cache, seqused_k=seqused_k, page_table=table,
                   causal=True)  # fmt: skip
        return (out[0] if isinstance(out, tuple) else out).transpose(1, 2)

    return fn, f"{layout}, seqused_k"


def build(case: Case, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Prepared:
    """The `fa4` builder: import, check the GPU, compile (the first call), return fn."""
    reason = peers.device_reason(FA4, q)
    if reason is not None:
        raise Unsupported(reason)
    if case.mode is Mode.DECODE:
        fn, layout = _decode(case, peers.load(FA4_VARLEN), q, k, v)
        peers.warm_up(fn, q, k, v, backward=False)
        return Prepared(fn, backend=f"{FA4_VARLEN.module}.{FA4_VARLEN.attr}: {layout}")
    fn = _dense(case, peers.load(FA4))
    peers.warm_up(fn, q, k, v, backward=case.mode.backward)
    return Prepared(fn, backend=f"{FA4.module}.{FA4.attr}")


register(
    "fa4",
    description=(
        "FlashAttention-4 (flash-attn-4: flash_attn.cute, CuTe DSL kernels for sm90/sm100), "
        "GQA native, bottom-right causal; decode through flash_attn_varlen_func (seqused_k, "
        "page_table)"
    ),
    modes=(*PREFILL_MODES, Mode.DECODE),
    dtypes=(DType.FP16, DType.BF16),
    devices=("cuda",),
    check=_check,
    availability=lambda: peers.availability(FA4),
)(build)
