"""Backward TFLOP/s per implementation and shape from `fa-bench run` results, with the ratio
to sdpa-cudnn in the same run and NVML's tensor-core utilisation (issue 18's check).

    python tools/gpu/issue18_summary.py RUN_FOLDER_OR_RESULTS_JSON [...]

Prints a Markdown table per results file. A developer tool, not installed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

BASE = "sdpa-cudnn"


def _load(arg: str) -> dict:
    path = Path(arg)
    if path.is_dir():
        path = path / "results.json"
    with open(path) as f:
        return json.load(f)


def _pct(tel: dict, key: str) -> str:
    value = tel.get(key) if isinstance(tel, dict) else None
    return f"{value:.0f}" if isinstance(value, (int, float)) else "–"


def summary(doc: dict) -> list[str]:
    cases = [c for c in doc["cases"] if c.get("mode") == "bwd"]
    shape = lambda c: (c["dtype"], c["head_dim"], c["seqlen_q"], c["causal"])  # noqa: E731
    base = {shape(c): c.get("tflops") for c in cases if c["impl"] == BASE and c["status"] == "ok"}
    env = doc.get("env", {})
    lines = [
        f"torch {env.get('torch')}, triton {env.get('triton')}, cudnn {env.get('cudnn')}",
        "",
        "| impl | dtype | D | N | causal | status | bwd TFLOP/s | ÷ sdpa-cudnn | hmma % | "
        "tensor % | backend |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in sorted(cases, key=lambda c: (*shape(c), c["impl"])):
        t = c.get("tflops") if c["status"] == "ok" else None
        b = base.get(shape(c))
        ratio = f"{t / b:.3f}" if t and b else "–"
        tel = c.get("telemetry") or {}
        lines.append(
            f"| {c['impl']} | {c['dtype']} | {c['head_dim']} | {c['seqlen_q']} | "
            f"{'yes' if c['causal'] else 'no'} | {c['status']} | "
            f"{f'{t:.1f}' if t else '–'} | {ratio} | {_pct(tel, 'hmma_util_pct')} | "
            f"{_pct(tel, 'tensor_util_pct')} | {c.get('backend') or ''} |"
        )
    return lines


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    for arg in argv:
        print(f"## {arg}\n")
        try:
            print("\n".join(summary(_load(arg))))
        except (OSError, ValueError, KeyError) as exc:
            print(f"cannot read {arg}: {exc}")
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
