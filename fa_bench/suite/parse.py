"""Reading and checking a suite document: the TOML text of a built-in suite or a file,
its keys and axis values, before any case is built.

Every error names the file (and the group) and, where there is a fixed set, the choices.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Literal, overload

from fa_bench.case import DType, Mode, check_ctx_spread, check_page_size
from fa_bench.errors import UsageError
from fa_bench.suite.variants import VARIANT_AXES, axis_values

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 needs the tomli backport
    try:
        import tomli as tomllib
    except ModuleNotFoundError:
        tomllib = None

_PACKAGE = "fa_bench.suites"

# Axis keys in the order the docs and the "valid keys" messages list them.
AXES = (
    "impls",
    "modes",
    "dtypes",
    "batch",
    "tokens",
    "heads_q",
    "hidden",
    "heads_kv",
    "seqlens",
    "seqlens_q",
    "seqlens_k",
    "head_dims",
    "causal",
    "page_sizes",
    "ctx_spreads",
    *VARIANT_AXES,
)
_STR_AXES = frozenset({"impls", "modes", "dtypes"})
_BOOL_AXES = frozenset({"causal"})
# Decode-only axes: a suite that has them needs the decode mode (expand checks it).
DECODE_AXES = ("page_sizes", "ctx_spreads")
# The contiguous cache: `page_sizes = ["none", 64]` reads as (0, 64).
CONTIGUOUS = "none"
TOP_KEYS = ("name", "description", *AXES, "group")
GROUP_KEYS = ("name", *AXES)
CHOICES = {"modes": tuple(m.value for m in Mode), "dtypes": tuple(d.value for d in DType)}
# Keys that exclude each other; a group setting one drops the others inherited from the top.
EXCLUDES = {
    "batch": ("tokens",),
    "tokens": ("batch",),
    "heads_q": ("hidden",),
    "hidden": ("heads_q",),
    "seqlens": ("seqlens_q", "seqlens_k"),
    "seqlens_q": ("seqlens",),
    "seqlens_k": ("seqlens",),
}

Axes = dict[str, tuple]


class SuiteError(UsageError, ValueError):
    """A suite file or an override is invalid; the message names the file, key and choices."""


def builtin_names() -> list[str]:
    files = resources.files(_PACKAGE)
    return sorted(p.name[: -len(".toml")] for p in files.iterdir() if p.name.endswith(".toml"))


def builtin_text(name: str) -> str:
    return (resources.files(_PACKAGE) / f"{name}.toml").read_text(encoding="utf-8")


def read_suite(name_or_path: str | os.PathLike[str]) -> tuple[str, str]:
    """(source, text) for a built-in name or a file path."""
    key = os.fspath(name_or_path)
    builtins = builtin_names()
    if key in builtins:
        return f"builtin:{key}", builtin_text(key)
    path = Path(key)
    looks_like_path = path.suffix == ".toml" or "/" in key or os.sep in key
    if not looks_like_path and not path.exists():
        raise SuiteError(
            f"unknown suite {key!r}: not a built-in suite ({', '.join(builtins)}) "
            "nor a path to a .toml file"
        )
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise SuiteError(
            f"{key}: cannot read suite file ({exc.strerror}); "
            f"built-in suites: {', '.join(builtins)}"
        ) from None
    try:
        return key, data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SuiteError(f"{key}: not UTF-8 text (byte {exc.start}: {exc.reason})") from None


def parse_toml(text: str, source: str) -> dict[str, Any]:
    if tomllib is None:  # pragma: no cover - Python 3.10 without tomli
        raise SuiteError(f"{source}: reading suites on Python 3.10 needs the 'tomli' package")
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SuiteError(f"{source}: invalid TOML: {exc}") from None


@dataclass(frozen=True)
class Where:
    """Message prefix: the file, and the group when the error is inside one."""

    source: str
    group: str | None = None

    def error(self, message: str) -> SuiteError:
        prefix = f"{self.source}: {self.group}" if self.group else self.source
        return SuiteError(f"{prefix}: {message}")


def _show(value: object) -> str:
    """A value as the TOML file spells it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "a table"
    return repr(value)


def _axis(key: str, raw: object, where: Where, impl_choices: tuple[str, ...] | None) -> tuple:
    items = raw if isinstance(raw, list) else [raw]
    if not items:
        raise where.error(f"key {key!r}: empty list, the grid would be empty")
    if key in DECODE_AXES:
        return _decode_axis(key, items, where)
    if key in VARIANT_AXES:
        try:
            return axis_values(key, items)
        except ValueError as exc:
            raise where.error(f"key {key!r}: {exc}") from None
    for item in items:
        if key in _BOOL_AXES:
            if not isinstance(item, bool):
                raise where.error(f"key {key!r}: expected true, false or a list, got {_show(item)}")
        elif key in _STR_AXES:
            if not isinstance(item, str) or not item:
                raise where.error(
                    f"key {key!r}: expected a non-empty string or a list, got {_show(item)}"
                )
            choices = CHOICES.get(key, impl_choices)
            if choices is not None and item not in choices:
                raise where.error(f"key {key!r}: {item!r} is not one of {', '.join(choices)}")
        elif isinstance(item, bool) or not isinstance(item, int):
            raise where.error(
                f"key {key!r}: expected a positive integer or a list, got {_show(item)}"
            )
        elif item < 1:
            raise where.error(f"key {key!r}: {item} is not a positive integer")
    return tuple(items)


def _decode_axis(key: str, items: list, where: Where) -> tuple:
    """page_sizes: 0 or "none" (contiguous) or 16..256 in steps of 16; ctx_spreads: (0, 1]."""
    out: list = []
    for item in items:
        if key == "page_sizes":
            value = 0 if item == CONTIGUOUS else item
            reason = check_page_size(value)
            hint = f' ("{CONTIGUOUS}" or 0: contiguous)'
        else:
            value, reason, hint = item, check_ctx_spread(item), " (1.0: equal lengths)"
        if reason is not None:
            raise where.error(f"key {key!r}: {_show(item)} is invalid: {reason}{hint}")
        out.append(value if key == "page_sizes" else float(value))
    return tuple(out)


def axes_table(
    table: Mapping[str, Any],
    valid: tuple[str, ...],
    where: Where,
    impl_choices: tuple[str, ...] | None,
) -> Axes:
    """Validate one table (top level or group) and return its axes as tuples."""
    for key in table:
        if key not in valid:
            raise where.error(f"unknown key {key!r}; valid keys: {', '.join(valid)}")
    axes = {k: _axis(k, v, where, impl_choices) for k, v in table.items() if k in AXES}
    for key, others in EXCLUDES.items():
        for other in others:
            if key in axes and other in axes:
                raise where.error(f"keys {key!r} and {other!r} are mutually exclusive; give one")
    return axes


@overload
def text_key(doc: Mapping[str, Any], key: str, where: Where, required: Literal[True]) -> str: ...


@overload
def text_key(doc: Mapping[str, Any], key: str, where: Where, required: bool) -> str | None: ...


def text_key(doc: Mapping[str, Any], key: str, where: Where, required: bool) -> str | None:
    if key not in doc:
        if required:
            raise where.error(f"missing key {key!r}")
        return None
    value = doc[key]
    if not isinstance(value, str) or not value.strip():
        raise where.error(f"key {key!r}: expected a non-empty string, got {_show(value)}")
    return value
