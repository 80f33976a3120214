"""Our Triton FlashAttention as a library: `flash_attention` and its `FlashConfig`, and
`decode_attention` (split-KV decoding against a contiguous or paged KV cache), and
`flash_attention_fp8` (the fp8 e4m3 forward, kernels/flash_fp8.py).

Importing this package is cheap and decides nothing: it imports torch but not triton,
touches no device and defines no kernel. The first call of `flash_attention` imports
triton and defines the `@triton.jit` kernels (flash_kernels.py); whether triton
interprets them (TRITON_INTERPRET=1, the only way to run them on a CPU) is fixed when
triton is first imported in the process. So on a machine without a GPU set
TRITON_INTERPRET=1 before the first call (before or after importing this package) and
before anything else imports triton.

The registry adapters (reference.py: naive, SDPA backends, FlexAttention; triton_impl.py:
`triton`) are imported by `fa_bench.registry.load`, not here: the library does not need
the benchmark to be importable.
"""

from fa_bench.kernels.decode_attention import decode_attention
from fa_bench.kernels.flash_attention import flash_attention
from fa_bench.kernels.flash_config import FlashConfig
from fa_bench.kernels.flash_fp8 import flash_attention_fp8
from fa_bench.kernels.flash_varlen import flash_attention_varlen

__all__ = [
    "FlashConfig",
    "decode_attention",
    "flash_attention",
    "flash_attention_fp8",
    "flash_attention_varlen",
]
