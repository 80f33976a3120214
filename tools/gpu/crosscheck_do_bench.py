"""Cross-check fa-bench's timing against triton.testing.do_bench on the H200.

Runs `fa-bench run` for one case (sdpa-cudnn, bf16, head_dim 128, N=16k, non-causal,
forward: the issue's anchor), then times the same call with do_bench (median, L2
flushed by do_bench itself) and prints both. Exit 1 when they differ by more than 5%.

    python tools/gpu/crosscheck_do_bench.py OUT_DIR
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

N, HEADS, D = 16384, 16, 128
FLOPS = 4 * HEADS * N * N * D  # batch 1 (16k tokens), non-causal


def main(out: Path) -> int:
    import torch
    import torch.nn.functional as F
    import triton
    from torch.nn.attention import SDPBackend, sdpa_kernel

    subprocess.run(
        ["fa-bench", "run", "-s", "standard", "-i", "sdpa-cudnn", "--dtype", "bf16",
         "--head-dim", str(D), "--seqlen", str(N), "--no-causal", "--mode", "fwd",
         "--no-report", "--no-telemetry", "--out", str(out)],
        check=True,
    )  # fmt: skip
    case = json.loads((out / "results.json").read_text())["cases"][0]
    fa_ms = case["latency_ms"]["median"]
    q, k, v = (torch.randn(1, HEADS, N, D, device="cuda", dtype=torch.bfloat16) for _ in "qkv")

    def call() -> torch.Tensor:
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v)

    db_ms = triton.testing.do_bench(call, warmup=100, rep=1000, return_mode="median")
    ratio = fa_ms / db_ms
    print(
        f"XCHECK sdpa-cudnn bf16 d{D} N={N} fwd: fa-bench median {fa_ms:.4f} ms "
        f"({FLOPS / fa_ms / 1e9:.1f} TFLOP/s, n={case['latency_ms']['n']}), "
        f"do_bench median {db_ms:.4f} ms ({FLOPS / db_ms / 1e9:.1f} TFLOP/s), "
        f"ratio {ratio:.4f}"
    )
    return 0 if abs(ratio - 1) <= 0.05 else 1


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
