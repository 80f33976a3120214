"""fa4 in a `fa-bench run` against the FA4 figures measured on their own (issue 17).

The anchors (`../shared/data/h200-anchors-2026-11-30.md`): flash-attn-4 4.0.0b36 on one
H200, bf16, timed with `triton.testing.do_bench`, B = 16384 / N, H = 2048 / D, TFLOP/s in
the FlashAttention papers' count, as fa-bench's. Prints a Markdown table for
docs/results-h200.md: fa-bench's fa4 forward / backward beside the anchors and their
ratio, with sdpa-cudnn and triton from the same run; exit 1 when a fa4 case is not `ok`
or a ratio is off by more than 5% (a check of both timers).

    python tools/gpu/fa4_vs_anchors.py RUN_DIR_OR_RESULTS_JSON
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

# (head_dim, seqlen, causal) -> (forward, backward) TFLOP/s of FA4 in the anchors file.
ANCHORS = {
    (64, 1024, False): (388, 403),
    (64, 4096, False): (488, 494),
    (64, 16384, False): (531, 522),
    (64, 4096, True): (427, 445),
    (64, 16384, True): (509, 516),
    (128, 1024, False): (531, 447),
    (128, 4096, False): (624, 569),
    (128, 16384, False): (664, 606),
    (128, 1024, True): (257, 355),
    (128, 4096, True): (558, 508),
    (128, 16384, True): (622, 594),
}
TOLERANCE = 0.05
PEERS = ("sdpa-cudnn", "triton")


def _cases(path: Path) -> list[dict]:
    doc = json.loads((path / "results.json" if path.is_dir() else path).read_text())
    return [c for c in doc["cases"] if c.get("dtype") == "bf16"]


def _key(case: dict) -> tuple[int, int, bool]:
    return int(case["head_dim"]), int(case["seqlen_q"]), bool(case["causal"])


def _pair(by: dict, impl: str, key: tuple) -> tuple[float | None, float | None]:
    return by.get((impl, "fwd", key)), by.get((impl, "bwd", key))


def _fmt(pair: tuple[float | None, float | None]) -> str:
    return " / ".join("–" if x is None else f"{x:.0f}" for x in pair)


def table(cases: list[dict]) -> tuple[list[str], list[str]]:
    """The Markdown lines and the problems found (fa4 not ok, a ratio off by > 5%)."""
    by = {(c["impl"], c["mode"], _key(c)): c.get("tflops") for c in cases if c["status"] == "ok"}
    problems = [f"{c['id']}: {c['status']}: {c.get('error')}" for c in cases
                if c["impl"] == "fa4" and c["status"] != "ok"]  # fmt: skip
    lines = [
        "| D | N | causal | fa4 fwd / bwd (fa-bench) | fa4 fwd / bwd (anchors) | ratio | "
        + " | ".join(f"{p} fwd / bwd" for p in PEERS)
        + " |",
        "|---|---|---|---|---|---|" + "---|" * len(PEERS),
    ]
    for key, anchor in ANCHORS.items():
        ours = _pair(by, "fa4", key)
        ratios = [None if o is None else o / a for o, a in zip(ours, anchor, strict=True)]
        for mode, r in zip(("fwd", "bwd"), ratios, strict=True):
            if r is not None and abs(r - 1) > TOLERANCE:
                problems.append(f"fa4 {mode} D={key[0]} N={key[1]} causal={key[2]}: {r:.3f}")
        shown = " / ".join("–" if r is None else f"{r:.3f}" for r in ratios)
        peers = " | ".join(_fmt(_pair(by, p, key)) for p in PEERS)
        d, n, causal = key
        lines.append(f"| {d} | {n // 1024}k | {'yes' if causal else 'no'} | {_fmt(ours)} | "
                     f"{_fmt(anchor)} | {shown} | {peers} |")  # fmt: skip
    return lines, problems


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    lines, problems = table(_cases(Path(argv[0])))
    print("\n".join(lines))
    for p in problems:
        print(f"problem: {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
