"""A --plugin for tests/test_peers.py: fake peer packages (tests/peer_fakes.py) in this
process, and each real peer adapter's builder registered again as `<name>-fake` for the
CPU, so `fa-bench run -i fa4-fake` drives our adapter code through the worker, the
accuracy check and the timing. Not the real kernels: see tests/peer_fakes.py."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/, for peer_fakes
import peer_fakes

from fa_bench.kernels import fa4_impl, flash_attn_impl, xformers_impl
from fa_bench.registry import register

peer_fakes.install()

for _name, _adapter in (("fa4", fa4_impl), ("flash-attn", flash_attn_impl),
                        ("xformers", xformers_impl)):  # fmt: skip
    register(
        f"{_name}-fake",
        description=f"our {_name} adapter over a fake package (tests/peer_fakes.py)",
        dtypes=("fp32",),
        devices=("cpu",),
        check=getattr(_adapter, "_check", None),
    )(_adapter.build)
