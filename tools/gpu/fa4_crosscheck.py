"""fa-bench's fa4 figures against `triton.testing.do_bench` on the same GPU (issue 17).

The anchors file timed FA4 with do_bench on another H200 on another day; a difference of
a few percent from fa-bench can be the chip as well as the timer. This times the anchor
shapes both ways in one call on one GPU: `fa-bench run` for fa4 (bf16, the anchors' B =
16384 / N, H = 2048 / D), then do_bench (median, its own L2 flush) of the same
`flash_attn_func` forward and of its backward (`torch.autograd.grad` with retain_graph).
Prints a Markdown table and exits 1 when a ratio is off by more than 5%.

    python tools/gpu/fa4_crosscheck.py OUT_DIR
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SHAPES = [(64, 1024, False), (64, 4096, False), (64, 16384, False), (64, 4096, True),
          (64, 16384, True), (128, 1024, False), (128, 4096, False), (128, 16384, False),
          (128, 1024, True), (128, 4096, True), (128, 16384, True)]  # fmt: skip


def flops(d: int, n: int, causal: bool, mode: str) -> float:
    b, h = 16384 // n, 2048 // d
    f = 4 * b * h * n * n * d * (0.5 if causal else 1.0)
    return f * (2.5 if mode == "bwd" else 1.0)


def fa_bench(out: Path) -> dict:
    seqlens = sorted({n for _, n, _ in SHAPES})
    cmd = ["fa-bench", "run", "-s", "standard", "-i", "fa4", "--dtype", "bf16",
           "--no-report", "--out", str(out)] + [f"--seqlen={n}" for n in seqlens]  # fmt: skip
    subprocess.run(cmd, check=True)
    doc = json.loads((out / "results.json").read_text())
    return {
        (c["head_dim"], c["seqlen_q"], c["causal"], c["mode"]): c["latency_ms"]["median"]
        for c in doc["cases"]
        if c["status"] == "ok"
    }


def do_bench_ms(d: int, n: int, causal: bool, mode: str) -> float:
    import torch
    import triton
    from flash_attn.cute import flash_attn_func

    b, h = 16384 // n, 2048 // d
    q, k, v = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in "qkv")  # fmt: skip
    if mode == "fwd":
        with torch.no_grad():
            return triton.testing.do_bench(lambda: flash_attn_func(q, k, v, causal=causal),
                                           return_mode="median")  # fmt: skip
    out = flash_attn_func(q, k, v, causal=causal)
    out = out[0] if isinstance(out, tuple) else out
    dout = torch.randn_like(out)
    return triton.testing.do_bench(
        lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True),
        return_mode="median",
    )


def main(out: Path) -> int:
    ours = fa_bench(out)
    print("| D | N | causal | mode | fa-bench TFLOP/s | do_bench TFLOP/s | ratio |")
    print("|---|---|---|---|---|---|---|")
    bad = 0
    for d, n, causal in SHAPES:
        for mode in ("fwd", "bwd"):
            key = (d, n, causal, mode)
            if key not in ours:
                print(f"| {d} | {n} | {causal} | {mode} | missing | | |")
                bad += 1
                continue
            db = do_bench_ms(*key)
            f = flops(*key)
            ratio = db / ours[key]  # > 1: fa-bench reads faster than do_bench
            bad += abs(ratio - 1) > 0.05
            print(f"| {d} | {n // 1024}k | {'yes' if causal else 'no'} | {mode} | "
                  f"{f / ours[key] / 1e9:.0f} | {f / db / 1e9:.0f} | {ratio:.3f} |")  # fmt: skip
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
