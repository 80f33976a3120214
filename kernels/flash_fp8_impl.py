"""The `triton` implementation's fp8 (e4m3) forward cases: our fp8 kernel
(fa_bench.kernels.flash_fp8.flash_attention_fp8), with the case's per-tensor descales.

Called by kernels/triton_impl.py for `DType.FP8_E4M3` cases, with the config it chose
(`case_config`: a sweep's fields, or the tuning cache under dtype fp8_e4m3), or where
that is the heuristic, the fp8 kernel's own default (`flash_fp8.default_fp8_config`).
The inputs come from fa_bench.run.fp8_inputs: q, k, v already in float8_e4m3fn (V K-major,
made outside the timed span) and the descales in `options["fp8_descale"]`.
"""

from __future__ import annotations

import torch

from fa_bench.case import Case
from fa_bench.kernels.flash_config import FlashConfig
from fa_bench.registry import Prepared, Unsupported

# The key of a builder's `options` that holds the descales (fa_bench.run.fp8_inputs.OPTION:
# not imported, the kernels' adapters do not import the benchmark's run package).
DESCALE_OPTION = "fp8_descale"


def build(
    case: Case,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    options: dict | None,
    config: FlashConfig,
    name: str,
    source: str,
) -> Prepared:
    """The prepared fp8 forward of `case` with `config` (triton_impl's choice, from
    `source`); the backend label names the kernel that runs (the Gluon fp8 kernel's
    "gluon-<launch>" or the `tl` kernel's tiles: flash_fp8.fp8_kernel_choice) and the
    inputs' layout, "<name>:<kernel> (<source>); e4m3 per-tensor scales, V K-major (D, S)"."""
    from fa_bench.kernels.flash_fp8 import (
        default_fp8_config,
        flash_attention_fp8,
        fp8_kernel_choice,
    )
    from fa_bench.sweep.vocab import config_label

    if q.device.type != "cuda":
        # The interpreter rounds fp32 to e4m3 wrongly (a carry into the exponent is lost:
        # 125.2 gives 64; subnormals flush to 0; triton 3.9), so P's quantisation is wrong.
        raise Unsupported("the fp8 kernel runs on CUDA GPUs only (sm_89+), not the interpreter")
    descales = (options or {}).get(DESCALE_OPTION)
    if not descales:
        raise Unsupported(f"no fp8 descales in the builder's options[{DESCALE_OPTION!r}]")
    causal = case.causal
    if source == "heuristic":  # the fp8 kernel's own tiles (measured), not the bf16 ones
        config = default_fp8_config(q, k.shape[2], causal)

    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return flash_attention_fp8(q, k, v, causal=causal, config=config, **descales)

    fn(q, k, v)  # compile outside the timed span
    torch.cuda.synchronize(q.device)
    # the layout the case's inputs were given in (made outside the timed span), as decode's
    # backend names its cache layout
    layout = "e4m3 per-tensor scales, V K-major (D, S)"
    gluon = fp8_kernel_choice(q, k, v, causal, config)
    kernel = config_label(config, "fwd") if gluon is None else f"gluon-{gluon.label()}"
    return Prepared(fn=fn, backend=f"{name}:{kernel} ({source}); {layout}")
