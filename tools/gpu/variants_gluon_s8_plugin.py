"""An fa-bench plugin for issue 19's session 8 A/B through `fa-bench run`: our `triton`
implementation with flash_gluon_varhost.C3_KINDS (which variant kinds take the
three-consumer 64-key launch, C3_N64) set around each of its calls:

- `triton-c2`: none (every variant on the two-consumer 128-key launch, as before session 8);
- `triton-c3`: every kind, both dtypes (C3_N64 wherever the dispatch may take it: causal,
  head_dim 128);
- `triton-pick`: the table in the JSON file $VAR_S8_PICK (tools/gpu/variants_gluon_s8.py
  pick's answer: {"bf16": [kinds], "fp16": [kinds]}); the committed table without it.

    fa-bench run --plugin tools/gpu/variants_gluon_s8_plugin.py \
        -s tools/gpu/variants_targets_s7.toml --mode fwd -i triton -i triton-c3

Dense cases run the same kernel as `triton` (the table touches variant launches only). The
backend string names the launch that ran (gluon-ws-m64-n64-s4-c3-nopp for C3_N64). A
developer tool, not installed.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
from collections.abc import Iterator

import torch

from fa_bench.kernels import flash_gluon_varhost as vh
from fa_bench.kernels import triton_impl
from fa_bench.registry import Prepared, register

_FEATURES = ("window", "softcap", "alibi", "varlen")
EVERY = frozenset("+".join(c) for n in range(1, 5) for c in itertools.combinations(_FEATURES, n))


@contextlib.contextmanager
def c3_kinds(table: dict[str, frozenset[str]]) -> Iterator[None]:
    """flash_gluon_varhost.C3_KINDS set to `table`, the committed one back after."""
    saved = vh.C3_KINDS
    vh.C3_KINDS = table
    try:
        yield
    finally:
        vh.C3_KINDS = saved


def picked(path: str | None) -> dict[str, frozenset[str]]:
    """The table in the pick JSON at `path` (the committed table when None or missing)."""
    if not path or not os.path.exists(path):
        return dict(vh.C3_KINDS)
    with open(path) as f:
        data = json.load(f)
    bad = [k for ks in data.values() for k in ks if k not in EVERY]
    if bad or not set(data) <= {"bf16", "fp16"}:
        raise ValueError(f"VAR_S8_PICK={path}: unknown dtype or kinds in {data!r}")
    return {d: frozenset(ks) for d, ks in data.items()}


def _build(case, q, k, v, options, *, name: str, table: dict, tag: str) -> Prepared:
    """triton's builder (compiling outside the timed span) with the table set."""
    with c3_kinds(table):
        prep = triton_impl._prepare(case, q, k, v, options, deterministic=True, name=name)
    fn = prep.fn

    def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        with c3_kinds(table):
            return fn(q, k, v)

    return Prepared(run, backend=f"{prep.backend} [{tag}]")


_KW: dict = dict(
    modes=("fwd",), dtypes=("fp16", "bf16"), devices=("cuda",), check=triton_impl._check
)


@register("triton-c2", description="triton, every variant on the two-consumer launch", **_KW)
def triton_c2(case, q, k, v, options=None) -> Prepared:
    return _build(case, q, k, v, options, name="triton-c2", table={}, tag="c2")


@register("triton-c3", description="triton, every variant on the three-consumer launch", **_KW)
def triton_c3(case, q, k, v, options=None) -> Prepared:
    table = {"bf16": EVERY, "fp16": EVERY}
    return _build(case, q, k, v, options, name="triton-c3", table=table, tag="c3")


@register("triton-pick", description="triton with the C3_KINDS of $VAR_S8_PICK", **_KW)
def triton_pick(case, q, k, v, options=None) -> Prepared:
    table = picked(os.environ.get("VAR_S8_PICK"))
    return _build(case, q, k, v, options, name="triton-pick", table=table, tag="pick")
