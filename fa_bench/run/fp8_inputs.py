"""An fp8 (e4m3) case's inputs: the case's bf16 inputs, quantised per tensor.

Each of q, k, v is scaled by its own factor, scale = amax(|x|) / 448 (e4m3's largest
finite value), and rounded to float8_e4m3fn (`fa_bench.kernels.flash_fp8.quantize_fp8`).
The scales are recorded on the results record (`CaseRecord.fp8_scales`); the accuracy
reference is the attention of the dequantised inputs (x8 · scale), so the quantisation
of the inputs is the case's definition, not an error of the implementation.

V is handed over in the layout our fp8 kernel reads (K-major: each head stored
(head_dim, seqlen), see kernels/flash_fp8.py), made here, before preparation and outside
the timed span. Its shape is the SDPA (B, H, S, D) of q and k; only its strides differ.
An implementation that opts into fp8 (`dtypes=` of `registry.register`) gets the fp8
tensors as q, k, v and the descales in `options["fp8_descale"]` ({"q_descale",
"k_descale", "v_descale"}: fp32 tensors of one element on the device), so its builder
must take the `options` keyword.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fa_bench.case import Case, DType
from fa_bench.kernels.flash_fp8 import dequantize_fp8, fp8_v_layout, quantize_fp8

# The key of `options` (a builder's keyword) that carries the descales.
OPTION = "fp8_descale"


@dataclass(frozen=True)
class Fp8Inputs:
    """q, k, v in float8_e4m3fn (v K-major) and their fp32 one-element descales."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    q_descale: torch.Tensor
    k_descale: torch.Tensor
    v_descale: torch.Tensor

    def scales(self) -> dict[str, float]:
        """The per-tensor scales as plain floats, for the results record."""
        return {
            "q": float(self.q_descale.item()),
            "k": float(self.k_descale.item()),
            "v": float(self.v_descale.item()),
        }

    def descales(self) -> dict[str, torch.Tensor]:
        """The builder's `options[OPTION]`: flash_attention_fp8's keyword arguments."""
        return {"q_descale": self.q_descale, "k_descale": self.k_descale,
                "v_descale": self.v_descale}  # fmt: skip

    def dequantised(
        self, dtype: torch.dtype = torch.float32
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x8 · descale for q, k, v, in `dtype` (v back in the ordinary layout)."""
        return (
            dequantize_fp8(self.q, self.q_descale, dtype),
            dequantize_fp8(self.k, self.k_descale, dtype),
            dequantize_fp8(self.v, self.v_descale, dtype).contiguous(),
        )


def quantise_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Fp8Inputs:
    """Quantise a case's bf16 inputs per tensor; V in the fp8 kernel's K-major layout."""
    (q8, qd), (k8, kd), (v8, vd) = quantize_fp8(q), quantize_fp8(k), quantize_fp8(v)
    return Fp8Inputs(q8, k8, fp8_v_layout(v8), qd, kd, vd)


def with_descales(options: dict | None, inputs: Fp8Inputs) -> dict:
    """A builder's options with the descales added (a sweep's config fields kept)."""
    return {**(options or {}), OPTION: inputs.descales()}


def case_inputs(
    case: Case, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, options: dict | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict | None, Fp8Inputs | None]:
    """What a builder gets for `case` from `make_inputs`' tensors: unchanged for a 16-bit
    or fp32 case; for an fp8 case the quantised tensors, the options with the descales,
    and the Fp8Inputs (run/execute's accuracy check and record, sweep/precompile)."""
    if case.dtype is not DType.FP8_E4M3:
        return q, k, v, options, None
    fp8 = quantise_inputs(q, k, v)
    return fp8.q, fp8.k, fp8.v, with_descales(options, fp8), fp8
