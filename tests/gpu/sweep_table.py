"""Markdown table of a sweep.json for docs/sweep.md: per case the best config, the gain over
the sweep's default and over an older default, and where each rule of thumb lands (its
square tile's best TFLOP/s over warps and stages, and its rank), as in the HTML report.

    python tests/gpu/sweep_table.py sweep.json [--old bwd:64=bm64-bn128-w8-s3 ...]

`--old MODE:HEAD_DIM=LABEL` names the config that was the default before (a row of the
sweep); where none is given, the older default is the sweep's own default.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

from fa_bench.reports.sweep_figures import rule_of_thumb_table

RULES = ("sqrt(M/3d)", "256@d64,192@d128", "by seqlen")  # rules_of_thumb order


def _n(seqlen: int) -> str:
    return f"{seqlen // 1024}k" if seqlen >= 1024 else str(seqlen)


def table(doc: dict, old: dict[tuple[str, int], str]) -> list[str]:
    rows = doc["rows"]
    by_case: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by_case[r["case_id"]].append(r)
    head = ["mode", "D", "N", "causal", "best", "TFLOP/s", "default", "gain", "old default",
            "gain", *RULES]  # fmt: skip
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for rs in by_case.values():
        ok = sorted((r for r in rs if r["status"] == "ok"), key=lambda r: -r["tflops"])
        best, first = ok[0], rs[0]
        default = next(r for r in rs if r["is_default"])
        old_label = old.get((first["mode"], first["head_dim"]), default["label"])
        before = next(r for r in rs if r["label"] == old_label)
        cells = [first["mode"], str(first["head_dim"]), _n(first["seqlen_q"]),
                 "yes" if first["causal"] else "no", best["label"], f"{best['tflops']:.0f}",
                 default["label"], f"{best['tflops'] / default['tflops'] - 1:+.1%}",
                 old_label, f"{best['tflops'] / before['tflops'] - 1:+.1%}"]  # fmt: skip
        # The report's rule: a rule's square tile at its best over warps and stages.
        for entry in rule_of_thumb_table(doc, first["case_id"]):
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
