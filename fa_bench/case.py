"""The case model: one benchmark point, and the string enums shared by core and CLI."""

from __future__ import annotations

import math
import random
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum

from fa_bench import variants
from fa_bench.variants import alibi_slopes

__all__ = ["Case", "DType", "Mode", "Status", "alibi_slopes"]


class Mode(str, Enum):
    FWD = "fwd"
    BWD = "bwd"
    FWD_BWD = "fwd_bwd"
    # Inference decoding: Sq new tokens per sequence against a KV cache; forward only.
    DECODE = "decode"

    @property
    def backward(self) -> bool:
        """Whether the case times (or needs gradients for) a backward pass."""
        return self in (Mode.BWD, Mode.FWD_BWD)


# The modes an implementation claims unless it names its own: decode needs its own inputs
# (a cache and per-sequence lengths), so an implementation opts into it explicitly.
PREFILL_MODES = (Mode.FWD, Mode.BWD, Mode.FWD_BWD)

# Decode bounds: Sq new tokens per sequence (speculative decoding when > 1) and the
# tokens per page of a paged cache (0 = contiguous).
DECODE_MAX_SEQLEN_Q = 16
PAGE_SIZE_MIN = 16
PAGE_SIZE_MAX = 256
PAGE_SIZE_STEP = 16


class DType(str, Enum):
    FP32 = "fp32"
    FP16 = "fp16"
    BF16 = "bf16"
    # Forward only: q, k, v in e4m3 with per-tensor scales, the output in bf16 (issue 21).
    FP8_E4M3 = "fp8_e4m3"

    @property
    def itemsize(self) -> int:
        """Bytes per input element (an fp8 case's output is bf16: models.py)."""
        return {"fp32": 4, "fp8_e4m3": 1}.get(self.value, 2)

    def torch(self):
        import torch

        return {
            "fp32": torch.float32,
            "fp16": torch.float16,
            "bf16": torch.bfloat16,
            "fp8_e4m3": torch.float8_e4m3fn,
        }[self.value]


# The dtypes an implementation claims unless it names its own: fp8 needs scaled inputs
# and a forward kernel for them, so an implementation opts into it explicitly.
DEFAULT_DTYPES = (DType.FP32, DType.FP16, DType.BF16)
# The modes an fp8 case may have: there is no fp8 backward.
FP8_MODES = (Mode.FWD,)


def check_fp8_modes(dtypes: Iterable[str | DType], modes: Iterable[str | Mode]) -> str | None:
    """Why a grid of `dtypes` × `modes` would hold an fp8 case of a mode it cannot have
    (the suite's check, before any Case is made), or None."""
    if DType.FP8_E4M3 not in {DType(d) for d in dtypes}:
        return None
    bad = [Mode(m).value for m in modes if Mode(m) not in FP8_MODES]
    if not bad:
        return None
    valid = ", ".join(m.value for m in FP8_MODES)
    return (
        f"key 'dtypes': fp8_e4m3 is a forward-only dtype, and 'modes' has {', '.join(bad)}; "
        f"valid modes with fp8_e4m3: {valid} (set modes = ['fwd'] or --mode fwd, or put "
        "fp8_e4m3 in a group of its own)"
    )


class Status(str, Enum):
    OK = "ok"
    OOM = "oom"
    UNSUPPORTED = "unsupported"
    ERROR = "error"
    TIMEOUT = "timeout"
    MISMATCH = "mismatch"

    @property
    def is_failure(self) -> bool:
        """Statuses that make `fa-bench run` exit 1 (an OOM or unsupported case is a finding)."""
        return self in (Status.ERROR, Status.TIMEOUT, Status.MISMATCH)


def check_page_size(value: object) -> str | None:
    """Why `value` is not a decode page size, or None (0 = contiguous cache)."""
    if isinstance(value, bool) or not isinstance(value, int):
        return f"page_size must be an integer, got {value!r}"
    if value == 0:
        return None
    if not (PAGE_SIZE_MIN <= value <= PAGE_SIZE_MAX) or value % PAGE_SIZE_STEP:
        return (
            f"page_size must be 0 (contiguous) or a multiple of {PAGE_SIZE_STEP} from "
            f"{PAGE_SIZE_MIN} to {PAGE_SIZE_MAX}, got {value}"
        )
    return None


def check_ctx_spread(value: object) -> str | None:
    """Why `value` is not a context-length spread, or None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"ctx_spread must be a number in (0, 1], got {value!r}"
    if not (0 < value <= 1):  # also refuses NaN
        return f"ctx_spread must be in (0, 1] (1 = equal lengths), got {value!r}"
    return None


@dataclass(frozen=True)
class Case:
    """One point of a suite. Causal with seqlen_q != seqlen_k is bottom-right aligned:
    query i attends keys j <= i + (seqlen_k - seqlen_q), the flash-attention convention.

    Decode (`Mode.DECODE`): seqlen_q is Sq, the new tokens per sequence (1..16); seqlen_k
    the longest context, the cache capacity; always causal, bottom-right per sequence
    against its own context length (`context_lengths()`). `page_size` (0 = contiguous
    cache) and `ctx_spread` (1.0 = equal lengths) apply to decode only.

    Variants (issue 19; prefill modes only; `fa_bench.variants` has the semantics): a
    window (window_left, window_right; -1 = unbounded; causal also bounds the right at 0),
    `alibi` (the geometric slopes of `alibi_slopes(heads_q)`), `softcap` (0 = off) and
    `varlen` (packed documents: "uniform:LO-HI" or "list:L1,...", seqlen_q == seqlen_k ==
    the longest). Scores take softcap, then ALiBi, then the mask.
    """

    impl: str
    mode: Mode
    dtype: DType
    batch: int
    heads_q: int
    heads_kv: int
    seqlen_q: int
    seqlen_k: int
    head_dim: int
    causal: bool
    # Decode only; the defaults keep every other case, its id and older files as they were.
    page_size: int = 0
    ctx_spread: float = 1.0
    # Variants (issue 19); the defaults are dense attention over equal lengths, as before.
    window_left: int = -1
    window_right: int = -1
    alibi: bool = False
    softcap: float = 0.0
    varlen: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", Mode(self.mode))
        object.__setattr__(self, "dtype", DType(self.dtype))
        for name in ("batch", "heads_q", "heads_kv", "seqlen_q", "seqlen_k", "head_dim"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.heads_q % self.heads_kv:
            raise ValueError(
                f"heads_q ({self.heads_q}) must be a multiple of heads_kv ({self.heads_kv})"
            )
        if not isinstance(self.causal, bool):
            raise ValueError(f"causal must be true or false, got {self.causal!r}")
        if self.dtype is DType.FP8_E4M3 and self.mode not in FP8_MODES:
            raise ValueError(
                f"mode {self.mode.value} does not apply to dtype fp8_e4m3, a forward-only "
                f"dtype (valid modes: {', '.join(m.value for m in FP8_MODES)})"
            )
        self._check_decode()
        self._check_variants()

    def _check_variants(self) -> None:
        for name in ("window_left", "window_right"):
            reason = variants.check_window(name, getattr(self, name))
            if reason:
                raise ValueError(reason)
        if not isinstance(self.alibi, bool):
            raise ValueError(f"alibi must be true or false, got {self.alibi!r}")
        reason = variants.check_softcap(self.softcap)
        if reason:
            raise ValueError(reason)
        object.__setattr__(self, "softcap", float(self.softcap))
        object.__setattr__(self, "varlen", variants.canonical_varlen(self.varlen))
        if self.is_variant and self.mode is Mode.DECODE:
            raise ValueError(
                "window, alibi, softcap and varlen do not apply to decode cases yet; "
                "use the fwd, bwd or fwd_bwd modes"
            )
        if self.varlen:
            longest = max(variants.varlen_lengths(self.varlen, self.batch))
            if self.seqlen_q != longest or self.seqlen_k != longest:
                raise ValueError(
                    f"seqlen_q and seqlen_k must both be the longest document ({longest}) "
                    f"of varlen {self.varlen!r}, got {self.seqlen_q} and {self.seqlen_k}"
                )

    @property
    def is_variant(self) -> bool:
        """Whether any issue-19 variant differs from dense attention over equal lengths."""
        return (
            self.window_left != -1
            or self.window_right != -1
            or self.alibi
            or self.softcap != 0.0
            or self.varlen != ""
        )

    @property
    def has_window(self) -> bool:
        return (self.window_left, self.window_right) != (-1, -1)

    def sequence_lengths(self) -> tuple[int, ...]:
        """The query lengths of the batch: a packed case's document lengths (the same on
        every machine), else seqlen_q for each of the batch's sequences."""
        if self.varlen:
            return variants.varlen_lengths(self.varlen, self.batch)
        return (self.seqlen_q,) * self.batch

    @property
    def total_tokens(self) -> int:
        """Query tokens over the batch; T of a packed case's (1, H, T, D) tensors."""
        if not self.varlen:
            return self.batch * self.seqlen_q  # no tuple of `batch` items: batch may be huge
        return sum(self.sequence_lengths())

    def _variant_parts(self) -> list[str]:
        def side(v: int) -> str:
            return "inf" if v == -1 else str(v)

        parts = []
        if self.has_window:
            parts.append(f"win{side(self.window_left)}.{side(self.window_right)}")
        if self.alibi:
            parts.append("alibi")
        if self.softcap:
            parts.append(f"cap{self.softcap:g}")
        if self.varlen:
            parts.append(variants.varlen_id(self.varlen))
        return parts

    def _variant_label(self) -> str:
        def side(v: int) -> str:
            return "inf" if v == -1 else str(v)

        words = []
        if self.has_window:
            words.append(f"window={side(self.window_left)},{side(self.window_right)}")
        if self.alibi:
            words.append("alibi")
        if self.softcap:
            words.append(f"softcap={self.softcap:g}")
        if self.varlen:
            words.append(f"varlen={self.varlen} T={self.total_tokens}")
        return "".join(" " + w for w in words)

    def _check_decode(self) -> None:
        for reason in (check_page_size(self.page_size), check_ctx_spread(self.ctx_spread)):
            if reason:
                raise ValueError(reason)
        # Stored as a float so that 1 and 1.0 give one id and one JSON spelling.
        object.__setattr__(self, "ctx_spread", float(self.ctx_spread))
        if self.mode is not Mode.DECODE:
            if self.page_size != 0:
                raise ValueError(f"page_size applies to decode only, got {self.page_size}")
            if self.ctx_spread != 1.0:
                raise ValueError(f"ctx_spread applies to decode only, got {self.ctx_spread}")
            return
        if not self.causal:
            raise ValueError("causal must be true for decode (each query sees its own prefix)")
        if self.seqlen_q > DECODE_MAX_SEQLEN_Q:
            raise ValueError(
                f"seqlen_q (new tokens per sequence) must be 1..{DECODE_MAX_SEQLEN_Q} for "
                f"decode, got {self.seqlen_q}"
            )
        if self.seqlen_k < self.seqlen_q:
            raise ValueError(
                f"seqlen_k (the context, {self.seqlen_k}) must be at least seqlen_q "
                f"({self.seqlen_q}) for decode"
            )

    def context_lengths(self) -> tuple[int, ...]:
        """The batch's context lengths L_b, from the case alone (the same on every machine).

        Equal (seqlen_k each) when ctx_spread is 1; else evenly spaced from seqlen_k down to
        max(seqlen_q, ceil(ctx_spread * seqlen_k)), then shuffled by a fixed seed so the
        longest sequence is not always the first.
        """
        s_max, b = self.seqlen_k, self.batch
        if self.ctx_spread == 1.0 or b == 1:
            return (s_max,) * b
        # Rounded first so that e.g. 0.1 * 30 = 3.0000000000000004 gives 3, not 4.
        low = max(self.seqlen_q, math.ceil(round(self.ctx_spread * s_max, 9)))
        span = s_max - low
        # Integer rounding (half up) of s_max - i * span / (b - 1): no float drift.
        lengths = [s_max - (2 * i * span + (b - 1)) // (2 * (b - 1)) for i in range(b)]
        random.Random(0x5EED + b).shuffle(lengths)
        return tuple(lengths)

    @property
    def max_seqlen(self) -> int:
        """The longer of the query and key lengths: what the tile heuristic and the tuning
        cache's seqlen buckets key on."""
        return max(self.seqlen_q, self.seqlen_k)

    @property
    def id(self) -> str:
        """Stable across runs for the same parameters and implementation."""
        shape = (
            f"b{self.batch}-hq{self.heads_q}-hkv{self.heads_kv}"
            f"-sq{self.seqlen_q}-sk{self.seqlen_k}-d{self.head_dim}"
        )
        if self.mode is Mode.DECODE:
            # Always causal, so the last part names the cache layout and the spread instead.
            last = "contig" if self.page_size == 0 else f"page{self.page_size}"
            if self.ctx_spread != 1.0:
                last += f"-spread{self.ctx_spread:g}"
        else:
            last = "causal" if self.causal else "full"
        parts = [self.impl, self.mode.value, self.dtype.value, shape, last]
        if self.is_variant:
            # A last segment only for variants: every dense case keeps its id exactly.
            parts.append("-".join(self._variant_parts()))
        return "/".join(parts)

    @property
    def label(self) -> str:
        """Short human description for progress lines."""
        seq = (
            f"N={self.seqlen_q}"
            if self.seqlen_q == self.seqlen_k
            else f"Sq={self.seqlen_q},Sk={self.seqlen_k}"
        )
        heads = f"H={self.heads_q}" + (f"/{self.heads_kv}" if self.heads_kv != self.heads_q else "")
        if self.mode is Mode.DECODE:
            cache = "contig" if self.page_size == 0 else f"page={self.page_size}"
            spread = f" spread={self.ctx_spread:g}" if self.ctx_spread != 1.0 else ""
            return (
                f"{self.impl} decode {self.dtype.value} B={self.batch} {heads} "
                f"Sq={self.seqlen_q},ctx={self.seqlen_k} D={self.head_dim} {cache}{spread}"
            )
        return (
            f"{self.impl} {self.mode.value} {self.dtype.value} B={self.batch} {heads} {seq} "
            f"D={self.head_dim}{' causal' if self.causal else ''}{self._variant_label()}"
        )

    def to_dict(self) -> dict:
        # Not dataclasses.asdict: it deep-copies, and a report of 100k cases calls this for
        # each; every field here is immutable.
        d = {name: getattr(self, name) for name in self.__dataclass_fields__}
        if self.mode is not Mode.DECODE:
            # Always the defaults here: left out so results files of the other modes stay
            # byte for byte what they were before decode existed.
            for name in _DECODE_OPTIONAL:
                del d[name]
        # Variant keys only when set: dense cases' dicts stay as they were before issue 19.
        for name, default in _VARIANT_DEFAULTS.items():
            if d[name] == default:
                del d[name]
        d["mode"] = self.mode.value
        d["dtype"] = self.dtype.value
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Case:
        """Dicts written before page_size, ctx_spread or the variants existed (or that
        leave out a default) get their defaults."""
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d or k not in _OPTIONAL})


# Fields that a dict may lack (files written before they existed); the rest are required.
_DECODE_OPTIONAL = frozenset({"page_size", "ctx_spread"})
_VARIANT_DEFAULTS: dict[str, object] = {
    "window_left": -1,
    "window_right": -1,
    "alibi": False,
    "softcap": 0.0,
    "varlen": "",
}
_OPTIONAL = _DECODE_OPTIONAL | frozenset(_VARIANT_DEFAULTS)
# Issue 19's variant fields, in Case order.
VARIANT_FIELDS = tuple(_VARIANT_DEFAULTS)
