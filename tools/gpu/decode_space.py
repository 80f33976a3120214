"""The search space of tools/gpu/decode_tune.py: the shapes, the candidate launches of our
decode kernel, the inputs, and the parallel precompile of the candidates' kernels.

Shapes: Llama-3-8B-like heads (32 query / 8 KV heads, D 128, bf16), equal context
lengths; batch 1 x 32k and 128k, batch 8 x 8k and 32k, batch 64 x 8k, batch 256 x 4k,
batch 1 x 8k;
contiguous and pages of 16, 64, 256; Sq 1 (all) and 4 (contiguous and page 64).

Candidates, by phase (decode_tune.py runs them in this order, within its time budget):
1. for every Sq-1 shape, a grid of (block_n, num_warps, num_stages) at the split count
   the heuristic gives for that block_n. A paged cache's grid has two more stages: the
   block-table load feeding the K/V addresses takes two pipeline stages (triton 3.6's
   pipeliner, seen in the sm_90 TTGIR: at num_stages 3 and 4 a paged program keeps one
   K/V buffer, at 5 two), so its K/V loads are double-buffered from 5 on;
2. the best three configs of phase 1 over the shape's split counts, contiguous runs and
   (contiguous caches) interleaved splits;
3. every Sq-4 shape: phase 2's best three of its Sq-1 twin at their split counts.

A development tool, not installed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

HQ, HKV, D = 32, 8, 128
# The inputs' device and dtype (a CPU smoke test of the tool sets cpu / float32).
DEVICE, DTYPE = "cuda", "bfloat16"
# b1 x 8k: the first H200 run's slowest case (176 GB/s contiguous against 509 paged, 32
# splits of 4 blocks each 512 KB apart), though it fits in L2 when not flushed
CONTEXTS = (
    (1, 32768), (1, 131072), (8, 8192), (8, 32768), (64, 8192), (256, 4096), (1, 8192),
)  # fmt: skip
PAGES = (0, 16, 64, 256)
SQ4_PAGES = (0, 64)

# (block_n, num_warps, num_stages)
CONTIG_GRID = (
    (32, 4, 4), (32, 4, 6), (64, 4, 2), (64, 4, 3), (64, 4, 4), (64, 8, 3), (64, 8, 4),
    (128, 4, 2), (128, 4, 3), (128, 8, 2), (128, 8, 3), (256, 8, 2),
)  # fmt: skip
PAGED_GRID = (
    (32, 4, 5), (32, 4, 6), (64, 4, 3), (64, 4, 5), (64, 4, 6), (64, 8, 5),
    (128, 4, 4), (128, 4, 5), (128, 8, 5), (256, 8, 4),
)  # fmt: skip
MAX_SPLITS = 128  # decode_config.MAX_SPLITS
SPLIT_STEPS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 33, 48, 66, 99, 128)


@dataclass(frozen=True)
class Shape:
    batch: int
    ctx: int
    page: int  # 0: contiguous
    sq: int = 1

    @property
    def label(self) -> str:
        cache = "contig" if self.page == 0 else f"page{self.page}"
        return f"b{self.batch} ctx{self.ctx // 1024}k {cache} sq{self.sq}"


@dataclass(frozen=True)
class Cand:
    """One launch: a DecodeConfig's fields and the split count."""

    block_n: int
    num_warps: int
    num_stages: int
    interleave: bool
    splits: int

    @property
    def label(self) -> str:
        order = " inter" if self.interleave else ""
        return f"bn{self.block_n} w{self.num_warps} s{self.num_stages} x{self.splits}{order}"


def shapes_sq1() -> list[Shape]:
    return [Shape(b, n, p) for b, n in CONTEXTS for p in PAGES]


def shapes_sq4() -> list[Shape]:
    return [Shape(b, n, p, 4) for b, n in CONTEXTS for p in SQ4_PAGES]


def programs(shape: Shape) -> int:
    """(sequence, KV head, row block) programs per split: GROUP · Sq = 4 or 16 rows fit
    one row block of up to 64."""
    return shape.batch * HKV


def heuristic_splits(shape: Shape, block_n: int, sms: int, stages: int) -> int:
    from fa_bench.kernels.decode_config import Tile, choose_num_splits

    tile = Tile(16, D, 4 if DTYPE == "float32" else 2, shape.page > 0)
    return choose_num_splits(programs(shape), shape.ctx, block_n, sms, tile, stages)


def phase1(shape: Shape, sms: int) -> list[Cand]:
    grid = CONTIG_GRID if shape.page == 0 else PAGED_GRID
    return [
        Cand(bn, w, s, False, heuristic_splits(shape, bn, sms, s))
        for bn, w, s in grid
        if shape.page == 0 or shape.page % bn == 0 or bn % shape.page == 0
    ]


def split_counts(shape: Shape, block_n: int, sms: int) -> list[int]:
    """Split counts worth timing: at least half a wave of programs, at most 16 programs
    per SM, at least two key blocks per split."""
    p, blocks = programs(shape), math.ceil(shape.ctx / block_n)
    return [
        s for s in SPLIT_STEPS if p * s * 2 >= sms and p * s <= 16 * sms and blocks >= 2 * s
    ] or [1]


def phase2(shape: Shape, best: list[Cand], sms: int) -> list[Cand]:
    out = []
    for c in best:
        for s in split_counts(shape, c.block_n, sms):
            for inter in (False, True) if shape.page == 0 and s > 1 else (False,):
                out.append(Cand(c.block_n, c.num_warps, c.num_stages, inter, s))
    return out


def compile_keys(shape: Shape, c: Cand) -> tuple[tuple, tuple]:
    """What decides the compiled code of the split kernel (the layout, Sq, the config,
    whether it splits) and of the combine kernel (the split count's class: its padded
    count and triton's divisibility-by-16 specialisation of it; none for one split)."""
    split = c.splits > 1
    kernel = (shape.page, shape.sq, c.block_n, c.num_warps, c.num_stages, c.interleave, split)
    combine = (2 ** math.ceil(math.log2(c.splits)), c.splits % 16 == 0) if split else ()
    return kernel, combine


# ---------------------------------------------------------------------------------------
# Inputs


def make_inputs(shape: Shape, device: str | None = None) -> dict:
    """q (B, Sq, Hq, D); the cache contiguous (B, S, Hkv, D) or paged with a shuffled
    block table; cache_seqlens all S; and SDPA's dense (B, Hkv, S, D) copy."""
    import torch

    device = device or DEVICE
    g = torch.Generator(device=device).manual_seed(0)
    b, s, dt = shape.batch, shape.ctx, getattr(torch, DTYPE)
    q = torch.randn(b, shape.sq, HQ, D, device=device, dtype=dt, generator=g)
    k = torch.randn(b, s, HKV, D, device=device, dtype=dt, generator=g)
    v = torch.randn(b, s, HKV, D, device=device, dtype=dt, generator=g)
    out = {
        "q": q,
        "seqlens": torch.full((b,), s, dtype=torch.int32, device=device),
        "k_dense": k.transpose(1, 2).contiguous(),
        "v_dense": v.transpose(1, 2).contiguous(),
        "table": None,
    }
    if shape.page:
        n = b * s // shape.page
        perm = torch.randperm(n, device=device, generator=g)
        out["k"] = torch.empty((n, shape.page, HKV, D), device=device, dtype=dt)
        out["v"] = torch.empty_like(out["k"])
        out["k"][perm] = k.view(n, shape.page, HKV, D)
        out["v"][perm] = v.view(n, shape.page, HKV, D)
        out["table"] = perm.to(torch.int32).view(b, s // shape.page).contiguous()
        del k, v
    else:
        out["k"], out["v"] = k, v
    return out


def call(inputs: dict, c: Cand | None, check_values: bool = False):
    """Our kernel on `inputs` with launch `c` (None: the heuristic's)."""
    from fa_bench.kernels.decode_attention import DecodeConfig, decode_attention

    cfg = None if c is None else DecodeConfig(c.block_n, c.num_warps, c.num_stages, c.interleave)
    return decode_attention(
        inputs["q"], inputs["k"], inputs["v"], cache_seqlens=inputs["seqlens"],
        block_table=inputs["table"], num_splits=None if c is None else c.splits,
        config=cfg, check_values=check_values,
    )  # fmt: skip


def precompile_one(job: tuple[Shape, Cand]) -> str | None:
    """Compile (and run once) `job`'s kernels on a small problem that triton specialises
    exactly as the real one (the same strides, heads and divisibilities: one sequence of
    4096 keys, 16 · 256, so a paged table's row stride is a multiple of 16 as in every
    tuned shape). Fills triton's on-disk cache for the main process. The error, or None."""
    shape, c = job
    try:
        small = Shape(1, 4096, shape.page, shape.sq)
        call(make_inputs(small), c)
        return None
    except Exception as exc:  # recorded: a config may exceed shared memory
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"


def precompile(jobs: list[tuple[Shape, Cand]], workers: int) -> dict:
    """Compile every distinct compile key of `jobs` in `workers` processes; {key: error}
    for those that failed."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    unique: dict[tuple, tuple[Shape, Cand]] = {}
    combines: set[tuple] = set()
    for shape, c in jobs:
        kernel, combine = compile_keys(shape, c)
        if kernel not in unique or combine not in combines:
            # a job whose split kernel or combine class is new (a repeated kernel key is
            # kept under its combine class, so each combine class is compiled too)
            unique[kernel if kernel not in unique else (kernel, combine)] = (shape, c)
            combines.add(combine)
    with ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as pool:
        errors = list(pool.map(precompile_one, unique.values(), chunksize=2))
    return {key: err for key, err in zip(unique, errors, strict=True) if err}
