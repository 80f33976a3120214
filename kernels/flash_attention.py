"""FlashAttention-2 forward and backward in Triton, with GQA, bottom-right causal masking,
arbitrary sequence lengths, head dims that are multiples of 8 up to 256, and any strides
whose last one is 1.

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
  - one-pass (opt-in, `deterministic=False`; flash_kernels_bwd1.py): the same
    program also computes its share of dQ (dS K) and adds it into a zeroed fp32
    workspace (B, Hq, Sq, D) with atomic adds (or a TMA reduce-add with
    `FlashConfig(use_tma=True)` on sm_90+); a small kernel writes dQ = scale ·
    workspace in the input dtype. Five matmuls per (key block, query block) pair; dQ's
    last bits depend on the order of the adds. Slower than the two-kernel backward in
    every shape measured on the H200 (2026-11-30, docs/kernel.md), so not the default;
  - two-kernel (the default, `deterministic=True`; flash_kernels_bwd.py): dQ is a
    separate kernel that recomputes S and dP (seven matmuls per pair); no atomics
    anywhere, so repeated calls give bitwise identical gradients.
"""

from __future__ import annotations

import functools
import math
import os
from types import SimpleNamespace

import torch

from fa_bench.kernels.flash_config import (
    HEAD_DIM_MULTIPLE,
    MAX_HEAD_DIM,
    FlashConfig,
    heuristic_config,
    pad_pow2,
)

_LOG2E = 1.4426950408889634
_LN2 = 0.6931471805599453
_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# Rows per program of the backward's preprocessing (delta = rowsum(dO·O)): a cheap
# elementwise pass whose tile is not part of FlashConfig.
_PREPROCESS_ROWS = 64
# TMA (device-side tensor descriptors) needs sm_90+ and 16-byte aligned bases and strides.
_TMA_MIN_MAJOR = 9
_TMA_ALIGN_BYTES = 16


# ---------------------------------------------------------------------------------------
# Launchers
# ---------------------------------------------------------------------------------------


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


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


def _shapes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> str:
    return f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"


def _validate(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None) -> None:
    """Raise TypeError/ValueError (with the shapes) for inputs the kernels cannot take."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    shapes = _shapes(q, k, v)
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"q, k, v must be 4-D (batch, heads, seqlen, head_dim); got {shapes}")
    if q.dtype not in _DTYPES:
        raise TypeError(f"unsupported dtype {q.dtype} (fp16, bf16, fp32); {shapes}")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"q, k, v must share a dtype, got {q.dtype}/{k.dtype}/{v.dtype}")
    batch, heads_q, seq_q, head_dim = q.shape
    _, heads_kv, seq_k, _ = k.shape
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape; got {shapes}")
    if k.shape[0] != batch or k.shape[3] != head_dim:
        raise ValueError(f"q and k/v must agree on batch and head_dim; got {shapes}")
    if min(batch, heads_q, seq_q, heads_kv, seq_k, head_dim) < 1:
        raise ValueError(f"every dimension must be >= 1; got {shapes}")
    if heads_q % heads_kv:
        raise ValueError(
            f"heads_q ({heads_q}) must be a multiple of heads_kv ({heads_kv}); {shapes}"
        )
    if head_dim % HEAD_DIM_MULTIPLE or head_dim > MAX_HEAD_DIM:
        raise ValueError(
            f"head_dim must be a multiple of {HEAD_DIM_MULTIPLE} and <= {MAX_HEAD_DIM}, "
            f"got {head_dim}; {shapes}"
        )
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}/{k.device}/{v.device}")
    if q.device.type == "cpu" and not _interpreting():
        raise ValueError(
            f"CPU tensors need the Triton interpreter (TRITON_INTERPRET=1 before import); {shapes}"
        )
    if q.device.type not in ("cpu", "cuda"):
        raise ValueError(f"unsupported device {q.device}; {shapes}")
    if scale is not None and not (isinstance(scale, (int, float)) and scale > 0):
        raise ValueError(f"scale must be a positive number, got {scale!r}")


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
    config: FlashConfig | None, q: torch.Tensor, seqlen_k: int, causal: bool
) -> FlashConfig:
    if config is not None:
        if not isinstance(config, FlashConfig):
            raise TypeError(f"config must be a FlashConfig, got {type(config).__name__}")
        return config
    # The library's own heuristic only: a tuning cache is the application's choice, made
    # by the caller (the `triton` registry adapter passes its config explicitly).
    seqlen = max(q.shape[2], seqlen_k)
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


def _forward(q, k, v, causal: bool, scale: float, cfg: FlashConfig):
    batch, heads_q, seq_q, head_dim = q.shape
    heads_kv, seq_k = k.shape[1], k.shape[2]
    o = torch.empty_like(q)  # keeps q's layout: a (B, S, H, D) view in gives one out
    lse2 = torch.empty((batch, heads_q, seq_q), device=q.device, dtype=torch.float32)
    use_tma = cfg.use_tma and _tma_ok(q, k, v, o)
    if use_tma:
        _ensure_tma_allocator()
    grid = (_cdiv(seq_q, cfg.block_m), batch * heads_q)
    _kernels().fwd[grid](
        q, k, v, o, lse2,
        *_strides(q), *_strides(k), *_strides(v), *_strides(o),
        heads_q, heads_q // heads_kv, seq_q, seq_k, scale * _LOG2E,
        HEAD_DIM=head_dim, HEAD_DIM_PAD=pad_pow2(head_dim),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        CAUSAL=causal, EVEN_Q=seq_q % cfg.block_m == 0,
        USE_TMA=use_tma, WARP_SPECIALIZE=use_tma and cfg.warp_specialize,
        DOT_PREC=_dot_precision(q.dtype),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
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


def _backward_deterministic(do, q, k, v, o, lse2, causal: bool, scale: float, cfg: FlashConfig):
    """The two-kernel backward: dK/dV, then dQ recomputing S and dP (seven matmuls per
    tile pair, no atomics, bitwise reproducible)."""
    batch, heads_q, seq_q, head_dim = q.shape
    heads_kv, seq_k = k.shape[1], k.shape[2]
    group = heads_q // heads_kv
    pad = pad_pow2(head_dim)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    delta = _preprocess(do, o, lse2)
    # dK/dV holds `held` keys and streams query rows; dQ holds `held` query rows and
    # streams keys (see kernels/flash_config.py).
    held, streamed = cfg.bwd_block_n, cfg.bwd_block_m
    prec = _dot_precision(q.dtype)
    _kernels().dkdv[(_cdiv(seq_k, held), batch * heads_kv)](
        q, k, v, do, dk, dv, lse2, delta,
        *_strides(q), *_strides(k), *_strides(v), *_strides(do), *_strides(dk), *_strides(dv),
        heads_q, heads_kv, group, seq_q, seq_k, scale * _LOG2E, scale,
        HEAD_DIM=head_dim, HEAD_DIM_PAD=pad, BLOCK_HELD=held, BLOCK_STREAMED=streamed,
        CAUSAL=causal, EVEN_Q=seq_q % streamed == 0, EVEN_K=seq_k % held == 0, DOT_PREC=prec,
        num_warps=cfg.bwd_num_warps, num_stages=cfg.bwd_num_stages,
    )  # fmt: skip
    _kernels().dq[(_cdiv(seq_q, held), batch * heads_q)](
        q, k, v, do, dq, lse2, delta,
        *_strides(q), *_strides(k), *_strides(v), *_strides(do), *_strides(dq),
        heads_q, group, seq_q, seq_k, scale * _LOG2E, scale,
        HEAD_DIM=head_dim, HEAD_DIM_PAD=pad, BLOCK_HELD=held, BLOCK_STREAMED=streamed,
        CAUSAL=causal, EVEN_Q=seq_q % held == 0, DOT_PREC=prec,
        num_warps=cfg.bwd_num_warps, num_stages=cfg.bwd_num_stages,
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
    do, q, k, v, o, lse2, causal: bool, scale: float, cfg: FlashConfig, deterministic: bool
):
    do = _last_dim_unit(do)
    run = _backward_deterministic if deterministic else _backward_one_pass
    return run(do, q, k, v, o, lse2, causal, scale, cfg)


# ---------------------------------------------------------------------------------------
# Autograd
# ---------------------------------------------------------------------------------------


class _FlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, scale, config, deterministic):
        o, lse2 = _forward(q, k, v, causal, scale, config)
        ctx.save_for_backward(q, k, v, o, lse2)
        ctx.causal, ctx.scale, ctx.config = causal, scale, config
        ctx.deterministic = deterministic
        ctx.mark_non_differentiable(lse2)
        return o, lse2

    @staticmethod
    def backward(ctx, do, _dlse2):
        q, k, v, o, lse2 = ctx.saved_tensors
        dq, dk, dv = _backward(
            do, q, k, v, o, lse2, ctx.causal, ctx.scale, ctx.config, ctx.deterministic
        )
        return dq, dk, dv, None, None, None, None


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
    return_lse: bool = False,
    config: FlashConfig | None = None,
    deterministic: bool = True,
):
    """softmax(q kᵀ · scale [+ bottom-right causal mask]) v, differentiable in q, k, v.

    q: (batch, heads_q, seqlen_q, head_dim); k, v: (batch, heads_kv, seqlen_k, head_dim),
    heads_q a multiple of heads_kv (GQA: q head h reads kv head h // (heads_q // heads_kv)).
    Any strides whose last one is 1 (a (B, S, H, D) tensor's `.transpose(1, 2)` needs no
    copy). fp16, bf16 or fp32; head_dim a multiple of 8 up to 256. `scale` defaults to
    1/sqrt(head_dim). Causal with seqlen_q > seqlen_k leaves the first rows without any
    key: their output is 0, their lse -inf, their gradients 0.

    With `return_lse=True` also returns the natural-log log-sum-exp of each row's scaled
    scores, (batch, heads_q, seqlen_q) fp32, not differentiable. `config` overrides the
    tile heuristic (`fa_bench.kernels.flash_config.default_config`); no tuning cache is
    read here.

    `deterministic=True` (the default) runs the two-kernel backward (a separate dQ kernel,
    no atomics): bitwise identical gradients on repeated calls. `deterministic=False` runs
    the experimental one-pass backward: two fewer matmuls per tile pair, but dQ sums the
    key blocks' shares with fp32 atomic adds, so it can differ in the last bits from run
    to run, and on the H200 it measured slower in every shape (docs/kernel.md).
    """
    _validate(q, k, v, scale)
    q, k, v = _last_dim_unit(q), _last_dim_unit(k), _last_dim_unit(v)
    causal = bool(causal)
    scale = float(scale) if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    cfg = _resolve_config(config, q, k.shape[2], causal)
    o, lse2 = _FlashAttention.apply(q, k, v, causal, scale, cfg, bool(deterministic))
    if not return_lse:
        return o
    # internal +inf marks rows without keys; the public lse is log(0) = -inf there
    lse = torch.where(torch.isinf(lse2), float("-inf"), lse2 * _LN2)
    return o, lse
