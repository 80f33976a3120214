"""An fa-bench plugin for issue 19's session 7 A/B through `fa-bench run`: our `triton`
implementation with a softcap candidate switched on around each of its calls, so one run
times the default and the candidate side by side (same process, same clocks):

- `triton-sum`: the softcap's row sums from the bf16 P in packed adds
  (flash_gluon_varhost.SOFTCAP_SUM_BF16, kernels/flash_gluon_var_sum.py);
- `triton-nopp`: the variant launch without the ping-pong (the `gluon_pingpong` field);
- `triton-sum-nopp`: both.

    fa-bench run --plugin tools/gpu/variants_gluon_s7_plugin.py \
        -s tools/gpu/variants_gluon_s7.toml -i triton -i triton-sum

Dense cases run the same kernel as `triton` (the switch touches variant launches only;
the ping-pong field applies to both, so a control and its variant match). A developer
tool, not installed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from fa_bench.kernels import flash_gluon_varhost as vh
from fa_bench.kernels import triton_impl
from fa_bench.registry import Prepared, register


@contextlib.contextmanager
def _sum_bf16(on: bool) -> Iterator[None]:
    saved = vh.SOFTCAP_SUM_BF16
    vh.SOFTCAP_SUM_BF16 = on
    try:
        yield
    finally:
        vh.SOFTCAP_SUM_BF16 = saved


def _build(case, q, k, v, options, *, name: str, sum_bf16: bool, pingpong: bool) -> Prepared:
    """triton's builder (compiling outside the timed span) with the candidate on."""
    if not pingpong:
        config = dict((options or {}).get("config") or {}, forward="gluon", gluon_pingpong=False)
        options = dict(options or {}, config=config)
    with _sum_bf16(sum_bf16):
        prep = triton_impl._prepare(case, q, k, v, options, deterministic=True, name=name)
    fn = prep.fn

    def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        with _sum_bf16(sum_bf16):
            return fn(q, k, v)

    tag = "+".join(t for t, on in (("sum-bf16", sum_bf16), ("nopp", not pingpong)) if on)
    return Prepared(run, backend=f"{prep.backend} [{tag}]")


_KW: dict = dict(
    modes=("fwd",), dtypes=("fp16", "bf16"), devices=("cuda",), check=triton_impl._check
)


@register("triton-sum", description="triton, softcap row sums in packed bf16 adds", **_KW)
def triton_sum(case, q, k, v, options=None) -> Prepared:
    return _build(case, q, k, v, options, name="triton-sum", sum_bf16=True, pingpong=True)


@register("triton-nopp", description="triton, the variant launch without ping-pong", **_KW)
def triton_nopp(case, q, k, v, options=None) -> Prepared:
    return _build(case, q, k, v, options, name="triton-nopp", sum_bf16=False, pingpong=False)


@register("triton-sum-nopp", description="triton-sum without ping-pong", **_KW)
def triton_sum_nopp(case, q, k, v, options=None) -> Prepared:
    return _build(case, q, k, v, options, name="triton-sum-nopp", sum_bf16=True, pingpong=False)
