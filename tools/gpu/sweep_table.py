"""Markdown table of a sweep.json for docs/sweep.md: per case the best config, the gain over
the sweep's default and over an older default, and where each rule of thumb lands (its
square tile's best TFLOP/s over warps and stages, and its rank), as in the HTML report.

    python tools/gpu/sweep_table.py sweep.json [--old bwd:64=bm64-bn128-w8-s3 ...]

`--old MODE:HEAD_DIM=LABEL` names the config that was the default before (a row of the
sweep); where none is given, the older default is the sweep's own default.
"""

from __future__ import annotations

import argparse
import json

from fa_bench.reports.sweep_figures import rule_of_thumb_table
from fa_bench.sweep.space import RULES


def _n(seqlen: int) -> str:
    return f"{seqlen // 1024}k" if seqlen >= 1024 else str(seqlen)


def table(doc: dict, old: dict[tuple[str, int], str]) -> list[str]:
    tflops = {(r["case_id"], r["label"]): r["tflops"] for r in doc["rows"]}
    first = {}
    for r in doc["rows"]:
        first.setdefault(r["case_id"], r)
    head = ["mode", "D", "N", "causal", "best", "TFLOP/s", "default", "gain", "old default",
            "gain", *RULES]  # fmt: skip
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in doc["cases"]:  # sweep.json's per-case summary: best, default, gain
        cid, r = c["case_id"], first[c["case_id"]]
        old_label = old.get((r["mode"], r["head_dim"]), c["default"])
        cells = [r["mode"], str(r["head_dim"]), _n(r["seqlen_q"]),
                 "yes" if r["causal"] else "no", c["best"], f"{c['best_tflops']:.0f}",
                 c["default"], f"{c['gain_over_default']:+.1%}", old_label,
                 f"{c['best_tflops'] / tflops[(cid, old_label)] - 1:+.1%}"]  # fmt: skip
        # The report's rule: a rule's square tile at its best over warps and stages.
        for entry in rule_of_thumb_table(doc, cid):
            block = entry["block"]
            if entry["tflops"] is not None:
                cells.append(f"{block}: {entry['tflops']:.0f}, {entry['rank']}/{entry['of']}")
            else:
                cells.append(f"{block}: {entry['note']}" if block else "-")
        out.append("| " + " | ".join(cells) + " |")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep_json")
    parser.add_argument("--old", action="append", default=[], help="MODE:HEAD_DIM=LABEL")
    args = parser.parse_args()
    old = {}
    for spec in args.old:
        key, label = spec.split("=")
        mode, head_dim = key.split(":")
        old[(mode, int(head_dim))] = label
    with open(args.sweep_json, encoding="utf-8") as f:
        print("\n".join(table(json.load(f), old)))


if __name__ == "__main__":
    main()
