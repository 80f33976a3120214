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

Variant cases (issue 19): a window goes in as `window_size=(left, right)` with None for
unbounded (FA4's spelling; causal sets right to 0 itself), softcap as `softcap`. A packed
case's (1, H, T, D) inputs go to `flash_attn_varlen_func` as (T, H, D) views with int32
`cu_seqlens_q/k` and `max_seqlen_q/k` (the longest document), made outside the timed span.
ALiBi: none of the FA4 interfaces read (the public `flash_attn/cute/interface.py` up to
beta27; the b36 signature in tests/peer_fakes.py) takes `alibi_slopes` (its bias hooks are
CuTe DSL `score_mod`s), so the builder reads the installed function's signature and
records unsupported, naming it, where the keyword is absent.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable

import torch

from fa_bench.case import PREFILL_MODES, Case, DType, Mode, alibi_slopes
from fa_bench.kernels import peers
from fa_bench.registry import Prepared, Unsupported, register
from fa_bench.run.decode_inputs import paged_cache
from fa_bench.run.variant_inputs import cu_seqlens

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
    1/sqrt(head_dim), as ours); a variant's window and softcap only where set, so a plain
    case calls FA4 exactly as before."""
    kwargs: dict = {"causal": case.causal}
    if case.window_left >= 0 or case.window_right >= 0:
        kwargs["window_size"] = tuple(None if w < 0 else w for w in
                                      (case.window_left, case.window_right))  # fmt: skip
    if case.softcap:
        kwargs["softcap"] = float(case.softcap)
    return kwargs


def _takes(func: Callable, name: str) -> bool:
    """Whether `func` takes the keyword `name` (True where its signature cannot be read)."""
    try:
        params = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):
        return True
    return any(p.name == name or p.kind is p.VAR_KEYWORD for p in params)


def _alibi_kwargs(case: Case, func: Callable, device: torch.device) -> dict:
    """ALiBi's slopes as `alibi_slopes` where the installed FA4 takes them, else Unsupported."""
    if not case.alibi:
        return {}
    if not _takes(func, "alibi_slopes"):
        raise Unsupported(
            f"{FA4.module}.{func.__name__} takes no alibi_slopes: this flash-attn-4 has no "
            "ALiBi (only CuTe DSL score_mods, not wired here)"
        )
    slopes = torch.tensor(alibi_slopes(case.heads_q), dtype=torch.float32, device=device)
    return {"alibi_slopes": slopes}


def _varlen(case: Case, func: Callable, kwargs: dict, device: torch.device) -> Callable:
    """A packed case: (1, H, T, D) in, `func` on (T, H, D) views with the documents'
    cu_seqlens (made here, outside the timed span), (1, H, T, D) out."""
    cu = cu_seqlens(case, device)
    longest = max(case.sequence_lengths())
    kwargs = dict(kwargs, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=longest,
                  max_seqlen_k=longest)  # fmt: skip

    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        packed = (t[0].transpose(0, 1) for t in (q, k, v))
        out = func(*packed, **kwargs)
        return (out[0] if isinstance(out, tuple) else out).transpose(0, 1).unsqueeze(0)

    return fn


def _dense(case: Case, func: Callable, extra: dict | None = None) -> Callable[..., torch.Tensor]:
    kwargs = {**_dense_kwargs(case), **(extra or {})}

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
    if case.varlen:
        func = peers.load(FA4_VARLEN)
        kwargs = {**_dense_kwargs(case), **_alibi_kwargs(case, func, q.device)}
        fn, spec = _varlen(case, func, kwargs, q.device), FA4_VARLEN
    else:
        func = peers.load(FA4)
        fn, spec = _dense(case, func, _alibi_kwargs(case, func, q.device)), FA4
    peers.warm_up(fn, q, k, v, backward=case.mode.backward)
    return Prepared(fn, backend=f"{spec.module}.{spec.attr}")


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
