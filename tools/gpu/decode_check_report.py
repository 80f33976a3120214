"""The issue-20 view of a decode run's results.json (tools/gpu/decode_check.sh): per case,
our kernel's GB/s and its fraction of the run's copy bandwidth, each peer's GB/s, ours
÷ the best peer, NVML's bytes ÷ the byte model, and the launch our adapter reports;
then the issue's targets, case by case.

    python tools/gpu/decode_check_report.py results.json [--copy-gbps N] > decode_check.md

The copy bandwidth is the run's calibration (env.telemetry.calibration.gbps_copy), else
--copy-gbps (e.g. decode_tune.md's). Targets (issue 20): batch x KV heads >= 64 and
context >= 8k, contiguous or pages >= 64: >= 0.9 x copy; batch 1 at 32k-128k: >= 0.7 x;
ours >= 1.0 x every peer. A development tool, not installed.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict

OURS = "triton"


def _copy_gbps(doc: dict) -> float | None:
    tel = (doc.get("env") or {}).get("telemetry") or {}
    cal = tel.get("calibration") or {}
    value = cal.get("gbps_copy") if cal.get("available") else None
    return value if isinstance(value, (int, float)) and value > 0 else None


def _shape_key(rec: dict) -> str:
    return rec["id"].split("/", 1)[1]


def _nvml(rec: dict) -> float | None:
    tel = rec.get("telemetry") or {}
    return tel.get("bytes_ratio_measured_to_model")


def target(rec: dict) -> float | None:
    """The issue's fraction of the copy bandwidth for this case, or None (no target)."""
    bkv = rec["batch"] * rec["heads_kv"]
    paged_ok = rec["page_size"] == 0 or rec["page_size"] >= 64
    if bkv >= 64 and rec["seqlen_k"] >= 8192 and paged_ok:
        return 0.9
    if rec["batch"] == 1 and 32768 <= rec["seqlen_k"] <= 131072:
        return 0.7
    return None


def _row(key: str, recs: dict[str, dict], peers: list[str], copy: float | None) -> tuple:
    ours = recs.get(OURS)
    g = ours.get("gbps_model") if ours and ours["status"] == "ok" else None
    cells = [key, f"{g:.0f}" if g else (ours["status"] if ours else "–")]
    frac = g / copy if g and copy else None
    cells.append(f"{frac:.2f}" if frac else "–")
    best_peer = None
    for p in peers:
        r = recs.get(p)
        pg = r.get("gbps_model") if r and r["status"] == "ok" else None
        cells.append(f"{pg:.0f}" if pg else (r["status"] if r else "–"))
        if pg and (best_peer is None or pg > best_peer):
            best_peer = pg
    vs = g / best_peer if g and best_peer else None
    cells.append(f"{vs:.2f}" if vs else "–")
    nv = _nvml(ours) if ours else None
    cells.append(f"{nv:.2f}" if nv else "–")
    cells.append((ours or {}).get("backend") or "–")
    return cells, frac, vs


def report(doc: dict, copy_override: float | None = None) -> str:
    copy = _copy_gbps(doc) or copy_override
    by_case: dict[str, dict[str, dict]] = defaultdict(dict)
    for rec in doc["cases"]:
        by_case[_shape_key(rec)][rec["impl"]] = rec
    peers = sorted({r["impl"] for r in doc["cases"]} - {OURS})
    head = ["case", "ours GB/s", "÷ copy", *(f"{p} GB/s" for p in peers), "ours ÷ best peer",
            "NVML ÷ model", "our launch"]  # fmt: skip
    lines = [
        f"# decode check ({doc['run'].get('started', '?')})",
        "",
        f"copy bandwidth: {copy:.0f} GB/s" if copy else "copy bandwidth: unknown",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    misses = []
    for key, recs in by_case.items():
        cells, frac, vs = _row(key, recs, peers, copy)
        lines.append("| " + " | ".join(cells) + " |")
        ours = recs.get(OURS)
        want = target(ours) if ours else None
        if want and frac is not None and frac < want:
            misses.append(f"- {key}: {frac:.2f} x copy, target {want}")
        if vs is not None and vs < 1.0:
            misses.append(f"- {key}: {vs:.2f} x the best peer")
    lines += ["", "## Targets missed", ""] + (misses or ["- none"])
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("results")
    ap.add_argument("--copy-gbps", type=float, default=None)
    args = ap.parse_args()
    with open(args.results) as f:
        print(report(json.load(f), args.copy_gbps), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
