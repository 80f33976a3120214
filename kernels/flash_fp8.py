"""The FP8 (e4m3) forward of our FlashAttention: `flash_attention_fp8`, its validation and
launcher, and the per-tensor quantisation helpers that make its inputs.

softmax(q kᵀ · scale [+ bottom-right causal mask]) v with q, k, v in float8_e4m3fn and
per-tensor descale factors: the attention of the dequantised inputs q8 · q_descale,
k8 · k_descale, v8 · v_descale, computed with fp8 tensor-core matmuls (fp32 accumulation,
P quantised to e4m3 for PV; kernels/flash_kernels_fp8.py says how P is scaled into
e4m3's range) and returned in bf16. Forward only: Hopper (sm_90) is what it is built and
measured for; sm_89 (Ada) has fp8 tensor cores too and is accepted.

Layout: the SDPA layout (batch, heads, seqlen, head_dim) for all three, GQA as in
`flash_attention`. V is read K-major (each head stored (head_dim, seqlen), i.e.
`v.stride(-2) == 1`): Hopper's fp8 wgmma takes its B operand only that way. `fp8_v_layout`
makes that layout (a (B, H, S, D) view of (B, H, D, S) storage); a V in the ordinary
layout is copied into it on every call, so a caller that times the kernel prepares V once
(the benchmark does, outside the timed span).

Descales: fp32 tensors of one element (per-tensor scaling) on q's device, read by the
kernel from device memory (no host sync). Per-head descales (FlashAttention-3's
(batch, heads_kv) form) are not taken.

Two kernels: the `tl` one (kernels/flash_kernels_fp8.py, any GPU from sm_89 and the
interpreter) and, on sm_90 with triton 3.6's Gluon, the warp-specialised Gluon one
(kernels/flash_gluon_fp8.py); `fp8_kernel_choice` says which a call runs.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import replace

import torch

from fa_bench.kernels import flash_gluon_fp8
from fa_bench.kernels.flash_config import (
    HEAD_DIM_MULTIPLE,
    MAX_HEAD_DIM,
    FlashConfig,
    heuristic_config,
    pad_pow2,
)

_LOG2E = 1.4426950408889634
_LN2 = 0.6931471805599453
FP8_DTYPE = torch.float8_e4m3fn
# e4m3fn's largest finite value: per-tensor scale = amax / E4M3_MAX.
E4M3_MAX = 448.0
# fp8 tensor cores: Ada (sm_89) and Hopper (sm_90) onwards.
_MIN_CAPABILITY = (8, 9)


@functools.cache
def _kernel():
    """The `@triton.jit` kernel, imported (with triton) at the first launch, as the dense
    kernels are (TRITON_INTERPRET is read when triton is first imported)."""
    from fa_bench.kernels import flash_kernels_fp8

    return flash_kernels_fp8._fwd_fp8_kernel


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def _shapes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> str:
    return f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"


def _strides(t: torch.Tensor) -> tuple[int, int, int]:
    return t.stride(0), t.stride(1), t.stride(2)


def _last_dim_unit(t: torch.Tensor) -> torch.Tensor:
    """q and k: any strides whose last one is 1; otherwise copy."""
    return t if t.stride(-1) == 1 else t.contiguous()


def quantize_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-tensor e4m3 quantisation: (x8, descale) with descale = amax(|x|) / 448 (fp32,
    one element, on x's device) and x8 = x / descale rounded to float8_e4m3fn, so that
    x8 · descale approximates x and the largest |x| maps to 448. An all-zero x gets
    descale 1."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point() or x.dtype == FP8_DTYPE:
        raise TypeError(f"x must be a 16- or 32-bit float tensor, got {x.dtype}")
    amax = x.detach().abs().amax().float()
    if not torch.isfinite(amax):
        raise ValueError("x holds NaN or Inf: it has no e4m3 scale")
    descale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax)).reshape(1)
    x8 = (x.float() / descale).clamp(-E4M3_MAX, E4M3_MAX).to(FP8_DTYPE)
    return x8, descale


def dequantize_fp8(x8: torch.Tensor, descale: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    """x8 · descale in `dtype` (the product taken in fp32, then rounded to `dtype`)."""
    return (x8.float() * descale.float()).to(dtype)


def fp8_v_layout(v: torch.Tensor) -> torch.Tensor:
    """`v` (B, H, S, D) as the kernel reads it: the same values and shape, stored K-major
    ((B, H, D, S) in memory, so `stride(-2) == 1`). A copy unless v already is."""
    if v.dim() == 4 and v.stride(-2) == 1:
        return v
    return v.transpose(-1, -2).contiguous().transpose(-1, -2)


def _validate_fp8(q, k, v, descales: dict, scale: float | None) -> None:
    """TypeError/ValueError naming the argument and its value."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype != FP8_DTYPE:
            raise TypeError(f"{name} must be torch.float8_e4m3fn, got {t.dtype}")
        if t.requires_grad:
            raise ValueError(f"{name} requires grad: flash_attention_fp8 is forward only")
    shapes = _shapes(q, k, v)
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"q, k, v must be 4-D (batch, heads, seqlen, head_dim); got {shapes}")
    batch, heads_q, seq_q, head_dim = q.shape
    heads_kv, seq_k = k.shape[1], k.shape[2]
    if k.shape != v.shape or k.shape[0] != batch or k.shape[3] != head_dim:
        raise ValueError(f"k and v must have one shape, q's batch and head_dim; got {shapes}")
    if min(batch, heads_q, seq_q, heads_kv, seq_k, head_dim) < 1:
        raise ValueError(f"every dimension must be >= 1; got {shapes}")
    if heads_q % heads_kv:
        raise ValueError(f"heads_q ({heads_q}) must be a multiple of heads_kv ({heads_kv})")
    if head_dim % HEAD_DIM_MULTIPLE or head_dim > MAX_HEAD_DIM or pad_pow2(head_dim) < 32:
        # fp8 tl.dot needs a reduction of at least 32 (head_dim is QKᵀ's)
        raise ValueError(
            f"head_dim must be a multiple of {HEAD_DIM_MULTIPLE} and <= {MAX_HEAD_DIM} "
            f"(padded to >= 32), got {head_dim}; {shapes}"
        )
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}/{k.device}/{v.device}")
    _validate_device(q.device, shapes)
    for name, d in descales.items():
        if not isinstance(d, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(d).__name__}")
        if d.dtype != torch.float32 or d.numel() != 1:
            raise ValueError(
                f"{name} must be an fp32 tensor of one element (per-tensor scaling), "
                f"got {d.dtype} of shape {tuple(d.shape)}"
            )
        if d.device != q.device:
            raise ValueError(f"{name} must be on q's device {q.device}, got {d.device}")
    if scale is not None and not (
        isinstance(scale, (int, float)) and not isinstance(scale, bool) and scale > 0
    ):
        raise ValueError(f"scale must be a positive number, got {scale!r}")


def _validate_device(device: torch.device, shapes: str) -> None:
    if device.type == "cpu":
        if not _interpreting():
            raise ValueError(
                f"CPU tensors need the Triton interpreter (TRITON_INTERPRET=1); {shapes}"
            )
        return
    if device.type != "cuda":
        raise ValueError(f"q is on {device}: flash_attention_fp8 runs on CUDA GPUs; {shapes}")
    capability = torch.cuda.get_device_capability(device)
    if capability < _MIN_CAPABILITY:
        raise ValueError(
            f"q is on a GPU of compute capability {capability[0]}.{capability[1]}: fp8 "
            f"tensor cores need sm_89 or newer"
        )


def _tma_alloc(size: int, alignment: int, stream: int | None) -> torch.Tensor:
    """triton's allocator protocol (descriptor scratch); torch aligns beyond `alignment`."""
    return torch.empty(size, dtype=torch.int8, device="cuda")


def _ensure_tma_allocator() -> None:
    """Device-side descriptors need global scratch from `triton.set_allocator`, which
    triton keeps per thread/context (a ContextVar): set it where this context has none
    (the 16-bit forward does the same, kernels/flash_attention.py)."""
    import triton

    try:
        from triton.runtime import _allocation

        unset = isinstance(_allocation._allocator.get(), _allocation.NullAllocator)
    except (ImportError, AttributeError):  # triton moved its internals: set it every time
        unset = True
    if unset:
        triton.set_allocator(_tma_alloc)


def _tma_ok(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor) -> bool:
    """Descriptors need sm_90+, 16-byte aligned bases and 16-byte multiples for every
    stride the kernel gives them, a unit last stride, and V K-major (its descriptor spans
    a head's (D, S) storage, row stride v.stride(3))."""
    if _interpreting() or q.device.type != "cuda":
        return False
    if torch.cuda.get_device_capability(q.device)[0] < 9:
        return False
    used = ((q, (0, 1, 2), 3), (k, (0, 1, 2), 3), (v, (0, 1, 3), 2), (o, (0, 1, 2), 3))
    for t, dims, unit in used:
        size = t.element_size()
        if t.stride(unit) != 1 or t.data_ptr() % 16:
            return False
        if any((t.stride(d) * size) % 16 for d in dims):
            return False
    return True


def _forward_fp8(q, k, v, descales: dict, causal: bool, scale: float, cfg: FlashConfig):
    batch, heads_q, seq_q, head_dim = q.shape
    heads_kv, seq_k = k.shape[1], k.shape[2]
    o = torch.empty(q.shape, device=q.device, dtype=torch.bfloat16)
    lse2 = torch.empty((batch, heads_q, seq_q), device=q.device, dtype=torch.float32)
    use_tma = cfg.use_tma and _tma_ok(q, k, v, o)
    if use_tma:
        _ensure_tma_allocator()
    grid = ((seq_q + cfg.block_m - 1) // cfg.block_m, batch * heads_q)
    _kernel()[grid](
        q, k, v, o, lse2, descales["q_descale"], descales["k_descale"], descales["v_descale"],
        *_strides(q), *_strides(k), *_strides(v), v.stride(3), *_strides(o),
        heads_q, heads_q // heads_kv, seq_q, seq_k, scale * _LOG2E,
        HEAD_DIM=head_dim, HEAD_DIM_PAD=pad_pow2(head_dim),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        CAUSAL=causal, EVEN_Q=seq_q % cfg.block_m == 0, USE_TMA=use_tma,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    return o, lse2


# Measured on the H200 (2026-11-30, tools/gpu/fp8_bench.py, 16k tokens, hidden 2048):
# at head_dim 128 the fp8 kernel ran 128 × 64 tiles with 4 warps 3.8-8.4% faster than the
# bf16 heuristic's 128 × 128 with 8 warps at 4k and 16k non-causal and 4k causal, the same
# at 16k causal (716 vs 721 TFLOP/s).
_FP8_D128_TILES = (64, 4, 3)  # block_n, num_warps, num_stages (block_m stays 128)


def default_fp8_config(q: torch.Tensor, seqlen_k: int, causal: bool) -> FlashConfig:
    """The fp8 forward's launch: the bf16 forward's heuristic for this shape (fp8 tiles
    take half its shared memory), with 128 × 64 tiles and 4 warps where the heuristic
    gives head_dim 128 its 128 × 128 tiles with 8 warps."""
    seqlen = max(q.shape[2], seqlen_k)
    cfg = heuristic_config(q.shape[-1], torch.bfloat16, causal, q.device, seqlen)
    if pad_pow2(q.shape[-1]) == 128 and (cfg.block_m, cfg.block_n, cfg.num_warps) == (128, 128, 8):
        block_n, warps, stages = _FP8_D128_TILES
        cfg = replace(cfg, block_n=block_n, num_warps=warps, num_stages=stages)
    return cfg


def fp8_kernel_choice(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, config: FlashConfig | None
) -> flash_gluon_fp8.Fp8GluonConfig | None:
    """The Gluon fp8 launch `flash_attention_fp8(q, k, v, causal=causal, config=config)`
    runs, or None where it runs the `tl` fp8 kernel (a pure function of the inputs'
    shapes, strides, device and the config: the benchmark names the kernel before timing
    it). q, k, v as the call gets them (v K-major: `fp8_v_layout`)."""
    q, k, v = _last_dim_unit(q), _last_dim_unit(k), fp8_v_layout(v)
    cfg = config if config is not None else default_fp8_config(q, k.shape[2], bool(causal))
    return flash_gluon_fp8.fp8_gluon_choice(q, k, v, bool(causal), cfg)


def flash_attention_fp8(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    q_descale: torch.Tensor,
    k_descale: torch.Tensor,
    v_descale: torch.Tensor,
    causal: bool = False,
    scale: float | None = None,
    config: FlashConfig | None = None,
    return_lse: bool = False,
):
    """softmax((q8·q_descale)(k8·k_descale)ᵀ · scale [+ causal mask]) (v8·v_descale), in bf16.

    q: (batch, heads_q, seqlen_q, head_dim), k, v: (batch, heads_kv, seqlen_k, head_dim),
    all torch.float8_e4m3fn; heads_q a multiple of heads_kv (GQA); any lengths; causal is
    bottom-right (as `flash_attention`). q and k need a last stride of 1; v is best given
    K-major (`fp8_v_layout`), else it is copied into that layout here. The descales are fp32
    tensors of one element on q's device (`quantize_fp8` makes them). head_dim a multiple
    of 8 up to 256 (at least 32 after padding to a power of two). `scale` defaults to
    1/sqrt(head_dim). Rows that see no key give 0 (lse -inf).

    Which kernel runs (`fp8_kernel_choice`): on sm_90 with triton 3.6's Gluon, the
    warp-specialised Gluon fp8 kernel (kernels/flash_gluon_fp8.py) where
    `fp8_gluon_preferred` (head_dim 64/128, TMA-aligned strides, V's K-major rows
    16-byte aligned), else the `tl` fp8 kernel; `config.forward` "tl" or "gluon" forces
    one ("gluon" raises ValueError with the reason where it cannot run; it copies a V
    whose rows are not aligned), and its gluon_block_n / gluon_stages / gluon_pingpong
    fields name the Gluon launch. The `tl` kernel's launch: `config`'s forward fields
    block_m, block_n, num_warps, num_stages, use_tma (`default_fp8_config`: pointer
    loads; `use_tma=True` takes device-side descriptors on sm_90+ where the strides
    allow). `warp_specialize` is refused: triton 3.6's gave wrong outputs in the `tl`
    kernel on the H200.
    Forward only: an input that requires grad raises ValueError. `return_lse=True` also returns the
    natural-log log-sum-exp of each row's scaled scores, (batch, heads_q, seqlen_q) fp32.
    """
    descales = {"q_descale": q_descale, "k_descale": k_descale, "v_descale": v_descale}
    _validate_fp8(q, k, v, descales, scale)
    q, k, v = _last_dim_unit(q), _last_dim_unit(k), fp8_v_layout(v)
    causal = bool(causal)
    scale = float(scale) if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    if config is None:
        cfg = default_fp8_config(q, k.shape[2], causal)
    elif isinstance(config, FlashConfig):
        cfg = config
    else:
        raise TypeError(f"config must be a FlashConfig, got {type(config).__name__}")
    if cfg.warp_specialize:
        raise ValueError(
            "config.warp_specialize=True: the fp8 kernel has no warp-specialised path "
            "(triton 3.6's gave wrong outputs on the H200, 2026-11-30)"
        )
    gluon = flash_gluon_fp8.fp8_gluon_choice(q, k, v, causal, cfg)
    if gluon is not None:
        o, lse2 = flash_gluon_fp8.fp8_gluon_forward(
            q, k, v, descales, causal, scale, gluon, checked=True
        )
    else:
        o, lse2 = _forward_fp8(q, k, v, descales, causal, scale, cfg)
    if not return_lse:
        return o
    lse = torch.where(torch.isinf(lse2), float("-inf"), lse2 * _LN2)
    return o, lse
