"""The case model: one benchmark point, and the string enums shared by core and CLI."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Mode(str, Enum):
    FWD = "fwd"
    BWD = "bwd"
    FWD_BWD = "fwd_bwd"


class DType(str, Enum):
    FP32 = "fp32"
    FP16 = "fp16"
    BF16 = "bf16"

    @property
    def itemsize(self) -> int:
        return 4 if self is DType.FP32 else 2

    def torch(self):
        import torch

        return {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[self.value]


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


@dataclass(frozen=True)
class Case:
    """One point of a suite. Causal with seqlen_q != seqlen_k is bottom-right aligned:
    query i attends keys j <= i + (seqlen_k - seqlen_q), the flash-attention convention."""

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
        return "/".join(
            [
                self.impl,
                self.mode.value,
                self.dtype.value,
                shape,
                "causal" if self.causal else "full",
            ]
        )

    @property
    def label(self) -> str:
        """Short human description for progress lines."""
        seq = (
            f"N={self.seqlen_q}"
            if self.seqlen_q == self.seqlen_k
            else f"Sq={self.seqlen_q},Sk={self.seqlen_k}"
        )
        heads = f"H={self.heads_q}" + (f"/{self.heads_kv}" if self.heads_kv != self.heads_q else "")
        return (
            f"{self.impl} {self.mode.value} {self.dtype.value} B={self.batch} {heads} {seq} "
            f"D={self.head_dim}{' causal' if self.causal else ''}"
        )

    def to_dict(self) -> dict:
        # Not dataclasses.asdict: it deep-copies, and a report of 100k cases calls this for
        # each; every field here is immutable.
        d = {name: getattr(self, name) for name in self.__dataclass_fields__}
        d["mode"] = self.mode.value
        d["dtype"] = self.dtype.value
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Case:
        return cls(**{k: d[k] for k in cls.__dataclass_fields__})
