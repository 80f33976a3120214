"""Write a tuning cache that forces our Triton kernel onto small tiles: a deliberately
slowed config, to show that `fa-bench compare` catches a real slowdown.

    python tests/slow_tuning.py OUT.json [--gpu NAME]   # NAME: default this machine's GPU,
                                                        # or "cpu" without one
    FA_BENCH_TUNING_CACHE=OUT.json fa-bench run ... -i triton

The cache (fa_bench.sweep.tuning, schema fa-bench-tuning/1) covers every dtype, head_dim of
the built-in suites, causal flag, mode and seqlen bucket, so every triton case takes it
where its kernels read tiles: on sm_90 `triton`'s Gluon forward (where it is preferred)
and default backward have launches of their own, so GPU gates slow `triton-deterministic`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from fa_bench.sweep.tuning import BUCKET_EDGES, SCHEMA, seqlen_bucket

HEAD_DIMS = (16, 32, 40, 64, 96, 128, 256)


def slow_entries(
    gpu: str,
    *,
    block_m: int = 16,
    block_n: int = 16,
    dtypes: tuple[str, ...] = ("fp32", "fp16", "bf16"),
    head_dims: tuple[int, ...] = HEAD_DIMS,
) -> list[dict]:
    configs = {
        "fwd": {"block_m": block_m, "block_n": block_n, "num_warps": 4, "num_stages": 1},
        "bwd": {"bwd_block_m": block_m, "bwd_block_n": block_n, "bwd_num_warps": 4,
                "bwd_num_stages": 1},
    }  # fmt: skip
    return pinned_entries(gpu, configs, dtypes=dtypes, head_dims=head_dims)


def pinned_entries(
    gpu: str,
    configs: dict[str, dict],
    *,
    dtypes: tuple[str, ...] = ("fp32", "fp16", "bf16"),
    head_dims: tuple[int, ...] = HEAD_DIMS,
) -> list[dict]:
    """Cache entries that pin `configs` ({mode: fields}) for every causal flag and seqlen
    bucket of these dtypes and head dims."""
    buckets = [seqlen_bucket(e) for e in BUCKET_EDGES] + [seqlen_bucket(BUCKET_EDGES[-1] + 1)]
    return [
        {
            "gpu": gpu,
            "dtype": dtype,
            "head_dim": d,
            "causal": causal,
            "mode": mode,
            "seqlen_bucket": bucket,
            "config": config,
        }
        for dtype in dtypes
        for d in head_dims
        for causal in (False, True)
        for mode, config in configs.items()
        for bucket in buckets
    ]


def write_slow_cache(path: Path, gpu: str, **kwargs: object) -> Path:
    doc = {"schema": SCHEMA, "entries": slow_entries(gpu, **kwargs)}
    Path(path).write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    return Path(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--gpu", help="GPU name as torch reports it (default: GPU 0, or cpu)")
    parser.add_argument("--block", type=int, default=16, help="block_m = block_n (default 16)")
    args = parser.parse_args()
    gpu = args.gpu
    if gpu is None:
        import torch

        gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    write_slow_cache(args.out, gpu, block_m=args.block, block_n=args.block)
    print(f"{args.out}: triton forced to {args.block}x{args.block} tiles on {gpu!r}")


if __name__ == "__main__":
    main()
