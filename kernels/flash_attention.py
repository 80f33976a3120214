"""FlashAttention-2 forward and backward in Triton, with GQA, bottom-right causal masking,
arbitrary sequence lengths, head dims that are multiples of 8 up to 256, any strides
whose last one is 1, and issue 19's variants: sliding windows, ALiBi, softcap (checked in
flash_validate.py) and packed batches (flash_varlen.py, through `_run`).

Reads top-down: the launchers of the `@triton.jit` kernels (which live in
fa_bench.kernels.flash_kernels, the forward, flash_kernels_bwd, the backward
preprocessing, dK/dV and dQ, and flash_kernels_bwd1, the one-pass backward; imported at
the first launch, see `_kernels`), then the
`torch.autograd.Function`, then `flash_attention`.

Conventions inside the kernels:
- scores live in the log2 domain: s2 = (q·k) · scale · log2(e), so exp2 replaces exp;
- the forward saves lse2 = log2(sum_j exp2(s2_j)) per query row; a row that sees no key
  (causal with seqlen_q > seqlen_k) gets lse2 = +inf, so the backward's
  p = exp2(s2 - lse2) is 0 there and its gradients are 0 with no special case;
- causal is bottom-right: query i sees key j iff j <= i + (seqlen_k - seqlen_q);
- two backwards, both with dK/dV programs that own one KV block and loop over every query
  head of the GQA group (so dK/dV need no atomics):
  - one-pass (`deterministic=False`; the Gluon kernel of flash_gluon_bwd.py on sm_90,
    else flash_kernels_bwd1.py): the same program also computes its share of dQ (dS K)
    and adds it into a zeroed fp32 workspace (B, Hq, Sq, D) (TMA reduce-adds, or atomic
    adds in the `tl` kernel); a small kernel writes dQ = scale · workspace in the input
    dtype. Five matmuls per (key block, query block) pair; dQ's last bits depend on the
    order of the adds. On the H200 the Gluon kernel measured 1.24-1.36x the two-kernel
    backward (2026-12-01, docs/results-h200.md); the `tl` one was slower than it;
  - two-kernel (`deterministic=True`; flash_kernels_bwd.py): dQ is a separate kernel
    that recomputes S and dP (seven matmuls per pair); no atomics anywhere, so repeated
    calls give bitwise identical gradients.
  The default (`deterministic=None`) is the Gluon one-pass backward where it runs (sm_90,
  fp16/bf16, head_dim 64/128, no variant) and the two-kernel backward elsewhere.
"""

from __future__ import annotations

import functools
import math
from types import SimpleNamespace

import torch

from fa_bench.kernels import flash_dispatch, flash_gluon
from fa_bench.kernels.flash_config import FlashConfig, heuristic_config, pad_pow2
from fa_bench.kernels.flash_validate import Variant, backward_grids, make_variant
from fa_bench.kernels.flash_validate import check_inputs as _validate
from fa_bench.kernels.flash_validate import interpreting as _interpreting
from fa_bench.kernels.flash_validate import programs as _programs

_LOG2E = 1.4426950408889634
_LN2 = 0.6931471805599453
# Rows per program of the backward's preprocessing (delta = rowsum(dO·O)): a cheap
# elementwise pass whose tile is not part of FlashConfig.
_PREPROCESS_ROWS = 64
# TMA (device-side tensor descriptors) needs sm_90+ and 16-byte aligned bases and strides.
_TMA_MIN_MAJOR = 9
_TMA_ALIGN_BYTES = 16


# ---------------------------------------------------------------------------------------
# Launchers
# ---------------------------------------------------------------------------------------


@functools.cache
def _kernels() -> SimpleNamespace:
    """The `@triton.jit` kernels, imported (with triton) at the first launch: whether
    triton interprets is fixed when triton and the kernels are first imported, so
    importing this module must not import them (see the package docstring)."""
    from fa_bench.kernels import flash_kernels, flash_kernels_bwd, flash_kernels_bwd1

    return SimpleNamespace(
        fwd=flash_kernels._fwd_kernel,
        preprocess=flash_kernels_bwd._bwd_preprocess_kernel,
        dkdv=flash_kernels_bwd._bwd_dkdv_kernel,
        dq=flash_kernels_bwd._bwd_dq_kernel,
        one_pass=flash_kernels_bwd1._bwd1_kernel,
        dq_post=flash_kernels_bwd1._bwd1_dq_postprocess_kernel,
    )


def _cdiv(n: int, d: int) -> int:
    """`triton.cdiv` for the grids, without importing triton here."""
    return (n + d - 1) // d


def _last_dim_unit(t: torch.Tensor) -> torch.Tensor:
    """Any strides work as long as the last one is 1; otherwise copy."""
    return t if t.stride(-1) == 1 else t.contiguous()


def _strides(t: torch.Tensor) -> tuple[int, int, int]:
    return t.stride(0), t.stride(1), t.stride(2)


def _dot_precision(dtype: torch.dtype) -> str:
    # fp32 inputs: exact fp32 products (tf32 would miss the float64 accuracy bound).
    return "ieee" if dtype == torch.float32 else "tf32"


@functools.cache
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def _resolve_config(
    config: FlashConfig | None,
    q: torch.Tensor,
    seqlen_k: int,
    causal: bool,
    variant: Variant | None = None,
) -> FlashConfig:
    if config is not None:
        if not isinstance(config, FlashConfig):
            raise TypeError(f"config must be a FlashConfig, got {type(config).__name__}")
        return config
    # The library's own heuristic only: a tuning cache is the application's choice, made
    # by the caller (the `triton` registry adapter passes its config explicitly).
    seqlen = max(q.shape[2], seqlen_k)
    if variant is not None and variant.varlen is not None:  # the longest sequence's tiles
        seqlen = max(variant.varlen.max_q, variant.varlen.max_k)
    # a window, softcap or ALiBi: the dense config of the shape (the H200 measured the
    # window's forward 13% faster with its 128-key tile than with 64, docs/kernel.md)
    return heuristic_config(q.shape[-1], q.dtype, causal, q.device, seqlen)


def _tma_alloc(size: int, alignment: int, stream: int | None) -> torch.Tensor:
    """triton's allocator protocol; torch's allocations are aligned well beyond it."""
    return torch.empty(size, dtype=torch.int8, device="cuda")


def _ensure_tma_allocator() -> None:
    """Device-side descriptors need global scratch; Triton asks this allocator for it.

    `triton.set_allocator` stores the allocator in a ContextVar (triton 3.6 to 3.9:
    triton.runtime._allocation._allocator), so it holds only in the thread/context that
    set it: autograd runs the backward on its own thread, which starts with triton's
    NullAllocator. A module-global "already set" flag therefore broke every TMA backward
    on the GPU (issue 18); we check this context's value at each TMA launch instead.
    An allocator the application set itself is kept.
    """
    import triton

    try:
        from triton.runtime import _allocation

        current = _allocation._allocator.get()
        unset = isinstance(current, _allocation.NullAllocator)
    except (ImportError, AttributeError):  # triton moved its internals: set it every time
        unset = True
    if unset:
        triton.set_allocator(_tma_alloc)


def _tma_ok(*tensors: torch.Tensor) -> bool:
    """TMA needs sm_90+, 16-byte aligned bases and 16-byte multiple strides."""
    if _interpreting() or tensors[0].device.type != "cuda":
        return False
    if _capability(tensors[0].device.index or 0)[0] < _TMA_MIN_MAJOR:
        return False
    align = _TMA_ALIGN_BYTES
    for t in tensors:
        size = t.element_size()
        if t.data_ptr() % align or any((s * size) % align for s in _strides(t)):
            return False
    return True


def _forward(q, k, v, causal: bool, scale: float, cfg: FlashConfig, variant: Variant | None = None):
    """(o, lse2) of a (B, H, S, D) call; a packed batch comes as (1, H, T, D) views with
    `variant.varlen` (lse2 is then (1, H, T), flash-attn's (H, T))."""
    gluon = flash_dispatch.gluon_choice(q, k, v, causal, cfg, variant)
    if gluon is not None and variant is not None:  # issue 19's variants in Gluon
        from fa_bench.kernels import flash_gluon_varhost

        return flash_gluon_varhost.variant_forward(q, k, v, causal, scale, gluon, variant)
    if gluon is not None:  # sm_90, no variant: the warp-specialised Gluon kernel
        return flash_gluon.gluon_forward(q, k, v, causal, scale, gluon, checked=True)
    batch, heads_q, seq_q, head_dim = q.shape
    heads_kv, seq_k = k.shape[1], k.shape[2]
    o = torch.empty_like(q)  # keeps q's layout: a (B, S, H, D) view in gives one out
    lse2 = torch.empty((batch, heads_q, seq_q), device=q.device, dtype=torch.float32)
    use_tma = cfg.use_tma and _tma_ok(q, k, v, o)
    if use_tma:
        _ensure_tma_allocator()
    blocks, seqs = _programs(variant, batch, seq_q, cfg.block_m)
    extra = {} if variant is None else variant.kernel_args()
    even_q = seq_q % cfg.block_m == 0 and not extra.get("VARLEN")
    _kernels().fwd[(blocks, seqs * heads_q)](
        q, k, v, o, lse2,
        *_strides(q), *_strides(k), *_strides(v), *_strides(o),
        heads_q, heads_q // heads_kv, seq_q, seq_k, scale * _LOG2E,
        HEAD_DIM=head_dim, HEAD_DIM_PAD=pad_pow2(head_dim),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        CAUSAL=causal, EVEN_Q=even_q,
        USE_TMA=use_tma, WARP_SPECIALIZE=use_tma and cfg.warp_specialize,
        DOT_PREC=_dot_precision(q.dtype),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, **extra,
    )  # fmt: skip
    return o, lse2


def _preprocess(do, o, lse2):
    """delta = rowsum(dO ∘ O) in fp32, (B, Hq, Sq): both backwards start with it."""
    batch, heads_q, seq_q, head_dim = o.shape
    delta = torch.empty_like(lse2)
    rows = _PREPROCESS_ROWS
    _kernels().preprocess[(_cdiv(seq_q, rows), batch * heads_q)](
        o, do, delta, *_strides(o), *_strides(do), heads_q, seq_q,
        HEAD_DIM=head_dim, HEAD_DIM_PAD=pad_pow2(head_dim), BLOCK_M=rows,
    )  # fmt: skip
    return delta


def _backward_deterministic(
    do, q, k, v, o, lse2, causal: bool, scale: float, cfg: FlashConfig, variant=None
):
    """The two-kernel backward: dK/dV, then dQ recomputing S and dP (seven matmuls per
    tile pair, no atomics, bitwise reproducible)."""
    batch, heads_q, seq_q, head_dim = q.shape
    heads_kv, seq_k = k.shape[1], k.shape[2]
    group = heads_q // heads_kv
    pad = pad_pow2(head_dim)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    delta = _preprocess(do, o, lse2)
    # dK/dV holds `held` keys and streams query rows; dQ holds `held` query rows and
    # streams keys (see kernels/flash_config.py). A packed batch's programs run its
    # (sequence, block) pairs heaviest first (flash_validate.backward_grids).
    held, streamed = cfg.bwd_block_n, cfg.bwd_block_m
    prec = _dot_precision(q.dtype)
    extra, dkdv_grid, dq_grid = backward_grids(
        variant, causal, batch, heads_q, heads_kv, seq_q, seq_k, held
    )
    packed = bool(extra.get("VARLEN"))
    _kernels().dkdv[dkdv_grid](
        q, k, v, do, dk, dv, lse2, delta,
        *_strides(q), *_strides(k), *_strides(v), *_strides(do), *_strides(dk), *_strides(dv),
        heads_q, heads_kv, group, seq_q, seq_k, scale * _LOG2E, scale,
        HEAD_DIM=head_dim, HEAD_DIM_PAD=pad, BLOCK_HELD=held, BLOCK_STREAMED=streamed,
        CAUSAL=causal, EVEN_Q=seq_q % streamed == 0 and not packed,
        EVEN_K=seq_k % held == 0 and not packed, DOT_PREC=prec,
        num_warps=cfg.bwd_num_warps, num_stages=cfg.bwd_num_stages, **extra,
    )  # fmt: skip
    _kernels().dq[dq_grid](
        q, k, v, do, dq, lse2, delta,
        *_strides(q), *_strides(k), *_strides(v), *_strides(do), *_strides(dq),
        heads_q, group, seq_q, seq_k, scale * _LOG2E, scale,
        HEAD_DIM=head_dim, HEAD_DIM_PAD=pad, BLOCK_HELD=held, BLOCK_STREAMED=streamed,
        CAUSAL=causal, EVEN_Q=seq_q % held == 0 and not packed, DOT_PREC=prec,
        num_warps=cfg.bwd_num_warps, num_stages=cfg.bwd_num_stages, **extra,
    )  # fmt: skip
    return dq, dk, dv


def _backward_one_pass(do, q, k, v, o, lse2, causal: bool, scale: float, cfg: FlashConfig):
    """The one-pass backward: one program per key block streams the query blocks (five
    matmuls per tile pair) and adds its dQ share into a zeroed fp32 workspace; a small
    kernel then writes dQ = scale · workspace in q's dtype."""
    batch, heads_q, seq_q, head_dim = q.shape
    heads_kv, seq_k = k.shape[1], k.shape[2]
    pad = pad_pow2(head_dim)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    delta = _preprocess(do, o, lse2)
    dq_ws = torch.zeros((batch, heads_q, seq_q, head_dim), device=q.device, dtype=torch.float32)
    held, streamed = cfg.bwd_block_n, cfg.bwd_block_m
    # the descriptor's reduce-add needs what the forward's TMA loads need (the workspace
    # is contiguous fp32 with head_dim a multiple of 8: always aligned)
    use_tma = cfg.use_tma and _tma_ok(dq_ws)
    if use_tma:
        _ensure_tma_allocator()
    blocks, heads = _cdiv(seq_k, held), batch * heads_kv
    # causal: the key block on the slow axis, so every head's heaviest blocks go first
    grid = (heads, blocks) if causal else (blocks, heads)
    _kernels().one_pass[grid](
        q, k, v, do, dk, dv, lse2, delta, dq_ws,
        *_strides(q), *_strides(k), *_strides(v), *_strides(do), *_strides(dk), *_strides(dv),
        heads_q, heads_kv, heads_q // heads_kv, seq_q, seq_k, scale * _LOG2E, scale,
        HEAD_DIM=head_dim, HEAD_DIM_PAD=pad, BLOCK_HELD=held, BLOCK_STREAMED=streamed,
        CAUSAL=causal, EVEN_Q=seq_q % streamed == 0, EVEN_K=seq_k % held == 0,
        USE_TMA=use_tma, DOT_PREC=_dot_precision(q.dtype),
        num_warps=cfg.bwd_num_warps, num_stages=cfg.bwd_num_stages,
    )  # fmt: skip
    rows = _PREPROCESS_ROWS
    _kernels().dq_post[(_cdiv(seq_q, rows), batch * heads_q)](
        dq_ws, dq, *_strides(dq), heads_q, seq_q, scale,
        HEAD_DIM=head_dim, HEAD_DIM_PAD=pad, BLOCK_M=rows,
    )  # fmt: skip
    return dq, dk, dv


def _backward(
    do, q, k, v, o, lse2, causal: bool, scale: float, cfg: FlashConfig,
    deterministic: bool | None,
    variant: Variant | None = None,
):  # fmt: skip
    do = _last_dim_unit(do)
    if deterministic:
        return _backward_deterministic(do, q, k, v, o, lse2, causal, scale, cfg, variant)
    from fa_bench.kernels import flash_gluon_bwd  # FlashConfig.backward: tl or Gluon

    default = deterministic is None
    gluon = flash_gluon_bwd.backward_choice(
        q, k, v, o, do, causal, cfg, default=default, variant=variant
    )
    if gluon is not None:  # sm_90, fp16/bf16, head_dim 64/128: the warp-specialised kernel
        # checked: backward_choice has just asked gluon_bwd_reason (once per timed call)
        return flash_gluon_bwd.gluon_backward(
            do, q, k, v, o, lse2, causal, scale, gluon, checked=True, variant=variant
        )
    if default:  # elsewhere the two-kernel backward (the `tl` one-pass one was slower)
        return _backward_deterministic(do, q, k, v, o, lse2, causal, scale, cfg, variant)
    if variant is not None:  # the `tl` one-pass kernel has no variant
        why = flash_gluon_bwd.gluon_bwd_reason(q, k, v, o, do, causal, variant)
        raise ValueError(
            "deterministic=False (a one-pass backward) runs a window, ALiBi or softcap only "
            f"in the Gluon backward, which cannot run this call ({why or 'FlashConfig'}"
            f"(backward={cfg.backward!r})); leave deterministic at None (the default) or "
            "set True for their gradients"
        )
    return _backward_one_pass(do, q, k, v, o, lse2, causal, scale, cfg)


# ---------------------------------------------------------------------------------------
# Autograd
# ---------------------------------------------------------------------------------------


class _FlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, scale, config, deterministic, variant=None):
        o, lse2 = _forward(q, k, v, causal, scale, config, variant)
        ctx.save_for_backward(q, k, v, o, lse2)
        ctx.causal, ctx.scale, ctx.config = causal, scale, config
        ctx.deterministic, ctx.variant = deterministic, variant
        ctx.mark_non_differentiable(lse2)
        # lse2 never has a gradient: without this autograd would allocate and fill a zero
        # tensor for it on every backward call (a launch inside the timed backward)
        ctx.set_materialize_grads(False)
        return o, lse2

    @staticmethod
    def backward(ctx, do, _dlse2):
        if do is None:  # nothing reached o (materialize_grads is off)
            return None, None, None, None, None, None, None, None
        q, k, v, o, lse2 = ctx.saved_tensors
        dq, dk, dv = _backward(
            do, q, k, v, o, lse2, ctx.causal, ctx.scale, ctx.config, ctx.deterministic,
            ctx.variant,
        )  # fmt: skip
        return dq, dk, dv, None, None, None, None, None


# ---------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------


def flash_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    scale: float | None = None,
    window: tuple[int, int] = (-1, -1),
    alibi_slopes: torch.Tensor | None = None,
    softcap: float = 0.0,
    return_lse: bool = False,
    config: FlashConfig | None = None,
    deterministic: bool | None = None,
):
    """softmax(q kᵀ · scale [+ bottom-right causal mask]) v, differentiable in q, k, v.

    q: (batch, heads_q, seqlen_q, head_dim); k, v: (batch, heads_kv, seqlen_k, head_dim),
    heads_q a multiple of heads_kv (GQA: q head h reads kv head h // (heads_q // heads_kv)).
    Any strides whose last one is 1 (a (B, S, H, D) tensor's `.transpose(1, 2)` needs no
    copy). fp16, bf16 or fp32; head_dim a multiple of 8 up to 256. `scale` defaults to
    1/sqrt(head_dim). Causal with seqlen_q > seqlen_k leaves the first rows without any
    key: their output is 0, their lse -inf, their gradients 0.

    The variants (flash-attn's semantics, applied in this order, o = seqlen_k - seqlen_q):
    `softcap` c > 0 turns s = scale · q·k into c · tanh(s / c); `alibi_slopes` (fp32,
    (heads_q,) or (batch, heads_q), on q's device) subtract m_h · |i + o - j|; `window`
    (left, right), -1 unbounded, lets query i see keys i + o - left <= j <= i + o + right
    (causal is right = 0 and composes with a left window). Blocks outside a window are
    never loaded. Rows that see no key output 0, lse -inf, zero gradients.

    With `return_lse=True` also returns the natural-log log-sum-exp of each row's scaled
    scores, (batch, heads_q, seqlen_q) fp32, not differentiable. `config` overrides the
    tile heuristic (`fa_bench.kernels.flash_config.default_config`); no tuning cache is
    read here. On sm_90 the forward of a call without variants runs the warp-specialised
    Gluon kernel where it measured faster (fp16/bf16, head_dim 128 from 1k keys, 64 from
    4k); `config.forward` = "tl" or "gluon" forces one (kernels/flash_dispatch.py).

    `deterministic` picks the backward. None (the default): on sm_90 the warp-specialised
    Gluon one-pass backward where it runs (fp16/bf16, head_dim 64 and 128, no variant;
    on the H200 1.24-1.36x the two-kernel backward and about cuDNN's speed, docs/
    results-h200.md), the two-kernel backward elsewhere. Its dQ sums the key blocks'
    shares with fp32 adds in whatever order they land: the last bits can differ from run
    to run (dK and dV cannot). `deterministic=True` always runs the two-kernel backward
    (a separate dQ kernel, no atomics): bitwise identical gradients on repeated calls.
    `deterministic=False` always runs a one-pass backward (`config.backward` says which
    kernel, the `tl` one by default); it has no variants: their backward raises
    ValueError there (their forward runs).
    """
    _validate(q, k, v, scale)
    variant = make_variant(
        q, causal=bool(causal), window=window, alibi_slopes=alibi_slopes, softcap=softcap,
        batch=q.shape[0], seq_q=q.shape[2], seq_k=k.shape[2],
    )  # fmt: skip
    return _run(q, k, v, causal, scale, config, deterministic, variant, return_lse)


def _run(q, k, v, causal, scale, config, deterministic, variant, return_lse: bool):
    """The checked call: config, autograd, and the public lse (natural log, -inf for rows
    without keys); flash_attention_varlen calls it with (1, H, T, D) views."""
    q, k, v = _last_dim_unit(q), _last_dim_unit(k), _last_dim_unit(v)
    causal = bool(causal)
    scale = float(scale) if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    cfg = _resolve_config(config, q, k.shape[2], causal, variant)
    if deterministic is not None:
        deterministic = bool(deterministic)
    o, lse2 = _FlashAttention.apply(q, k, v, causal, scale, cfg, deterministic, variant)
    if not return_lse:
        return o
    # internal +inf marks rows without keys; the public lse is log(0) = -inf there
    lse = torch.where(torch.isinf(lse2), float("-inf"), lse2 * _LN2)
    return o, lse
