"""One call of an attention kernel inside a CUDA profiler range, for Nsight Compute
(`ncu --profile-from-start off`; tools/gpu/ncu_kernels.sh runs it): the hardware
counters of our kernels beside cuDNN's, which no timing can give (issue 18: where the
backward's last 5% goes; issue 19: fp16 softcap against the dense forward).

    python tools/gpu/ncu_target.py bwd IMPL DTYPE HEAD_DIM N CAUSAL [HEADS]
    python tools/gpu/ncu_target.py fwd DTYPE HEAD_DIM N SOFTCAP [BATCH]

bwd: the standard suite's backward as `fa-bench run --mode bwd` times it
(tools/gpu/bwd_case.standard_bwd), warmed, then one call profiled. fwd: our forward,
causal, 32 q heads over 8 kv heads, softcap SOFTCAP (0: dense), warmed, then one call.
A developer tool, not installed.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _profiled(fn) -> None:
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


def _bwd(impl: str, dtype: str, head_dim: str, n: str, causal: str, heads: str = "") -> None:
    from bwd_case import standard_bwd

    closure, before, _keep = standard_bwd(
        impl, dtype, int(head_dim), int(n), causal == "yes", heads=int(heads) if heads else None
    )
    before()
    _profiled(closure)


def _fwd(dtype: str, head_dim: str, n: str, softcap: str, batch: str = "1") -> None:
    from fa_bench.kernels import flash_attention

    dt = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    gen = torch.Generator(device="cuda").manual_seed(0)
    shape = (int(batch), 32, int(n), int(head_dim))
    q = torch.randn(shape, device="cuda", dtype=dt, generator=gen)
    k, v = (torch.randn((shape[0], 8, *shape[2:]), device="cuda", dtype=dt, generator=gen)
            for _ in range(2))  # fmt: skip

    def call() -> None:
        flash_attention(q, k, v, causal=True, softcap=float(softcap))

    for _ in range(3):
        call()
    _profiled(call)


def main(argv: list[str]) -> int:
    kinds = {"bwd": _bwd, "fwd": _fwd}
    if not argv or argv[0] not in kinds:
        print(__doc__, file=sys.stderr)
        return 2
    kinds[argv[0]](*argv[1:])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
