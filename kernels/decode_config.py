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

and `num_splits` (decode_attention's own argument) the split count. `resolve` turns a
config, the problem and the SM count into a complete `Launch`.

The heuristic (`heuristic_block_n`, `choose_num_splits`, the defaults below) is a fixed
rule, not an autotuner: nothing is timed at run time. docs/kernel.md ("Decoding") says
which measurement each choice rests on; tools/gpu/decode_tune.py makes them.
"""

from __future__ import annotations

from dataclasses import dataclass

from fa_bench.kernels.flash_config import pad_pow2

MAX_SPLITS = 128
# Rows (token, head pairs) per program: 64 rows of fp32 accumulators at d256 still fit.
_MAX_ROWS = 64
_WARPS = (1, 2, 4, 8, 16)
_MAX_STAGES = 8
_MIN_BLOCK_N, _MAX_BLOCK_N = 16, 256

# The heuristic's defaults.
# Keys per block: 64 keeps a bf16 d128 block at 16 KB per operand, several in flight.
_BLOCK_N = 64
_NUM_WARPS = 4
_NUM_STAGES = 3
_INTERLEAVE = False
_MIN_BLOCKS_PER_SPLIT = 4
_WAVES = 2


@dataclass(frozen=True)
class DecodeConfig:
    """Launch parameters of the split kernel; None: the heuristic's choice."""

    block_n: int | None = None
    num_warps: int | None = None
    num_stages: int | None = None
    interleave: bool | None = None


@dataclass(frozen=True)
class Launch:
    """A complete launch: every parameter fixed."""

    block_n: int
    num_warps: int
    num_stages: int
    interleave: bool
    num_splits: int


def _cdiv(n: int, d: int) -> int:
    return (n + d - 1) // d


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


def block_n_for(page_size: int | None) -> int:
    """The heuristic's keys per block: `_BLOCK_N` for a contiguous cache (page_size None);
    for a paged one the largest power of two up to `_BLOCK_N` that divides page_size."""
    if page_size is None:
        return _BLOCK_N
    return min(_BLOCK_N, page_size & -page_size)


def row_tiles(group: int, seq_q: int) -> tuple[int, int]:
    """(rows per program, row blocks) for GROUP · Sq rows."""
    block = min(_MAX_ROWS, pad_pow2(group * seq_q))
    return block, _cdiv(group * seq_q, block)


def choose_num_splits(programs: int, capacity: int, block_n: int, sms: int) -> int:
    """Splits per sequence so that programs · splits fills `sms` SMs about `_WAVES` times,
    each split keeping at least `_MIN_BLOCKS_PER_SPLIT` key blocks of a `capacity`-long
    context; 1 when the programs alone fill the GPU; at most MAX_SPLITS."""
    wanted = _cdiv(_WAVES * sms, programs)
    most = max(1, _cdiv(capacity, block_n) // _MIN_BLOCKS_PER_SPLIT)
    return max(1, min(wanted, most, MAX_SPLITS))


def resolve(
    config: DecodeConfig | None,
    num_splits: int | None,
    *,
    programs: int,
    capacity: int,
    page_size: int | None,
    sms: int,
) -> Launch:
    """The launch for `programs` (sequence, KV head, row block) programs per split over a
    cache of `capacity` positions (`page_size` None: contiguous) on `sms` SMs: `config`'s
    and `num_splits`' set values, the heuristic's for the rest."""
    config = config or DecodeConfig()
    block_n = config.block_n or block_n_for(page_size)
    if num_splits is None:
        num_splits = choose_num_splits(programs, capacity, block_n, sms)
    return Launch(
        block_n=block_n,
        num_warps=config.num_warps or _NUM_WARPS,
        num_stages=config.num_stages or _NUM_STAGES,
        interleave=_INTERLEAVE if config.interleave is None else config.interleave,
        num_splits=num_splits,
    )
