"""The markdown of tools/gpu/decode_tune.py's measurements (its JSON, or a file of it):

    python tools/gpu/decode_tune_report.py decode_tune.json > decode_tune.md

1. per shape: the heuristic's launch and GB/s (a CUDA graph of one call, and a plain
   call), the best candidate, SDPA (graphed, plain), the fractions of the copy bandwidth;
2. per config (block_n, warps, stages): over the shapes it ran on, its best split
   count's time relative to the shape's best (geometric mean and worst), contiguous and
   paged apart: the configs that are near the best everywhere;
3. per shape, the five fastest candidates.

A development tool, not installed.
"""

from __future__ import annotations

import json
import math
import sys
from collections import defaultdict


def _gb(x: float | None) -> str:
    return "–" if not x else f"{x:.0f}"


def _frac(x: float | None, copy: float) -> str:
    return "–" if not x else f"{x / copy:.2f}"


def _by_shape(rows: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        out[r["shape"]].append(r)
    return out


def _one(rows: list[dict], kind: str) -> dict | None:
    return next((r for r in rows if r["kind"] == kind), None)


def _shape_table(shapes: dict[str, list[dict]], copy: float) -> list[str]:
    lines = [
        "| shape | heuristic | GB/s (graph / plain) | best candidate | GB/s | best ÷ heur. "
        "| SDPA GB/s (graph / plain) | best ÷ SDPA | best ÷ copy |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for label, rows in shapes.items():
        heur, plain = _one(rows, "heuristic"), _one(rows, "heuristic-plain")
        sdpa, sdpa_plain = _one(rows, "sdpa"), _one(rows, "sdpa-plain")
        cands = sorted((r for r in rows if r["kind"] == "cand" and r["ms"]), key=lambda r: r["ms"])
        best = cands[0] if cands else None
        hg = heur["gbps"] if heur else None
        bg = best["gbps"] if best else None
        sg = sdpa["gbps"] if sdpa else None
        lines.append(
            f"| {label} | {heur['label'] if heur else '–'} | {_gb(hg)} / "
            f"{_gb(plain['gbps'] if plain else None)} | {best['label'] if best else '–'} | "
            f"{_gb(bg)} | {bg / hg if bg and hg else 0:.2f} | {_gb(sg)} / "
            f"{_gb(sdpa_plain['gbps'] if sdpa_plain else None)} | "
            f"{bg / sg if bg and sg else 0:.2f} | {_frac(bg, copy)} |"
        )
    return lines


def _config_table(shapes: dict[str, list[dict]]) -> list[str]:
    ratios: dict[tuple, list[float]] = defaultdict(list)
    for rows in shapes.values():
        cands = [r for r in rows if r["kind"] == "cand" and r["ms"]]
        if not cands:
            continue
        best = min(r["ms"] for r in cands)
        mine: dict[tuple, float] = {}
        for r in cands:
            c = r["cand"]
            key = (r["page"] > 0, r["sq"], c["block_n"], c["num_warps"], c["num_stages"])
            mine[key] = min(mine.get(key, math.inf), r["ms"])
        for key, ms in mine.items():
            ratios[key].append(ms / best)
    lines = [
        "| cache | Sq | block_n | warps | stages | shapes | geomean time ÷ best | worst |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for key in sorted(ratios, key=lambda k: (k[0], k[1], _geo(ratios[k]))):
        r = ratios[key]
        lines.append(
            f"| {'paged' if key[0] else 'contig'} | {key[1]} | {key[2]} | {key[3]} | {key[4]} "
            f"| {len(r)} | {_geo(r):.3f} | {max(r):.3f} |"
        )
    return lines


def _geo(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def _top(shapes: dict[str, list[dict]], n: int = 5) -> list[str]:
    lines = []
    for label, rows in shapes.items():
        cands = sorted((r for r in rows if r["kind"] == "cand" and r["ms"]), key=lambda r: r["ms"])
        top = ", ".join(f"{r['label']} {r['gbps']:.0f}" for r in cands[:n])
        errors = sum(1 for r in rows if r.get("error"))
        lines.append(f"- {label}: {top}" + (f" ({errors} failed to launch)" if errors else ""))
    return lines


def report(result: dict) -> str:
    meta, rows = result["meta"], result["rows"]
    copy = meta["copy_gbps"]
    shapes = _by_shape(rows)
    head = [
        "# decode_tune",
        "",
        f"{meta.get('device')}, {meta.get('sms')} SMs, torch {meta.get('torch')}, "
        f"triton {meta.get('triton')}; copy bandwidth {copy:.0f} GB/s (1 GiB d2d, read + "
        f"write); {meta.get('compile_keys')} compile keys in {meta.get('compile_s', 0):.0f} s "
        f"({meta.get('compile_errors')} failed); {meta.get('skipped')} measurements left out "
        f"at the budget; {meta.get('wall_s', 0):.0f} s in all.",
        "",
        "GB/s: fa_bench.models.decode_bytes ÷ do_bench median (L2 flushed). 'graph': a CUDA "
        "graph of one call (GPU time); 'plain': the Python call, as fa-bench run times it.",
        "",
    ]
    body = [*_shape_table(shapes, copy), "", "## Configs over shapes", ""]
    body += [*_config_table(shapes), "", "## Fastest candidates per shape (GB/s)", ""]
    return "\n".join(head + body + _top(shapes)) + "\n"


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        print(report(json.load(f)), end="")
