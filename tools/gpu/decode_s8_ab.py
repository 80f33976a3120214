"""Issue 20, session 8: the combine off the critical path. Per shape (D 128, bf16, 8 KV
heads, equal lengths): SDPA, then our kernel planned at the heuristic's launch (also
timed as its split kernel alone) and with each way of merging the splits (the split
launch otherwise the heuristic's):

- `rows`: the combine kernel, one program per output row (today's default), by PDL;
- `tile`: the combine kernel, one program per (sequence, KV head, row block) merging all
  its rows at once (fa_bench.kernels.decode_merge), by PDL;
- `fused-tile`: no second launch: the last split program of each row block merges it;

and, at the three batch 8 x 8k shapes that missed, extras: the fused merge with one block
loop and with 4 splits (option (c)); at the end the tile kernel without PDL or with 4
splits, session 5's fused rows. Shapes, most wanted first: batch 8 x 8k at Sq 4 (pages
64, none), 64/8 heads page 64, Sq 1 (none, 64/8 heads, page 64); batch 1 x 32k / 128k
(many splits); batch 8 x 8k page 256 at Sq 1 and 4; batch 64 x 8k (one split: the
heuristic only). The harness (inputs, timing behind the reading L2 flush, medians
of 200 calls, the markdown) is tools/gpu/decode_s7_ab.py's.

    DEADLINE_S=60 python tools/gpu/decode_s8_ab.py --json $OUT/ab.json > ab.md

`--smoke`: tiny fp32 shapes on the CPU (the interpreter), so a test runs every path.
A development tool, not installed. tools/gpu/decode_s8_pick.py picks from its JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import decode_s7_ab as s7
import torch

Cand = s7.Cand
COMBINES: list[Cand] = [
    ("heuristic", None, {}),
    ("rows", None, {"fused_combine": False, "merge_tile": False}),
    ("tile", None, {"fused_combine": False, "merge_tile": True}),
    ("fused-tile", None, {"fused_combine": True, "merge_tile": True}),
]
# at the three misses, in the first pass: the fused merge with session 7's one block loop
# (0.8-1.2 us at Sq 4 there) and with 4 splits (option (c): half the partials to merge,
# one chunk in registers); in the second pass the rest
FIRST_CONTIG: list[Cand] = [
    ("fused-tile one loop", None, {"fused_combine": True, "merge_tile": True, "one_loop": True}),
    (
        "s4 st3 fused-tile",
        4,
        {"block_n": 64, "num_stages": 3, "fused_combine": True, "merge_tile": True},
    ),
]
FIRST_PAGED: list[Cand] = [
    FIRST_CONTIG[0],
    (
        "s4 bn64 st5 fused-tile",
        4,
        {"block_n": 64, "num_stages": 5, "fused_combine": True, "merge_tile": True},
    ),
]
SECOND_CONTIG: list[Cand] = [
    ("tile no pdl", None, {"fused_combine": False, "merge_tile": True, "pdl": False}),
    ("s4 st3 tile", 4, {"block_n": 64, "num_stages": 3, "merge_tile": True}),
    ("fused-rows", None, {"fused_combine": True, "merge_tile": False}),
]
SECOND_PAGED: list[Cand] = [
    SECOND_CONTIG[0],
    ("s4 bn64 st5 tile", 4, {"block_n": 64, "num_stages": 5, "merge_tile": True}),
    SECOND_CONTIG[2],
]
# (batch, heads_q, Sq, context, page or 0), most wanted first: the three batch 8 x 8k
# misses of session 7 with every merge and the first extras, the other shapes with every
# merge, then the second extras at the misses; batch 64 x 8k runs one split (no merge):
# the heuristic only, to show it unmoved
SHAPES: list[tuple[s7.Shape, list[Cand]]] = [
    ((8, 32, 4, 8192, 64), COMBINES + FIRST_PAGED),
    ((8, 32, 4, 8192, 0), COMBINES + FIRST_CONTIG),
    ((8, 64, 1, 8192, 64), COMBINES + FIRST_PAGED),
    ((8, 32, 1, 8192, 0), COMBINES),
    ((8, 64, 1, 8192, 0), COMBINES),
    ((8, 32, 1, 8192, 64), COMBINES),
    ((1, 32, 1, 32768, 0), COMBINES),
    ((1, 32, 1, 131072, 64), COMBINES),
    ((8, 32, 1, 8192, 256), COMBINES),
    ((8, 32, 4, 8192, 256), COMBINES),
    ((1, 32, 1, 32768, 64), COMBINES),
    ((64, 32, 1, 8192, 0), COMBINES[:1]),
    ((8, 32, 4, 8192, 64), SECOND_PAGED),
    ((8, 32, 4, 8192, 0), SECOND_CONTIG),
    ((8, 64, 1, 8192, 64), SECOND_PAGED),
]
# the smoke's candidates at 3 splits: the CPU's heuristic would pick one split there
SMOKE_SHAPES: list[tuple[s7.Shape, list[Cand]]] = [
    ((2, 16, 4, 160, 16), [(label, 3, kw) for label, _, kw in COMBINES]),
    ((1, 16, 1, 300, 0), [(label, 3, kw) for label, _, kw in COMBINES[2:]]),
]


def launch_label(plan) -> str:
    """decode_s7_ab's label and how the splits are merged."""
    ln = plan.launch
    merge = ""
    if ln.num_splits > 1:
        merge = (" fused" if ln.fused_combine else "") + (" tile" if ln.merge_tile else " rows")
    return label_s7(plan) + merge


label_s7, s7.launch_label = s7.launch_label, launch_label  # shape_rows' labels say the merge
# the split kernel alone where the combine is a second kernel whatever the heuristic is
s7.SPLIT_ALONE.add("rows")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="also write the rows here (after every shape)")
    parser.add_argument("--smoke", action="store_true", help="tiny fp32 shapes on the CPU")
    args = parser.parse_args(argv)
    shapes = SMOKE_SHAPES if args.smoke else SHAPES
    deadline, copy, flush = s7.harness(args.smoke)
    rows: list[dict] = []
    for shape, candidates in shapes:
        if time.monotonic() > deadline:
            print(f"deadline: stopped before {shape}", file=sys.stderr)
            break
        case = s7.case_of(*shape)
        got = s7.shape_rows(case, candidates, flush, deadline)
        s7._annotate(got, case, copy)
        rows += got
        if s7.RUN["device"] == "cuda":
            torch.cuda.empty_cache()
        print("\n".join(s7.markdown(rows, copy)), file=sys.stderr, flush=True)
        if args.json:  # a run cut by its deadline keeps what it measured
            with open(args.json, "w") as f:
                json.dump({"copy_gbps": copy, "rows": rows}, f, indent=1)
    print("\n".join(s7.markdown(rows, copy)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
