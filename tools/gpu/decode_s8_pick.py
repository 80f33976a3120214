"""Pick the decode combine from tools/gpu/decode_s8_ab.py's JSON (issue 20, session 8):
prints the winning $FA_BENCH_DECODE_COMBINE value (kernels/decode_config.py COMBINES) on
stdout, the reasons on stderr.

Each candidate (`tile`, `fused-tile`, and `fused-tile-few`: fused-tile's time where
its split count fits one merge chunk, else rows', as kernels/decode_config.py's rule of
that name launches) is timed against `rows` (the combine kernel of one program per
output row) on every shape where both ran: it is picked if its geometric mean speed-up
over `rows` is at least MIN_GAIN, it is no more than MAX_LOSS slower on any shape, and
its output is within MAX_DIFF of the heuristic's (a broken merge must not win); of
those, the larger geometric mean. Else `rows`.

    python tools/gpu/decode_s8_pick.py ab.json   # -> rows | tile | fused-tile | fused-tile-few
"""

from __future__ import annotations

import json
import math
import sys

BASE = "rows"
FEW = "fused-tile-few"
CANDIDATES = ("tile", "fused-tile", FEW)
MIN_GAIN = 1.005  # beyond one A/B's run-to-run spread of the geometric mean
MAX_LOSS = 0.985  # no shape more than 1.5% slower (about 1 us at batch 8 x 8k)
MAX_DIFF = 1e-2  # bf16 outputs of the same sums in another order differ by ~1e-3


def one_chunk(shape: str, launch: str) -> bool:
    """Whether the launch's splits fit one merge chunk: the shape as decode_s7_ab names
    it ("b8 hq32 sq4 8k page64", 8 KV heads), the launch as its label ("s8 bn32 ...")."""
    from fa_bench.kernels.decode_config import merge_chunk, row_tiles

    fields = shape.split()
    group, sq = int(fields[1][2:]) // 8, int(fields[2][2:])
    splits = int(launch.split()[0][1:])
    return splits <= merge_chunk(splits, row_tiles(group, sq)[0])


def _few(got: dict[str, dict], shape: str) -> dict | None:
    """fused-tile-few's row at a shape: fused-tile's where one chunk holds the splits."""
    fused, rows = got.get("fused-tile"), got.get(BASE)
    if fused is None:
        return None
    return fused if one_chunk(shape, fused["launch"]) else rows


def ratios(rows: list[dict], name: str) -> list[tuple[str, float]]:
    """(shape, us of rows / us of `name`) on every shape where both ran and `name`'s
    output agrees with the heuristic's."""
    by_shape: dict[str, dict[str, dict]] = {}
    for r in rows:
        by_shape.setdefault(r["shape"], {})[r["variant"]] = r
    out = []
    for shape, got in by_shape.items():
        base = got.get(BASE)
        cand = _few(got, shape) if name == FEW else got.get(name)
        if base is None or cand is None:
            continue
        if cand.get("max_diff", 0.0) > MAX_DIFF:
            out.append((shape, 0.0))  # wrong output: disqualifies
            continue
        out.append((shape, base["us"] / cand["us"]))
    return out


def pick(rows: list[dict]) -> tuple[str, list[str]]:
    """(the pick, the reasons)."""
    best, best_gain, why = BASE, MIN_GAIN, []
    for name in CANDIDATES:
        got = ratios(rows, name)
        if not got:
            why.append(f"{name}: no shape measured beside {BASE}")
            continue
        gain = math.exp(sum(math.log(max(r, 1e-9)) for _, r in got) / len(got))
        worst_shape, worst = min(got, key=lambda x: x[1])
        why.append(
            f"{name}: geometric mean {gain:.4f} x {BASE} over {len(got)} shapes, "
            f"worst {worst:.4f} ({worst_shape})"
        )
        if worst >= MAX_LOSS and gain >= best_gain:
            best, best_gain = name, gain
    return best, why


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: decode_s8_pick.py AB_JSON", file=sys.stderr)
        return 2
    try:
        with open(args[0]) as f:
            rows = json.load(f)["rows"]
    except (OSError, ValueError, KeyError) as exc:
        print(f"no A/B to pick from ({exc}): {BASE}", file=sys.stderr)
        print(BASE)
        return 0
    name, why = pick(rows)
    for line in why:
        print(line, file=sys.stderr)
    print(f"picked {name}", file=sys.stderr)
    print(name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
