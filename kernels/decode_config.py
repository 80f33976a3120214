"""Launch parameters of the decode kernel (fa_bench.kernels.decode_attention) and the
heuristic that picks them.

A `DecodeConfig` fixes any of the split kernel's launch parameters; a field left None
is the heuristic's:

- `block_n`: keys per block, a power of two from 16 to 256. For a paged cache it either
  divides page_size (the block lies in one page: one block-table read per block) or is a
  multiple of it (the block covers whole pages: each key row reads its page's entry);
- `num_warps` (1, 2, 4, 8 or 16) and `num_stages` (1 to 8: the software pipeline's depth,
  how many key/value blocks each program has in flight);
- `interleave`: how the splits of a sequence share its key blocks: runs of consecutive
  blocks (False), or every num_splits-th block (True);
- `fused_combine`: with several splits, the last split program of each (sequence, KV
  head, row block) to finish merges the splits (True: one launch), or a combine kernel
  does, launched after the split kernel (False);
- `pdl`: with the combine kernel, launch it by programmatic dependent launch (sm_90 and
  up; the split kernel lets it start at once, it waits on the split grid on the GPU), so
  its launch and start-up overlap the split kernel instead of following it;
- `merge_tile` (session 8): the combine merges a (sequence, KV head, row block)'s rows
  at once, every split's partials in flight together (fa_bench.kernels.decode_merge):
  in the fused combine's last program, or in a combine kernel of one program per row
  block; else row by row (one combine program per output row, or the fused program's
  loop over its rows);
- `one_loop`: every key block of a split goes through the masked block loop (one
  software-pipelined loop), instead of the blocks every row sees whole through an
  unmasked loop and the rest (the causal diagonal of Sq > 1, a ragged length's last
  block) through a second one, whose pipeline starts again after the first drains;

and `num_splits` (decode_attention's own argument) the split count. `resolve` turns a
config, the problem and the SM count into a complete `Launch`.

The heuristic (`heuristic_block_n`, `choose_num_splits`, the defaults below) is a fixed
rule, not an autotuner: nothing is timed at run time. docs/kernel.md ("Decoding") says
which measurement each choice rests on; tools/gpu/decode_tune.py makes them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from fa_bench.kernels.decode_rules import deeper, one_loop_default
from fa_bench.kernels.decode_splits import (  # noqa: F401  (re-exported: tests, tools)
    _MAX_SLOTS,
    MAX_SPLITS,
    Tile,
    _cdiv,
    choose_num_splits,
    kv_buffers,
    slots,
    smem_bytes,
)
from fa_bench.kernels.flash_config import pad_pow2

# Rows (token, head pairs) per program: 64 rows of fp32 accumulators at d256 still fit.
_MAX_ROWS = 64
_WARPS = (1, 2, 4, 8, 16)
_MAX_STAGES = 8
_MIN_BLOCK_N, _MAX_BLOCK_N = 16, 256

# The heuristic (docs/kernel.md "Decoding" says which H200 measurement each rests on).
_NUM_WARPS = 4
_INTERLEAVE = False  # interleaved splits measured within 1% of runs everywhere
# The combine as a second kernel: on the H200 (session 5, call B) the fused combine was
# 3-7 us slower on every shape with splits (batch 1 x 32k: 48.2 against 41.5 us; batch 8 x
# 8k: 75.7 against 70.4): its last program merges the rows one by one, each waiting on
# the L2, where the combine kernel (3.6 us with its launch) merges them all at once.
_FUSED_COMBINE = False
# The combine kernel by programmatic dependent launch (sm_90 and up; elsewhere, and in
# the interpreter, the plain launch): on the H200 (session 6, call B,
# tools/gpu/decode_s6_ab.py) the combine added 4.0 us to batch 8 x 8k's split kernel
# (70.4 against 66.4 us) and 2.9 us with PDL (69.8): 0.6-1.0 us less per call on all four
# shapes tried (contiguous, pages 64 and 256), bit for bit the same output.
_PDL = True
# Two block loops (unmasked, then masked) unless measured otherwise (session 7, call 1).
_ONE_LOOP = False
# The tile merge's field default (None in DecodeConfig follows `_COMBINE`'s rule).
_MERGE_TILE = False
# How the splits are merged, by name: (fused_combine, merge_tile), or a rule of the split
# count. `_COMBINE` is the heuristic's; $FA_BENCH_DECODE_COMBINE overrides it (a GPU
# script's in-process pick, as $FA_BENCH_GLUON_BWD_ROLE does for the Gluon backward); a
# DecodeConfig's set fields still win.
COMBINE_ENV = "FA_BENCH_DECODE_COMBINE"
FEW = "fused-tile-few"
COMBINES: dict[str, tuple[bool, bool] | None] = {
    "rows": (False, False),  # combine kernel, one program per output row
    "tile": (False, True),  # combine kernel, one program per row block
    "fused-rows": (True, False),  # the last split program, row by row (session 5)
    "fused-tile": (True, True),  # the last split program, the row block at once
    # fused-tile where the merge loads every split at once (one chunk: 8 splits at 16
    # rows), else rows (many splits: a loop of chunks, one L2 round trip each)
    FEW: None,
}
# Session 9, call 1 on the H200 (tools/gpu/decode_s8.sh MODE=targets AB_S=30, the A/B of
# tools/gpu/decode_s8_ab.py): fused-tile-few at 1.030 x rows' speed (geometric mean over
# the six batch-8 x 8k shapes, the worst 1.010), the tile merge by a kernel 0.994 (0.86 at
# batch 1 x 32k, 32 splits, which `FEW` leaves to rows).
_COMBINE = FEW
# Contiguous: 64-key blocks; 3 stages (two K/V blocks in flight) while few programs share
# the GPU, 2 (one in flight, more programs per SM) once programs are at least a quarter
# of the SMs.
_CONTIG_BLOCK_N = 64
_CONTIG_STAGES_FEW, _CONTIG_STAGES_MANY = 3, 2
# Paged: 5 stages (the table read takes two, so two K/V blocks in flight); 32-key blocks
# (two pages of 16 per block), 64 from a 64k capacity on. With programs for two full
# waves of the SMs (batch 256 at 8 KV heads), 64-key blocks and 3 stages (one block in
# flight, so less shared memory per program).
_PAGED_STAGES, _PAGED_STAGES_MANY = 5, 3
_PAGED_BLOCK_N, _PAGED_BLOCK_N_LONG, _LONG_CONTEXT = 32, 64, 65536
_MANY_WAVES = 2
# (Session 6 tried 64-key blocks at 4 stages for paged batch 8 from 8k: call B measured
# them 0.6-0.7 us faster at pages 64 and 256, call C 1.1% slower at 8k x 32k page 64 and,
# with the PDL combine, 3 us slower at 8k page 64 (74.9 against 71.9 us; fa-bench run
# 0.85 x copy): not taken. docs/kernel.md, "Decoding".)


@dataclass(frozen=True)
class DecodeConfig:
    """Launch parameters of the split kernel; None: the heuristic's choice."""

    block_n: int | None = None
    num_warps: int | None = None
    num_stages: int | None = None
    interleave: bool | None = None
    fused_combine: bool | None = None
    pdl: bool | None = None
    one_loop: bool | None = None
    merge_tile: bool | None = None


@dataclass(frozen=True)
class Launch:
    """A complete launch: every parameter fixed."""

    block_n: int
    num_warps: int
    num_stages: int
    interleave: bool
    num_splits: int
    fused_combine: bool = _FUSED_COMBINE  # (no effect with one split)
    pdl: bool = _PDL  # (only with the combine kernel, on sm_90 and up)
    one_loop: bool = _ONE_LOOP
    merge_tile: bool = _MERGE_TILE  # (no effect with one split)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_config(config: object, page_size: int | None) -> None:
    """ValueError naming the field and its value where `config` is not a DecodeConfig
    whose set fields are valid for a cache with `page_size` (None: contiguous)."""
    if config is None:
        return
    if not isinstance(config, DecodeConfig):
        raise ValueError(f"config must be a DecodeConfig or None, got {type(config).__name__}")
    bn = config.block_n
    if bn is not None:
        if not _is_int(bn) or bn & (bn - 1) or not _MIN_BLOCK_N <= bn <= _MAX_BLOCK_N:
            raise ValueError(
                f"config.block_n must be a power of two from {_MIN_BLOCK_N} to "
                f"{_MAX_BLOCK_N}, got {bn!r}"
            )
        if page_size is not None and page_size % bn and bn % page_size:
            raise ValueError(
                f"config.block_n {bn} must divide page_size {page_size} or be a multiple of it"
            )
    if config.num_warps is not None and (
        not _is_int(config.num_warps) or config.num_warps not in _WARPS
    ):
        raise ValueError(f"config.num_warps must be one of {_WARPS}, got {config.num_warps!r}")
    if config.num_stages is not None and (
        not _is_int(config.num_stages) or not 1 <= config.num_stages <= _MAX_STAGES
    ):
        raise ValueError(
            f"config.num_stages must be an integer from 1 to {_MAX_STAGES}, "
            f"got {config.num_stages!r}"
        )
    if config.interleave is not None and not isinstance(config.interleave, bool):
        raise ValueError(f"config.interleave must be a bool or None, got {config.interleave!r}")
    fused = config.fused_combine
    if fused is not None and not isinstance(fused, bool):
        raise ValueError(f"config.fused_combine must be a bool or None, got {fused!r}")
    if config.pdl is not None and not isinstance(config.pdl, bool):
        raise ValueError(f"config.pdl must be a bool or None, got {config.pdl!r}")
    if config.one_loop is not None and not isinstance(config.one_loop, bool):
        raise ValueError(f"config.one_loop must be a bool or None, got {config.one_loop!r}")
    if config.merge_tile is not None and not isinstance(config.merge_tile, bool):
        raise ValueError(f"config.merge_tile must be a bool or None, got {config.merge_tile!r}")


def block_n_for(page_size: int | None, capacity: int = 0, many: bool = False) -> int:
    """The heuristic's keys per block: `_CONTIG_BLOCK_N` for a contiguous cache (page_size
    None); for a paged one `_PAGED_BLOCK_N` (`_PAGED_BLOCK_N_LONG` from a `_LONG_CONTEXT`
    capacity on, or with `many` programs) where it divides page_size or page_size divides
    it, else the largest power of two that divides page_size (16 for pages of 48, 80)."""
    if page_size is None:
        return _CONTIG_BLOCK_N
    long = many or capacity >= _LONG_CONTEXT
    want = _PAGED_BLOCK_N_LONG if long else _PAGED_BLOCK_N
    if page_size % want == 0 or want % page_size == 0:
        return want
    return min(want, page_size & -page_size)


def row_tiles(group: int, seq_q: int) -> tuple[int, int]:
    """(rows per program, row blocks) for GROUP · Sq rows."""
    block = min(_MAX_ROWS, pad_pow2(group * seq_q))
    return block, _cdiv(group * seq_q, block)


# The tile merge's splits in flight at once: CHUNK x BLOCK_ROWS partial rows of fp32
# (16 x 128 at d128: 16 registers a thread at 4 warps, 128 for the chunk), so the fused
# combine leaves the split kernel's registers (4 programs per SM) as they are.
_MERGE_ROWS_IN_FLIGHT = 128


def combine_defaults(num_splits: int, block_rows: int) -> tuple[bool, bool]:
    """(fused_combine, merge_tile) for the fields a DecodeConfig leaves None at this
    split count and rows per program: `_COMBINE`'s, or $FA_BENCH_DECODE_COMBINE's
    (ValueError naming a bad value)."""
    name = os.environ.get(COMBINE_ENV, "") or _COMBINE
    if name not in COMBINES:
        raise ValueError(f"${COMBINE_ENV} is {name!r}; valid: {', '.join(COMBINES)}")
    fixed = COMBINES[name]
    if fixed is not None:
        return fixed
    one_chunk = num_splits <= merge_chunk(num_splits, block_rows)
    return COMBINES["fused-tile" if one_chunk else "rows"] or (False, False)


def merge_chunk(num_splits: int, block_rows: int) -> int:
    """Splits the tile merge loads at once (a power of two, at most num_splits padded)."""
    splits_pow2 = 1 << max(0, num_splits - 1).bit_length()  # (pad_pow2 stops at 16)
    return max(1, min(splits_pow2, _MERGE_ROWS_IN_FLIGHT // block_rows))


def _deeper_candidate(page_size: int | None, block_n: int, stages: int) -> tuple[int, int] | None:
    """(block_n, stages) with twice the bytes in flight per program for the same bytes per
    key (decode_rules.deeper weighs it): contiguous, 3 stages in place of 2; paged,
    64-key blocks in place of 32 at 5 stages (two buffers either way)."""
    if page_size is None:
        return (block_n, _CONTIG_STAGES_FEW) if stages == _CONTIG_STAGES_MANY else None
    bn = 2 * block_n
    if bn > _PAGED_BLOCK_N_LONG or kv_buffers(stages, True) < 2:
        return None
    return (bn, stages) if page_size % bn == 0 or bn % page_size == 0 else None


def resolve(
    config: DecodeConfig | None,
    num_splits: int | None,
    *,
    programs: int,
    capacity: int,
    page_size: int | None,
    sms: int,
    block_rows: int = 16,
    head_dim: int = 128,
    itemsize: int = 2,
    seq_q: int = 1,
) -> Launch:
    """The launch for `programs` (sequence, KV head, row block) programs per split over a
    cache of `capacity` positions (`page_size` None: contiguous) on `sms` SMs, with
    `block_rows` rows per program, `seq_q` query tokens per sequence, `head_dim` and
    `itemsize` (the cache's bytes per element): `config`'s and `num_splits`' set values,
    the heuristic's for the rest."""
    config = config or DecodeConfig()
    paged = page_size is not None
    tile = Tile(block_rows, pad_pow2(head_dim), itemsize, paged)
    many = programs >= _MANY_WAVES * _MAX_SLOTS * sms
    block_n = config.block_n or block_n_for(page_size, capacity, many)
    if config.num_stages:
        stages = config.num_stages
    elif paged:
        stages = _PAGED_STAGES_MANY if many else _PAGED_STAGES
    else:
        few = programs * 4 < sms
        stages = _CONTIG_STAGES_FEW if few else _CONTIG_STAGES_MANY
    long_block = block_n == _PAGED_BLOCK_N_LONG and not many
    if (
        not config.block_n
        and paged
        and long_block
        and programs > slots(tile, block_n, stages) * sms
    ):
        # The long-context 64-key blocks at 5 stages fit 3 programs per SM (d128): with
        # more programs than that wave holds, they ran a partial second wave (batch 64 x
        # 128k, 512 programs: 0.80-0.86 x SDPA, session 5 call D), where the short blocks
        # fit 4 per SM, one wave (batch 64 x 32k, the same kernel: 1.05 x copy).
        block_n = min(block_n, block_n_for(page_size))
    if num_splits is None and not (config.block_n or config.num_stages or many):
        cand = _deeper_candidate(page_size, block_n, stages)
        splits = cand and deeper(programs, capacity, sms, tile, (block_n, stages), cand)
        if cand and splits:
            (block_n, stages), num_splits = cand, splits
    if num_splits is None:
        num_splits = choose_num_splits(programs, capacity, block_n, sms, tile, stages)
    fused_default, tile_default = combine_defaults(num_splits, block_rows)
    return Launch(
        block_n=block_n,
        num_warps=config.num_warps or _NUM_WARPS,
        num_stages=stages,
        interleave=_INTERLEAVE if config.interleave is None else config.interleave,
        num_splits=num_splits,
        fused_combine=fused_default if config.fused_combine is None else config.fused_combine,
        pdl=_PDL if config.pdl is None else config.pdl,
        one_loop=one_loop_default(seq_q) if config.one_loop is None else config.one_loop,
        merge_tile=tile_default if config.merge_tile is None else config.merge_tile,
    )
