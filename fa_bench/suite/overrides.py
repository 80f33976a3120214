"""Command-line axes for suites: `Overrides` (what `run` and `sweep` give), checked and
normalised before any suite is read; each error names the flag and the valid values."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from enum import Enum
from typing import Any

from fa_bench.case import DType, Mode
from fa_bench.suite import decode, variants
from fa_bench.suite.parse import CHOICES, SuiteError

# Override field -> (CLI flag, axis key it replaces).
FLAGS = {
    "impls": ("--impl", "impls"),
    "modes": ("--mode", "modes"),
    "dtypes": ("--dtype", "dtypes"),
    "seqlens": ("--seqlen", "seqlens"),
    "head_dims": ("--head-dim", "head_dims"),
    "batch": ("--batch", "batch"),
    "heads": ("--heads", "heads_q"),
    "kv_heads": ("--kv-heads", "heads_kv"),
    "causal": ("--causal", "causal"),
    "seqlens_q": ("--seqlen-q", "seqlens_q"),
    "seqlens_k": ("--seqlen-k", "seqlens_k"),
    "page_sizes": ("--page-size", "page_sizes"),
    "ctx_spreads": ("--ctx-spread", "ctx_spreads"),
    "windows": ("--window", "windows"),
    "alibi": ("--alibi", "alibi"),
    "softcaps": ("--softcap", "softcaps"),
    "varlens": ("--varlen", "varlens"),
}


@dataclass(frozen=True)
class Overrides:
    """Axes given on the command line; None (or an empty tuple) keeps the suite's axis.

    Values may be strings or the `Mode`/`DType` enums. `heads` without `kv_heads` keeps a
    group's heads_kv values only if they all divide every new heads_q; otherwise heads_kv
    becomes heads_q (plain multi-head attention).
    """

    impls: tuple[str, ...] | None = None
    modes: tuple[str, ...] | None = None
    dtypes: tuple[str, ...] | None = None
    seqlens: tuple[int, ...] | None = None
    head_dims: tuple[int, ...] | None = None
    batch: tuple[int, ...] | None = None
    heads: tuple[int, ...] | None = None
    kv_heads: tuple[int, ...] | None = None
    causal: bool | None = None
    # Query and key lengths apart (decode: Sq and the context); either alone keeps the
    # suite's other length, or its `seqlens` where it has one.
    seqlens_q: tuple[int, ...] | None = None
    seqlens_k: tuple[int, ...] | None = None
    # Decode only: tokens per page (0 = contiguous) and the spread of context lengths.
    page_sizes: tuple[int, ...] | None = None
    ctx_spreads: tuple[float, ...] | None = None
    # Issue 19's variants (prefill modes only): (left, right) windows, ALiBi on/off,
    # softcaps (0 = off) and varlen specs ("" = equal lengths).
    windows: tuple[tuple[int, int], ...] | None = None
    alibi: bool | None = None
    softcaps: tuple[float, ...] | None = None
    varlens: tuple[str, ...] | None = None

    @classmethod
    def from_flags(cls, flags: object, **fixed: object) -> Overrides:
        """From a command's request, whose axis attributes have these same names (one it
        lacks keeps the suite's axis); `fixed` replaces some (`sweep` sweeps `triton`)."""
        values: dict[str, Any] = {f.name: getattr(flags, f.name, None) for f in fields(cls)}
        return cls(**{**values, **fixed})


def checked_overrides(ov: Overrides | None, impl_choices: tuple[str, ...] | None) -> Overrides:
    """Validate override values (naming the CLI flag) and normalize them to plain tuples."""
    if ov is None:
        return Overrides()
    if ov.seqlens and (ov.seqlens_q or ov.seqlens_k):
        other = "--seqlen-q" if ov.seqlens_q else "--seqlen-k"
        raise SuiteError(f"--seqlen and {other} are mutually exclusive; give one")
    changes: dict[str, Any] = {}
    for f in fields(ov):
        value = getattr(ov, f.name)
        flag = FLAGS[f.name][0]
        if value is None:
            continue
        if f.name in ("causal", "alibi"):
            if not isinstance(value, bool):
                raise SuiteError(f"{flag}: expected true or false, got {value!r}")
            continue
        values = tuple(value) if isinstance(value, (list, tuple)) else (value,)
        if f.name in ("modes", "dtypes"):
            enum = Mode if f.name == "modes" else DType
            for v in values:
                if v not in CHOICES[f.name]:  # str enums compare equal to their value
                    shown = v.value if isinstance(v, Enum) else v
                    choices = ", ".join(CHOICES[f.name])
                    raise SuiteError(f"{flag}: {shown!r} is not one of {choices}")
            values = tuple(enum(v).value for v in values)
        elif f.name in ("page_sizes", "ctx_spreads"):
            values = decode.checked_flag(f.name, flag, values)
        elif f.name in variants.VARIANT_AXES:
            try:
                values = variants.axis_values(f.name, values)
            except ValueError as exc:
                raise SuiteError(f"{flag}: {exc}") from None
        elif f.name == "impls":
            for v in values:
                if not isinstance(v, str) or not v:
                    raise SuiteError(f"{flag}: expected an implementation name, got {v!r}")
                if impl_choices is not None and v not in impl_choices:
                    raise SuiteError(f"{flag}: {v!r} is not one of {', '.join(impl_choices)}")
        else:
            for v in values:
                if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                    raise SuiteError(f"{flag}: {v!r} is not a positive integer")
        changes[f.name] = values or None
    return replace(ov, **changes)
