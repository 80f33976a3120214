"""Launch configuration of the Triton FlashAttention kernels, and the default heuristic.

A `FlashConfig` fixes the tile sizes, warps and pipeline depth of the three kernels.
Each kernel program *holds* one tile in registers for its whole life and *streams* the
tiles of the other operand through a loop:

- forward: a program holds `block_m` query rows and streams `block_n` keys per step;
- backward: the one-pass kernel (opt-in) and the deterministic dK/dV kernel hold
  `bwd_block_n` keys and stream `bwd_block_m` query rows per step; the deterministic dQ
  kernel holds `bwd_block_n` query rows and streams `bwd_block_m` keys per step. So in
  the backward `bwd_block_n` is the held tile (BLOCK_HELD in the kernels) and
  `bwd_block_m` the streamed one (BLOCK_STREAMED) of every kernel: the triton
  fused-attention tutorial's BLOCK_M1 = BLOCK_N2 small, BLOCK_N1 = BLOCK_M2 large. All
  backward kernels share `bwd_num_warps/bwd_num_stages`; the one-pass kernel's dQ goes
  through a descriptor's reduce-add when `use_tma` (below) is set and TMA is available.

The field names are the keys of tuning caches and sweep.json files, so they stay as
they are.

`default_config` is a fixed table, not an autotuner: nothing is timed at run time. It
never reads a tuning cache: that is the application's business (fa_bench.sweep.tuning,
consulted by the `triton` registry adapter in kernels/triton_impl.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fa_bench.kernels import gluon_fields

if TYPE_CHECKING:
    import torch

_WARPS = (1, 2, 4, 8, 16)
# Tile bounds: `tl.dot` takes no operand dimension under 16; 256 is the largest tile a
# config may ask for (as large as the largest head_dim).
MIN_TILE = 16
MAX_TILE = 256
# What the kernels take: head_dim a multiple of 8 (16-byte rows in fp16/bf16) up to 256.
HEAD_DIM_MULTIPLE = 8
MAX_HEAD_DIM = 256
# FlashConfig.forward's values (kernels/flash_dispatch.py)
FORWARD_KERNELS = ("auto", "tl", "gluon")
# FlashConfig.backward's values: the kernel of the one-pass backward (deterministic=False)
BACKWARD_KERNELS = ("tl", "gluon", "auto")


def _is_pow2(x: int) -> bool:
    return x > 0 and (x & (x - 1)) == 0


def pad_pow2(n: int) -> int:
    """`n` rounded up to a power of two, at least 16: how the kernels pad head_dim (a
    register tile) and the smallest tile `tl.dot` takes."""
    return max(MIN_TILE, 1 << (n - 1).bit_length())


@dataclass(frozen=True)
class FlashConfig:
    block_m: int = 128
    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 3
    bwd_block_m: int = 64
    bwd_block_n: int = 128
    bwd_num_warps: int = 8
    bwd_num_stages: int = 2
    # Load Q/K/V and store O of the forward through device-side tensor descriptors (TMA),
    # and add the one-pass backward's dQ shares with a descriptor's reduce-add instead of
    # pointer atomics. Taken only where the GPU has TMA (sm_90+) and the tensors meet its
    # 16-byte alignment; otherwise the pointer path runs (same results).
    use_tma: bool = False
    # Forward only: `tl.range(..., warp_specialize=True)` on the KV loop (TMA path only).
    warp_specialize: bool = False
    # Which forward kernel runs (kernels/flash_dispatch.py): "auto" the Gluon kernel on
    # sm_90 where it measured faster, else `tl`; "gluon" or "tl" force one.
    forward: str = "auto"
    # The Gluon launch where the Gluon forward runs (kernels/gluon_fields.py): 0, "" and
    # None mean the heuristic's value (flash_gluon.gluon_config), so the defaults leave it
    # exactly as it was; plain fields so a sweep and the tuning cache can carry them.
    gluon_variant: str = ""
    gluon_block_n: int = 0
    gluon_stages: int = 0
    gluon_warps: int = 0
    gluon_pingpong: bool | None = None
    gluon_persistent: bool | None = None
    gluon_consumers: int = 0
    gluon_q_buffers: int = 0
    # Which kernel runs the one-pass backward (`deterministic=False`; issue 18): "tl" the
    # `tl` kernel (flash_kernels_bwd1.py), "gluon" the warp-specialised Gluon kernel for
    # sm_90 (kernels/flash_gluon_bwd.py; a ValueError says why it cannot run a call),
    # "auto" the Gluon kernel where it can run, else `tl`. deterministic=True always runs
    # the two-kernel backward; the default (None) the Gluon kernel where it can run
    # ("gluon": a ValueError where it cannot), else the two-kernel backward.
    backward: str = "tl"

    def __post_init__(self) -> None:
        if self.forward not in FORWARD_KERNELS:
            raise ValueError(
                f"forward must be one of {', '.join(FORWARD_KERNELS)}, got {self.forward!r}"
            )
        if self.backward not in BACKWARD_KERNELS:
            raise ValueError(
                f"backward must be one of {', '.join(BACKWARD_KERNELS)}, got {self.backward!r}"
            )
        gluon_fields.check(self.__dict__)
        for name in ("block_m", "block_n", "bwd_block_m", "bwd_block_n"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not _is_pow2(value):
                raise ValueError(f"{name} must be a power of two, got {value!r}")
            if not MIN_TILE <= value <= MAX_TILE:
                raise ValueError(
                    f"{name} must be in [{MIN_TILE}, {MAX_TILE}] (tl.dot needs >= {MIN_TILE}), "
                    f"got {value}"
                )
        for name in ("num_warps", "bwd_num_warps"):
            value = getattr(self, name)
            if value not in _WARPS:
                raise ValueError(f"{name} must be one of {_WARPS}, got {value!r}")
        for name in ("num_stages", "bwd_num_stages"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 8:
                raise ValueError(f"{name} must be an integer in [1, 8], got {value!r}")
        for name in ("use_tma", "warp_specialize"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")
        if self.warp_specialize and not self.use_tma:
            raise ValueError("warp_specialize needs use_tma=True")


# The CPU interpreter runs one program after another in numpy: large tiles mean fewer
# programs and a faster run; pipelining means nothing there.
_INTERPRETER = FlashConfig(
    block_m=64, block_n=64, num_warps=4, num_stages=1, bwd_block_m=64, bwd_block_n=64
)


# Up to this many tokens a causal forward runs 64 × 64 tiles (see default_config).
_SHORT_CAUSAL_SEQLEN = 1024


def default_config(
    head_dim: int,
    dtype: torch.dtype,
    causal: bool,
    device_capability: tuple[int, int] | None,
    seqlen: int | None = None,
) -> FlashConfig:
    """The launch configuration for one (head_dim, dtype, causal, GPU, seqlen) point.

    `head_dim` is the padded (power-of-two) head dimension, `dtype` a torch dtype,
    `device_capability` `torch.cuda.get_device_capability()` or None for the CPU
    interpreter, `seqlen` the longer of the query and key lengths (None: long). One config
    serves every mode: it carries both the forward and the backward fields.

    Why these numbers (Hopper, measured on the H200: see docs/kernel.md):
    - forward, head_dim 128: 128 query rows × 128 keys, 8 warps, 3 stages: two warpgroups
      on wgmma, the 128×128 fp32 accumulator at 64 registers per thread; 4 stages do not
      fit shared memory (296 KB), 2 stages lose 5-14%, 64-key tiles 1-5%;
    - forward, head_dim <= 64: 128 × 64 tiles with 4 warps and 3 stages; 128-key tiles
      with 8 warps lost 15-20%;
    - TMA (device-side descriptors) is opt-in (`use_tma=True`): the pointer path was as
      fast or faster in every measured cell, warp specialization added nothing;
    - causal forward up to 1k tokens (fp16/bf16, head_dim <= 128): 64 × 64 tiles, 4 warps,
      3 stages: half the diagonal tile's masked work and twice the programs; 4-21% faster
      at 512 and 1k in all 8 swept cases, a wash at 2k, 1.5-2.5% slower at 4k
      (2026-11-29 sweeps, docs/sweep.md);
    - forward, head_dim 256: 64 × 64 tiles, 4 warps and 2 stages: Q (32 KB) plus two
      K/V stages (2 × 64 KB) fit the 227 KB of shared memory;
    - backward: the tiles below were measured on the deterministic backward (dK/dV and
      dQ kernels) and are the one-pass kernel's starting point until it is swept;
    - backward, head_dim 128: dK/dV holds 128 keys in two fp32 accumulators, which needs
      8 warps to stay under 255 registers per thread; query tiles of 64 rows (32 lost
      10-25%); 3 stages beat 2 by 5-13%;
    - backward, head_dim <= 64: 64 keys × 64 query rows with 4 warps and 3 stages; the
      2026-11-29 sweep (bf16, N 1k/4k/16k, causal and not) found it 7.6-15% faster than
      128 keys with 8 warps in all six cases (docs/sweep.md);
    - backward, head_dim 256: 64 keys, 32 query rows, 8 warps, 1 stage (shared memory);
    - fp32 inputs: half the tile sizes (4-byte tiles, ieee dots with no wgmma fast path);
    - pre-Hopper GPUs: no TMA, the same tiles with 2 stages (less shared memory).
    """
    if device_capability is None:
        return _INTERPRETER
    import torch  # local: keep this module importable without torch at import time

    hopper = device_capability[0] >= 9
    wide = dtype == torch.float32
    # FlashConfig fields by name, checked by FlashConfig (Any: mypy cannot match `**` to them)
    cfg: dict[str, Any]
    bwd: dict[str, Any]
    if head_dim <= 64:
        cfg = dict(block_m=128, block_n=64, num_warps=4, num_stages=3)
        bwd = dict(bwd_block_m=64, bwd_block_n=64, bwd_num_warps=4, bwd_num_stages=3)
    elif head_dim <= 128:
        cfg = dict(block_m=128, block_n=128, num_warps=8, num_stages=3)
        bwd = dict(bwd_block_m=64, bwd_block_n=128, bwd_num_warps=8, bwd_num_stages=3)
    else:
        cfg = dict(block_m=64, block_n=64, num_warps=4, num_stages=2)
        bwd = dict(bwd_block_m=32, bwd_block_n=64, bwd_num_warps=8, bwd_num_stages=1)
    short_causal = causal and seqlen is not None and seqlen <= _SHORT_CAUSAL_SEQLEN
    if short_causal and head_dim <= 128 and not wide:
        cfg = dict(block_m=64, block_n=64, num_warps=4, num_stages=3)
    if wide:
        half = {k: max(MIN_TILE, cfg[k] // 2) for k in ("block_m", "block_n")}
        cfg.update(half)
        cfg.update(num_stages=min(cfg["num_stages"], 2))
        bwd.update(bwd_block_m=max(MIN_TILE, bwd["bwd_block_m"] // 2), bwd_num_stages=1)
    if not hopper:
        cfg.update(num_stages=min(cfg["num_stages"], 2))
        bwd.update(bwd_num_stages=min(bwd["bwd_num_stages"], 2))
    # TMA stays opt-in: on the H200 the pointer path was 0-12% faster at head_dim 64 and
    # 128 (bf16, triton 3.6.0; docs/kernel.md).
    return FlashConfig(**cfg, **bwd, use_tma=False)


def heuristic_config(
    head_dim: int, dtype: torch.dtype, causal: bool, device: torch.device, seqlen: int
) -> FlashConfig:
    """`default_config` for tensors on `device` (a torch.device): pads `head_dim` (the real
    one) and reads the GPU's compute capability; the CPU gets the interpreter's config."""
    is_cuda = getattr(device, "type", str(device)) == "cuda"
    capability = None
    if is_cuda:
        import torch  # local: keep this module importable without torch at import time

        capability = torch.cuda.get_device_capability(device)
    return default_config(pad_pow2(head_dim), dtype, causal, capability, seqlen)
