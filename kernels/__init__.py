"""Attention implementations behind one registry: the references (naive, SDPA backends,
FlexAttention) and our Triton FlashAttention. Importing this package registers them all;
nothing touches a device at import."""

from fa_bench.kernels import reference, triton_impl  # noqa: F401  (register the impls)
from fa_bench.kernels.flash_attention import flash_attention
from fa_bench.kernels.flash_config import FlashConfig

__all__ = ["FlashConfig", "flash_attention"]
