"""Host-side tables of the Gluon fp8 forward: which candidate launch the heuristic takes
per (head_dim, causal, seqlen_q range) (ROLE_TABLE), and how many (batch, head)s the
persistent launch's causal order (kernels/flash_gluon_fp8_persist.py) takes at a time.

The causal persistent order runs the heaviest query tiles first; taken over every
(batch, head) at once, the K/V being read at one time is every head's (4 × 16 heads at
4k, head_dim 128: 64 × 1 MB of fp8 K and V), more than the H200's L2 (50 MB, in two
halves), so most of a tile's K/V loads would come from HBM. Grouping the (batch, head)s
so that a group's K/V fits in a share of the L2 keeps the concurrent CTAs on the same
heads, as the non-persistent grid's order does.
"""

from __future__ import annotations

import functools
import os

Ranges = tuple[tuple[int, str], ...]

# (head_dim, causal) -> ((first seqlen_q, role of flash_gluon_fp8.candidate_configs), ...)
# in ascending order; the role of the last range that starts at or below seqlen_q runs.
# Measured on the H200 (docs/kernel.md, the Gluon fp8 forward): session 7 call 2, do_bench
# TFLOP/s at d128 (16k tokens), ws / ws-c3 / ws-c3-persist: non-causal 4k 815.9 / 910.9 /
# 929.3, 16k 857.9 / 947.4 / 971.6; causal 4k 706.2 / 709.7 / 728.2, 16k 830.1 / 884.4 /
# 815.6 (8k not measured: the plain launch from 8k); `fa-bench run` with this table
# (session 8 call 0): fp8 ÷ bf16 1.422, 1.497, causal 1.280, 1.467. Causal since session 9
# call 2 (tools/gpu/fp8_s8.sh PHASE=ab, one process, rounds interleaved): ws-c3-persist /
# ws-c3-lpt / ws-c3-lptx 719.7 / 770.0 / 785.7 at 4k, 820.2 / 891.6 / 901.9 at 16k (bf16
# 518.5, 599.1); `fa-bench run` with ws-c3-lptx: causal 4k 1.467, 16k 1.501 x bf16.
ROLE_TABLE: dict[tuple[int, bool], Ranges] = {
    (128, False): ((0, "ws-c3-persist"),),
    (128, True): ((0, "ws-c3-lptx"),),
    (64, False): ((0, "ws"),),
    (64, True): ((0, "ws"),),
}

# A developer override of ROLE_TABLE's entries (tools/gpu/fp8_final.sh sets it to what its
# check measured best): "<head_dim>/<0|1 causal>/<first seqlen_q>=<role>,..."; the entries
# of one (head_dim, causal) replace its ranges.
TABLE_ENV = "FA_BENCH_FP8_GLUON_TABLE"


@functools.lru_cache(maxsize=16)
def parse_table(text: str) -> dict[tuple[int, bool], Ranges]:
    """ROLE_TABLE's entries from a $FA_BENCH_FP8_GLUON_TABLE text (ValueError naming the
    bad entry; the roles are checked where they are looked up)."""
    found: dict[tuple[int, bool], list[tuple[int, str]]] = {}
    for entry in filter(None, (e.strip() for e in text.split(","))):
        spec, _, role = entry.partition("=")
        parts = spec.split("/")
        if (
            len(parts) != 3
            or not role
            or not all(p.isdigit() for p in parts)
            or parts[1] not in ("0", "1")
        ):
            raise ValueError(
                f"${TABLE_ENV}={text!r}: entry {entry!r} is not "
                "'<head_dim>/<0|1 causal>/<first seqlen_q>=<role>'"
            )
        found.setdefault((int(parts[0]), parts[1] == "1"), []).append((int(parts[2]), role))
    table: dict[tuple[int, bool], Ranges] = {}
    for key, ranges in found.items():
        ranges.sort()
        if ranges[0][0] != 0 or len({start for start, _ in ranges}) != len(ranges):
            raise ValueError(
                f"${TABLE_ENV}={text!r}: the ranges of head_dim {key[0]}, causal {key[1]} "
                "must start at 0 and at distinct lengths"
            )
        table[key] = tuple(ranges)
    return table


def _ranges(head_dim: int, causal: bool) -> Ranges:
    key = (head_dim, bool(causal))
    override = parse_table(os.environ.get(TABLE_ENV, "").strip())
    return override.get(key) or ROLE_TABLE.get(key, ())


def table_range(head_dim: int, causal: bool, seq_q: int | None) -> int:
    """The index of ROLE_TABLE[(head_dim, causal)]'s range holding seq_q (None, or a
    (head_dim, causal) not in the table: 0)."""
    ranges = _ranges(head_dim, causal)
    index = 0
    for i, (start, _role) in enumerate(ranges):
        if seq_q is not None and seq_q >= start:
            index = i
    return index


def range_start(head_dim: int, causal: bool, index: int) -> int | None:
    """The first seqlen_q of that range (None where the table has no entry)."""
    ranges = _ranges(head_dim, causal)
    return ranges[index][0] if index < len(ranges) else None


def table_role(head_dim: int, causal: bool, seq_q: int | None) -> str:
    """The heuristic's role for a call ("ws", the plain launch, where the table has none)."""
    ranges = _ranges(head_dim, causal)
    return ranges[table_range(head_dim, causal, seq_q)][1] if ranges else "ws"


# the share of the L2 (bytes) one group's K and V may take: half of the H200's 50 MB,
# leaving room for Q, O and the other half's copies
L2_SHARE = 24 * 1024 * 1024


def persist_bh_group(n_bh: int, heads_q: int, heads_kv: int, seq_k: int, head_dim: int) -> int:
    """(batch, head)s per group of the causal persistent order: as many whole GQA groups
    (heads_q // heads_kv query heads share one K/V) as fit L2_SHARE with their fp8 K and V
    (2 · seq_k · head_dim bytes per kv head), at least one GQA group, at most n_bh."""
    for name, value in (("n_bh", n_bh), ("heads_q", heads_q), ("heads_kv", heads_kv),
                        ("seq_k", seq_k), ("head_dim", head_dim)):  # fmt: skip
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"persist_bh_group: {name}={value!r}: expected a positive int")
    if heads_q % heads_kv:
        raise ValueError(f"persist_bh_group: heads_q={heads_q} is not a multiple of "
                         f"heads_kv={heads_kv}")  # fmt: skip
    kv_bytes = 2 * seq_k * head_dim
    kv_heads = max(1, L2_SHARE // kv_bytes)
    return min(n_bh, kv_heads * (heads_q // heads_kv))
