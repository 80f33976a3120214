"""An fa-bench plugin for issue 19's session 7 A/B through `fa-bench run`: our `triton`
implementation with a softcap candidate switched on around each of its calls, so one run
times the default and the candidate side by side (same process, same clocks):

- `triton-sum`: the softcap's row sums from the bf16 P in packed adds
  (flash_gluon_varhost.SOFTCAP_SUM_BF16, kernels/flash_gluon_var_sum.py);
- `triton-nopp`: the variant launch without the ping-pong (the `gluon_pingpong` field);
- `triton-sum-nopp`: both;
- `triton-s6`: session 6's softcap (fp32 row sums, F2FP), whatever the defaults now are.

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
def _switches(values: dict[str, bool]) -> Iterator[None]:
    """flash_gluon_varhost's switches set to `values`, the old ones back after."""
    saved = {n: getattr(vh, n) for n in values}
    for n, on in values.items():
        setattr(vh, n, on)
    try:
        yield
    finally:
        for n, on in saved.items():
            setattr(vh, n, on)


def _sum_bf16(on: bool) -> contextlib.AbstractContextManager[None]:
    return _switches({"SOFTCAP_SUM_BF16": on})


def _build(case, q, k, v, options, *, name: str, switches: dict[str, bool], pingpong: bool,
           tag: str) -> Prepared:  # fmt: skip
    """triton's builder (compiling outside the timed span) with the candidate's switches."""
    if not pingpong:
        config = dict((options or {}).get("config") or {}, forward="gluon", gluon_pingpong=False)
        options = dict(options or {}, config=config)
    with _switches(switches):
        prep = triton_impl._prepare(case, q, k, v, options, deterministic=True, name=name)
    fn = prep.fn

    def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        with _switches(switches):
            return fn(q, k, v)

    return Prepared(run, backend=f"{prep.backend} [{tag}]")


_KW: dict = dict(
    modes=("fwd",), dtypes=("fp16", "bf16"), devices=("cuda",), check=triton_impl._check
)
_SUM = {"SOFTCAP_SUM_BF16": True}
# session 6's softcap (FIXED_MAX + QSCALE, fp32 row sums, F2FP), whatever the defaults now
_S6 = {"SOFTCAP_SUM_BF16": False, "SOFTCAP_P_ALU": False}


@register("triton-sum", description="triton, softcap row sums in packed bf16 adds", **_KW)
def triton_sum(case, q, k, v, options=None) -> Prepared:
    return _build(case, q, k, v, options, name="triton-sum", switches=_SUM, pingpong=True,
                  tag="sum-bf16")  # fmt: skip


@register("triton-nopp", description="triton, the variant launch without ping-pong", **_KW)
def triton_nopp(case, q, k, v, options=None) -> Prepared:
    return _build(case, q, k, v, options, name="triton-nopp", switches={}, pingpong=False,
                  tag="nopp")  # fmt: skip


@register("triton-sum-nopp", description="triton-sum without ping-pong", **_KW)
def triton_sum_nopp(case, q, k, v, options=None) -> Prepared:
    return _build(case, q, k, v, options, name="triton-sum-nopp", switches=_SUM,
                  pingpong=False, tag="sum-bf16+nopp")  # fmt: skip


@register("triton-s6", description="triton with session 6's softcap (the A/B's baseline)", **_KW)
def triton_s6(case, q, k, v, options=None) -> Prepared:
    return _build(case, q, k, v, options, name="triton-s6", switches=_S6, pingpong=True,
                  tag="session 6")  # fmt: skip
