"""Issue 21's forward table from one run folder: per (dtype, head_dim, N, causal) our
`triton` forward's TFLOP/s, the kernel that ran (its backend label: gluon-... or the `tl`
tiles), sdpa-cudnn's, and the ratio.

    python tools/gpu/issue21_summary.py fa-bench-out/i21

A developer tool, not installed.
"""

from __future__ import annotations

import sys
from pathlib import Path

from fa_bench.results.files import load_results


def main(folder: str) -> None:
    doc = load_results(Path(folder))
    cells: dict[tuple, dict[str, object]] = {}
    for r in doc.cases:
        c = r.case
        key = (c.dtype.value, c.head_dim, c.seqlen_q, c.causal)
        cells.setdefault(key, {})[c.impl] = r
    print("| dtype | D | N | causal | triton TFLOP/s | forward kernel | sdpa-cudnn | ÷ cuDNN |")
    print("|---|---|---|---|---|---|---|---|")
    for key in sorted(cells):
        ours, cudnn = cells[key].get("triton"), cells[key].get("sdpa-cudnn")
        t = getattr(ours, "tflops", None)
        u = getattr(cudnn, "tflops", None)
        ratio = f"{t / u:.3f}" if t and u else "–"
        kernel = (getattr(ours, "backend", "") or "").split(":", 1)[-1]
        row = (*key, _fmt(t), kernel, _fmt(u), ratio)
        print("| " + " | ".join(str(x) for x in row) + " |")


def _fmt(x: float | None) -> str:
    return f"{x:.1f}" if x else "–"


if __name__ == "__main__":
    main(sys.argv[1])
