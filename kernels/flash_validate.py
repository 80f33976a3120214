"""The variant arguments of `flash_attention` and `flash_attention_varlen` (issue 19):
their checks (ValueError naming the argument and its value) and what the kernels take.

The kernels' form (`Variant`): the window as two non-negative bounds (-1, unbounded,
becomes seq_q + seq_k, which no index reaches; causal sets the right bound to 0, as
flash-attn's `window_size=(left, 0)`), softcap · log2(e), the ALiBi slopes as a
(batch, heads) fp32 view (batch stride 0 for per-head slopes), and a packed batch's
cumulative lengths. `Variant.kernel_args()` is the keyword arguments of every kernel;
a dense call has no Variant at all, so its launches pass none of them and compile to
the dense code.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

import torch

from fa_bench.kernels.flash_config import HEAD_DIM_MULTIPLE, MAX_HEAD_DIM
from fa_bench.kernels.flash_varlen_sched import build_schedule

_LOG2E = 1.4426950408889634
_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# The softcap's tanh for fp16/bf16 inputs: the hardware's tanh.approx.f32 (relative error
# about 2^-11, far below those dtypes' rounding of the scores); fp32 inputs always take
# libdevice's. Module switches for development timing (tools/gpu/variants_bench.py):
# FAST_TANH off takes libdevice's everywhere; PACKED_TANH on takes tanh.approx.bf16x2 for
# bf16 inputs (two values per instruction, bf16 precision; not the default, not tested
# against the accuracy rule).
FAST_TANH = True
PACKED_TANH = False
# A packed batch's backward runs its (sequence, block) pairs from a table, heaviest first
# (flash_varlen_sched); off, the grid of block indices × sequences (the first order, kept
# for development timing: tools/gpu/variants_bwd.py).
PACKED_SCHEDULE = True
# Its costs compared in bins of this many blocks, a sequence's pairs together inside a
# bin (L2 reuse of its rows and keys); 1: strictly heaviest first (flash_varlen_sched).
SCHEDULE_BIN = 1
# The dK/dV table launch's axes: True puts the table on the fast axis (one kv head's
# programs side by side, for L2 reuse of Q/dO); False (the default) the kv heads. The
# H200 (2026-11-30, call D) measured the heads fast 2% faster (255.3 against 250.3
# TFLOP/s, the variants suite's 16k-token packed batch, bf16 d128 causal).
PACKED_TABLE_FAST = False
# The dK/dV kernel issues dPᵀ = V·dOᵀ before P's elementwise work (flash_kernels_bwd
# DP_FIRST): "variants" (a window, softcap or ALiBi: +3.1% softcap, +5.2% window on the
# H200, 2026-11-30 call C), "all" (the dense kernel too: +1.1% there, within the noise,
# not measured at head_dim 64, so not the default) or "off".
DKDV_DP_FIRST = "variants"
# A packed batch's dK/dV kernel loads its streamed Q/dO rows unmasked, from row indices
# clamped into the packed tensor (flash_kernels_bwd CLAMP): the 2-D row masks of every
# streamed load held registers (sm_90: 736 bytes of spills against the dense kernel's
# 172). 2: also the sequence's whole row blocks in a loop with no mask at all, its tail
# block in the diagonal's masked loop (H200, 2026-11-30 session 6 call B: the packed
# mixed batch's backward 252.8 -> 288.5 TFLOP/s, 0.904 of 8 x 2048 dense); 3: the same
# with the tail block in a third loop; 1: the clamped loads only (261.2); 0: the masked
# loads (the first packed kernel, kept for timing).
PACKED_CLAMP = 2
# The packed dK/dV kernel's masked loop's pipeline depth (CLAMP 2, 3; None: the launch's
# num_stages, 3 at head_dim 128). 2: H200, session 6 call C, the packed mixed batch's
# backward 288.4 -> 296.6 TFLOP/s (0.909 -> 0.935 of 8 x 2048 dense); 1: 272.0.
PACKED_DIAG_STAGES: int | None = 2


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def describe(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> str:
    return f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"


def check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None) -> None:
    """Raise TypeError/ValueError (with the shapes) for inputs the kernels cannot take."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    shapes = describe(q, k, v)
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
    if q.device.type == "cpu" and not interpreting():
        raise ValueError(
            f"CPU tensors need the Triton interpreter (TRITON_INTERPRET=1 before import); {shapes}"
        )
    if q.device.type not in ("cpu", "cuda"):
        raise ValueError(f"unsupported device {q.device}; {shapes}")
    if scale is not None and not (isinstance(scale, (int, float)) and scale > 0):
        raise ValueError(f"scale must be a positive number, got {scale!r}")


@dataclass(frozen=True)
class Varlen:
    """A packed batch: int32 cumulative lengths (B + 1,) and the longest sequences; the
    backward's work order (flash_varlen_sched) is kept here once built, by its key."""

    cu_q: torch.Tensor
    cu_k: torch.Tensor
    max_q: int
    max_k: int
    schedules: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def batch(self) -> int:
        return self.cu_q.numel() - 1

    def schedule(
        self, block: int, window: tuple[int, int] | None, causal: bool, total_q: int,
        total_k: int, bin_blocks: int = 1,
    ) -> torch.Tensor:  # fmt: skip
        """The backward's (4, E) table of (sequence, block) pairs, heaviest first."""
        key = (block, window, causal, total_q, total_k, bin_blocks)
        if key not in self.schedules:
            self.schedules[key] = build_schedule(
                self.cu_q, self.cu_k, self.max_q, self.max_k, total_q, total_k,
                block, window, causal, bin_blocks,
            )  # fmt: skip
        return self.schedules[key]


@dataclass(frozen=True)
class Variant:
    """What the kernels take for a window, softcap, ALiBi or a packed batch."""

    window: tuple[int, int] | None = None  # kernel bounds (left, right), both >= 0
    softcap: float = 0.0
    slopes: torch.Tensor | None = None  # (batch, heads_q) fp32 view
    varlen: Varlen | None = None
    tanh: int = 0  # the softcap's tanh: 0 libdevice's, 1 tanh.approx.f32, 2 bf16x2

    @property
    def masked(self) -> bool:
        """Whether any variant changes the scores or the visible keys (not only varlen)."""
        return self.window is not None or self.softcap > 0 or self.slopes is not None

    def kernel_args(self) -> dict:
        """The variant keywords of the forward, dK/dV and dQ kernels."""
        args: dict = dict(
            WINDOW=self.window is not None,
            # 1 + the tanh: 0 libdevice's, 1 tanh.approx.f32, 2 bf16x2 (flash_kernels_variants)
            SOFTCAP=1 + self.tanh if self.softcap > 0 else 0,
            ALIBI=self.slopes is not None,
            VARLEN=self.varlen is not None,
        )
        if self.window is not None:
            args.update(win_left=self.window[0], win_right=self.window[1])
        if self.softcap > 0:
            args.update(softcap2=self.softcap * _LOG2E)
        if self.slopes is not None:
            args.update(Slopes=self.slopes, stride_slope_b=self.slopes.stride(0))
        if self.varlen is not None:
            args.update(CuQ=self.varlen.cu_q, CuK=self.varlen.cu_k)
        return args


def check_window(window: object) -> tuple[int, int]:
    """`window` as (left, right), each an int >= -1 (-1 = unbounded)."""
    if (
        not isinstance(window, (tuple, list))
        or len(window) != 2
        or any(isinstance(w, bool) or not isinstance(w, int) for w in window)
    ):
        raise ValueError(
            f"window must be a pair of ints (left, right), -1 = unbounded; got {window!r}"
        )
    left, right = int(window[0]), int(window[1])
    if left < -1 or right < -1:
        raise ValueError(f"window values must be -1 (unbounded) or >= 0; got window={window!r}")
    return left, right


def check_softcap(softcap: object) -> float:
    """`softcap` as a float: 0 (off) or finite and positive."""
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float)):
        raise ValueError(f"softcap must be a number (0 = off), got {softcap!r}")
    if not math.isfinite(softcap) or softcap < 0:
        raise ValueError(f"softcap must be 0 (off) or finite and > 0, got {softcap!r}")
    return float(softcap)


def check_slopes(
    slopes: object, batch: int, heads_q: int, device: torch.device
) -> torch.Tensor | None:
    """`alibi_slopes` as a (batch, heads_q) fp32 view (stride 1 over heads), or None."""
    if slopes is None:
        return None
    if not isinstance(slopes, torch.Tensor):
        kind = type(slopes).__name__
        raise ValueError(f"alibi_slopes must be a torch.Tensor or None, got {kind}")
    shape = tuple(slopes.shape)
    if shape not in ((heads_q,), (batch, heads_q)):
        raise ValueError(
            f"alibi_slopes must have shape ({heads_q},) or ({batch}, {heads_q}), got {shape}"
        )
    if slopes.dtype != torch.float32:
        raise ValueError(f"alibi_slopes must be float32, got {slopes.dtype}")
    if slopes.device != device:
        raise ValueError(f"alibi_slopes must be on {device} (with q), got {slopes.device}")
    if slopes.stride(-1) != 1:
        slopes = slopes.contiguous()
    return slopes.expand(batch, heads_q) if slopes.dim() == 1 else slopes


def kernel_window(
    window: tuple[int, int], causal: bool, seq_q: int, seq_k: int
) -> tuple[int, int] | None:
    """The kernels' bounds of a checked window, or None when it bounds nothing beyond
    `causal` (the dense causal / non-causal code then runs). -1 becomes seq_q + seq_k:
    no query reaches a key that far from its diagonal."""
    left, right = window
    if causal:
        right = 0
    if left == -1 and right == -1:
        return None
    if left == -1 and causal:
        return None  # plain causal
    # past seq_q + seq_k a bound binds nothing: clamp there, so int32 index math holds
    unbounded = seq_q + seq_k
    return (
        unbounded if left == -1 else min(left, unbounded),
        unbounded if right == -1 else min(right, unbounded),
    )


def make_variant(
    q: torch.Tensor,
    *,
    causal: bool,
    window: object,
    alibi_slopes: object,
    softcap: object,
    batch: int,
    seq_q: int,
    seq_k: int,
    varlen: Varlen | None = None,
) -> Variant | None:
    """Check the variant arguments and build the kernels' Variant; None for a dense call."""
    bounds = kernel_window(check_window(window), causal, seq_q, seq_k)
    cap = check_softcap(softcap)
    slopes = check_slopes(alibi_slopes, batch, q.shape[1], q.device)
    if bounds is None and cap == 0 and slopes is None and varlen is None:
        return None
    tanh = 0
    if FAST_TANH and q.dtype in (torch.float16, torch.bfloat16):
        tanh = 2 if PACKED_TANH and q.dtype == torch.bfloat16 else 1
    return Variant(window=bounds, softcap=cap, slopes=slopes, varlen=varlen, tanh=tanh)


def programs(
    variant: Variant | None, batch: int, seq: int, block: int, keys: bool = False
) -> tuple[int, int]:
    """(blocks of `seq` query rows, or keys, and batches): a packed batch's grid covers
    its longest sequence and its sequence count (programs past a sequence's end return)."""
    if variant is None or variant.varlen is None:
        return -(-seq // block), batch
    vl = variant.varlen
    return -(-(vl.max_k if keys else vl.max_q) // block), vl.batch


def backward_grids(
    variant: Variant | None, causal: bool, batch: int, heads_q: int, heads_kv: int,
    seq_q: int, seq_k: int, block: int,
) -> tuple[dict, tuple[int, int], tuple[int, int]]:  # fmt: skip
    """The two-kernel backward's variant keywords, dK/dV grid and dQ grid (`block` keys
    or query rows held per program; seq_q/seq_k a packed batch's token totals).

    Dense and unpacked: (blocks, batch × heads). A packed batch: its (sequence, block)
    table, heaviest first, VARLEN = 3: dK/dV (kv heads, entries), dQ (q heads, entries)
    (PACKED_TABLE_FAST: VARLEN = 2, dK/dV (entries, kv heads)); or with
    PACKED_SCHEDULE off, (sequences × heads, the longest's blocks). DP_FIRST: see
    DKDV_DP_FIRST."""
    extra = {} if variant is None else variant.kernel_args()
    masked = variant is not None and variant.masked
    if DKDV_DP_FIRST == "all" or (DKDV_DP_FIRST == "variants" and masked):
        extra["DP_FIRST"] = True  # passed only when on: a dense launch compiles as before
    vl = None if variant is None else variant.varlen
    if vl is None:
        return (
            extra,
            (-(-seq_k // block), batch * heads_kv),
            (-(-seq_q // block), batch * heads_q),
        )
    if PACKED_CLAMP:
        extra["CLAMP"] = int(PACKED_CLAMP)
    if PACKED_CLAMP >= 2 and PACKED_DIAG_STAGES is not None:
        extra["DIAG_STAGES"] = PACKED_DIAG_STAGES
    if not PACKED_SCHEDULE:
        blocks_k, blocks_q = -(-vl.max_k // block), -(-vl.max_q // block)
        return extra, (vl.batch * heads_kv, blocks_k), (vl.batch * heads_q, blocks_q)
    window = None if variant is None else variant.window
    sched = vl.schedule(block, window, causal, seq_q, seq_k, SCHEDULE_BIN)
    extra.update(VARLEN=2 if PACKED_TABLE_FAST else 3, Sched=sched)
    entries = sched.shape[1]
    dkdv = (entries, heads_kv) if PACKED_TABLE_FAST else (heads_kv, entries)
    return extra, dkdv, (heads_q, entries)
