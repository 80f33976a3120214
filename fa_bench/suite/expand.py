"""Suites: TOML files that describe grids of benchmark cases.

A suite file gives axes (implementations, modes, dtypes, shapes). Its cases are the
Cartesian product of the axes or, when it has `[[group]]` tables, the union of the
groups' products. CLI flags arrive as `Overrides` and replace axes in every group.
docs/suites.md describes the format; the built-in suites live in `fa_bench.suites`.
Reading the TOML and checking its keys and values is `fa_bench.suite.parse`; the flags'
`Overrides` and their checks are `fa_bench.suite.overrides`.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from fa_bench.case import Case, check_fp8_modes
from fa_bench.suite import decode, variants
from fa_bench.suite.overrides import FLAGS, Overrides, checked_overrides
from fa_bench.suite.parse import (
    EXCLUDES,
    GROUP_KEYS,
    TOP_KEYS,
    Axes,
    SuiteError,
    Where,
    axes_table,
    builtin_names,
    builtin_text,
    parse_toml,
    read_suite,
    text_key,
)

__all__ = ["Overrides", "Suite", "SuiteError", "TooManyCases", "builtin_suites", "load_suite",
           "load_suites"]  # fmt: skip


@dataclass(frozen=True)
class Suite:
    name: str
    description: str
    source: str  # "builtin:smoke" or the file path as given
    cases: tuple[Case, ...]


# ---------------------------------------------------------------------------- public API


def builtin_suites() -> dict[str, str]:
    """Built-in suite names mapped to their descriptions, sorted by name."""
    out = {}
    for name in builtin_names():
        source = f"builtin:{name}"
        doc = parse_toml(builtin_text(name), source)
        description = doc.get("description")
        if not isinstance(description, str):
            raise SuiteError(f"{source}: key 'description' must be a string")
        out[name] = description
    return out


class TooManyCases(SuiteError):
    """A suite past the case limit (`--max-cases`), refused before its cases are built."""


def load_suite(
    name_or_path: str | os.PathLike[str],
    overrides: Overrides | None = None,
    known_impls: Collection[str] | None = None,
    max_cases: int | None = None,
    *,
    earlier: Collection[str] = (),
) -> Suite:
    """Load a built-in suite by name or a suite file by path, apply overrides, expand cases.

    `known_impls`, when given, is the set of valid implementation names (the registry's).
    `max_cases`, when given, refuses (`TooManyCases`) more distinct cases than that,
    counted from the axes before any case is built; `earlier` (the ids of earlier
    suites' cases) count towards it.
    """
    impl_choices = tuple(sorted(known_impls)) if known_impls is not None else None
    ov = checked_overrides(overrides, impl_choices)
    source, text = read_suite(name_or_path)
    return _build(parse_toml(text, source), source, ov, impl_choices, max_cases, earlier)


def load_suites(
    names: Sequence[str | os.PathLike[str]],
    overrides: Overrides | None = None,
    known_impls: Collection[str] | None = None,
    max_cases: int | None = None,
) -> list[Suite]:
    """Load several suites; a case already in an earlier suite is dropped from later ones.
    `max_cases` limits them all together."""
    seen: set[str] = set()
    suites = []
    for name in names:
        suite = load_suite(name, overrides, known_impls, max_cases, earlier=seen)
        cases = tuple(c for c in suite.cases if c.id not in seen)
        seen.update(c.id for c in cases)
        suites.append(replace(suite, cases=cases))
    return suites


# ---------------------------------------------------------------------------- expansion


def _set(axes: Axes, key: str, values: tuple) -> None:
    """Set an axis, dropping the keys it excludes (e.g. batch drops tokens)."""
    for other in EXCLUDES.get(key, ()):
        axes.pop(other, None)
    axes[key] = values


def _merge(top: Axes, group: Axes) -> Axes:
    """The group's axes over the top-level defaults."""
    merged = dict(top)
    for key, values in group.items():
        _set(merged, key, values)
    return merged


def _apply(axes: Axes, ov: Overrides) -> Axes:
    axes = dict(axes)
    for name in ("impls", "modes", "dtypes", "head_dims", "seqlens", "batch", "kv_heads"):
        values = getattr(ov, name)
        if values is not None:
            _set(axes, FLAGS[name][1], values)
    if ov.heads is not None:
        _set(axes, "heads_q", ov.heads)
        kept = axes.get("heads_kv", ())
        if ov.kv_heads is None and any(h % kv for h in ov.heads for kv in kept):
            del axes["heads_kv"]  # falls back to heads_kv = heads_q
    if ov.causal is not None:
        axes["causal"] = (ov.causal,)
    if ov.alibi is not None:
        axes["alibi"] = (ov.alibi,)
    for name in ("windows", "softcaps", "varlens"):
        if getattr(ov, name) is not None:
            axes[name] = getattr(ov, name)
    both = axes.get("seqlens")
    for name in ("seqlens_q", "seqlens_k", "page_sizes", "ctx_spreads"):
        values = getattr(ov, name)
        if values is not None:
            _set(axes, name, values)  # seqlens_q or seqlens_k drops `seqlens`
    if both is not None and "seqlens" not in axes:
        # --seqlen-q or --seqlen-k alone keeps the suite's `seqlens` as the other length.
        axes.setdefault("seqlens_q", both)
        axes.setdefault("seqlens_k", both)
    return axes


def _require(axes: Axes, where: Where) -> None:
    hint = " (set it at the top level or in the group)" if where.group else ""
    for key in ("impls", "modes", "dtypes", "head_dims", "causal"):
        if key not in axes:
            raise where.error(f"missing key {key!r}{hint}")
    for a, b in (("batch", "tokens"), ("heads_q", "hidden")):
        if a not in axes and b not in axes:
            raise where.error(f"missing key {a!r} (or {b!r}){hint}")
    if "seqlens" not in axes:
        has_q, has_k = "seqlens_q" in axes, "seqlens_k" in axes
        if not (has_q or has_k):
            raise where.error(f"missing key 'seqlens' (or 'seqlens_q' and 'seqlens_k'){hint}")
        if has_q != has_k:
            given, needed = ("seqlens_q", "seqlens_k") if has_q else ("seqlens_k", "seqlens_q")
            raise where.error(f"key {given!r} needs {needed!r} too{hint}")


def _used_flags(ov: Overrides, *names: str) -> str:
    used = [FLAGS[n][0] for n in names if getattr(ov, n) is not None]
    return f" (after {', '.join(used)})" if used else ""


def _expand(axes: Axes, where: Where, ov: Overrides) -> Iterator[Case]:
    """The group's grid: impl, mode, dtype, head_dim, heads_q, heads_kv, batch, causal, seqlen,
    then (decode only) page size and context spread, (prefill only) the variants."""
    _require(axes, where)
    if "seqlens" in axes:
        seqs = [(s, s) for s in axes["seqlens"]]
    else:
        seqs = list(itertools.product(axes["seqlens_q"], axes["seqlens_k"]))
    sizes = axes["batch"] if "batch" in axes else axes["tokens"]
    grid = itertools.product(axes["impls"], axes["modes"], axes["dtypes"], axes["head_dims"])
    for impl, mode, dtype, head_dim in grid:
        if "hidden" in axes:
            for hidden in axes["hidden"]:
                if hidden % head_dim:
                    raise where.error(
                        f"hidden {hidden} is not divisible by head_dim {head_dim}"
                        + _used_flags(ov, "head_dims")
                    )
            heads = tuple(h // head_dim for h in axes["hidden"])
        else:
            heads = axes["heads_q"]
        for heads_q in heads:
            for heads_kv in axes.get("heads_kv", (heads_q,)):
                if heads_q % heads_kv:
                    raise where.error(
                        f"heads_q {heads_q} is not a multiple of heads_kv {heads_kv}"
                        + _used_flags(ov, "heads", "kv_heads", "head_dims")
                    )
                for size, causal, seq, (page, spread), point in itertools.product(
                    sizes, axes["causal"], seqs, decode.layouts(mode, axes),
                    variants.points(mode, axes),
                ):  # fmt: skip
                    try:
                        batch, seqlen_q, seqlen_k = variants.shape(
                            point, size, "batch" not in axes, *seq
                        )
                        yield Case(
                            impl=impl,
                            mode=mode,
                            dtype=dtype,
                            batch=batch,
                            heads_q=heads_q,
                            heads_kv=heads_kv,
                            seqlen_q=seqlen_q,
                            seqlen_k=seqlen_k,
                            head_dim=head_dim,
                            causal=causal,
                            page_size=page,
                            ctx_spread=spread,
                            **point._asdict(),
                        )
                    except ValueError as exc:
                        raise where.error(str(exc)) from None


def _count(axes: Axes, where: Where) -> int:
    """The number of cases `_expand` yields for these axes (duplicates included), without
    building them."""
    _require(axes, where)
    if "seqlens" in axes:
        seqs = len(axes["seqlens"])
    else:
        seqs = len(axes["seqlens_q"]) * len(axes["seqlens_k"])
    sizes = axes["batch"] if "batch" in axes else axes["tokens"]
    heads = axes["hidden"] if "hidden" in axes else axes["heads_q"]
    kv = len(axes["heads_kv"]) if "heads_kv" in axes else 1
    # Modes times each mode's (page size, spread) pairs: one pair for the prefill modes.
    # Prefill modes times their variants (a varlen one once per seqlen: an upper bound).
    layouts = sum(
        len(decode.layouts(m, axes)) * len(variants.points(m, axes)) for m in axes["modes"]
    )
    n = len(axes["impls"]) * layouts * len(axes["dtypes"])
    n *= len(axes["head_dims"])
    return n * len(heads) * kv * len(sizes) * len(axes["causal"]) * seqs


def _check_size(
    grid: list[tuple[Where, Axes]],
    source: str,
    ov: Overrides,
    max_cases: int,
    earlier: Collection[str],
) -> None:
    """Refuse more than `max_cases` distinct cases with the `earlier` ones, fast: the
    product of the axes decides at once; only a product past the limit, which duplicates
    might bring under it, is expanded, and then only until the limit is passed."""
    product = sum(_count(axes, where) for where, axes in grid)
    if len(earlier) + product <= max_cases:
        return
    seen: set[str] = set()
    for where, axes in grid:
        for case in _expand(axes, where, ov):
            if case.id not in earlier:
                seen.add(case.id)
            if len(earlier) + len(seen) > max_cases:
                before = f" (after {len(earlier):,} of earlier suites)" if earlier else ""
                raise TooManyCases(
                    f"{source}: its axes make {product:,} cases{before}, more than the "
                    f"limit of {max_cases:,}: "
                    "narrow the axes (--impl, --seqlen, ...), "
                    f"or raise the limit with --max-cases"
                )


def _build(
    doc: dict[str, Any],
    source: str,
    ov: Overrides,
    impl_choices: tuple[str, ...] | None,
    max_cases: int | None = None,
    earlier: Collection[str] = (),
) -> Suite:
    where = Where(source)
    name = text_key(doc, "name", where, required=True)
    description = text_key(doc, "description", where, required=True)
    top = axes_table(doc, TOP_KEYS, where, impl_choices)

    groups: list[tuple[Where, Axes]] = []
    if "group" not in doc:
        groups.append((where, top))
    else:
        raw_groups = doc["group"]
        if not isinstance(raw_groups, list) or not all(isinstance(g, dict) for g in raw_groups):
            raise where.error("key 'group': expected [[group]] tables")
        if not raw_groups:
            raise where.error("key 'group': no groups, the grid would be empty")
        for i, raw in enumerate(raw_groups, start=1):
            group_name = text_key(raw, "name", Where(source, f"group {i}"), required=False)
            label = f"group {i}" + (f" {group_name!r}" if group_name else "")
            gwhere = Where(source, label)
            groups.append((gwhere, _merge(top, axes_table(raw, GROUP_KEYS, gwhere, impl_choices))))

    grid = [(gwhere, _apply(axes, ov)) for gwhere, axes in groups]
    from_flags = {FLAGS[n][1]: FLAGS[n][0] for n in ("page_sizes", "ctx_spreads")}
    decode.check_decode_axes_used(
        grid,
        source,
        {k: f for k, f in from_flags.items() if getattr(ov, k) is not None},
        _used_flags(ov, "modes"),
    )
    for gwhere, axes in grid:
        _require(axes, gwhere)
        decode.check_decode_group(axes, gwhere, lambda *names: _used_flags(ov, *names))
        reason = variants.check_group(axes)
        if reason:
            raise gwhere.error(reason + _used_flags(ov, "modes", *variants.VARIANT_AXES))
        reason = check_fp8_modes(axes["dtypes"], axes["modes"])
        if reason:
            raise gwhere.error(reason + _used_flags(ov, "dtypes", "modes"))
    if max_cases is not None:
        _check_size(grid, source, ov, max_cases, earlier)
    cases: dict[str, Case] = {}
    for gwhere, axes in grid:
        for case in _expand(axes, gwhere, ov):
            cases.setdefault(case.id, case)
    if not cases:  # unreachable while every axis is non-empty; kept as the contract's guard
        raise where.error("the suite has no cases")
    return Suite(name=name, description=description, source=source, cases=tuple(cases.values()))
