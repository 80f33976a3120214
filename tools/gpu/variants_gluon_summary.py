"""Issue 19's forward targets from a `fa-bench run` of tools/gpu/variants_gluon_d.toml:
each variant case's TFLOP/s (attended pairs) against its dense causal control (the same
shape: same id without the variant segment; a packed case's control is the equal-length
case of the same tokens) and the target.

    python tools/gpu/variants_gluon_summary.py RESULTS.json [FLEX.json] > summary.md

Optional flex numbers come from tools/gpu/variants_gluon.py's JSON (its speed rows).
A developer tool, not installed.
"""

from __future__ import annotations

import json
import sys

# (what the case id's last segment starts with, the target's ratio to the control, words)
TARGETS = (
    ("win4096", 0.85, "window 4k causal"),
    ("cap50", 0.90, "softcap 50"),
    ("alibi", 0.90, "ALiBi"),
    ("var-", 0.90, "packed (vs equal lengths)"),
)


def _control_id(case_id: str) -> str:
    """The dense control's id: the id without its variant segment."""
    head, _, _last = case_id.rpartition("/")
    return head


def rows(results: dict) -> list[dict]:
    """One row per variant case of the run: TFLOP/s, its control's, the ratio, target."""
    by_id = {c["id"]: c for c in results["cases"]}
    out = []
    for case in results["cases"]:
        last = case["id"].rpartition("/")[2]
        for prefix, target, words in TARGETS:
            if not last.startswith(prefix):
                continue
            control = by_id.get(_control_id(case["id"]))
            if prefix == "var-":  # the packed control: the equal-length case (no varlen)
                control = _packed_control(results["cases"], case)
            ours, base = case.get("tflops"), control.get("tflops") if control else None
            ratio = ours / base if ours and base else None
            out.append(dict(
                variant=words, id=case["id"], status=case["status"], backend=case["backend"],
                tflops=ours, control=base, ratio=ratio, target=target,
                met=None if ratio is None else ratio >= target,
                accuracy=(case.get("accuracy") or {}).get("passed"),
            ))  # fmt: skip
    return out


def _packed_control(cases: list[dict], packed: dict) -> dict | None:
    """The equal-length case of the same impl, mode, dtype and heads (no varlen)."""
    for c in cases:
        same = all(c[k] == packed[k] for k in ("impl", "mode", "dtype", "heads_q", "head_dim"))
        if same and not c.get("varlen") and c["id"].endswith("/causal") and c["seqlen_q"] == 2048:
            return c
    return None


def markdown(table: list[dict], flex: dict | None = None) -> str:
    lines = [
        "| variant | ours TFLOP/s | dense control | ratio | target | met | accuracy | backend |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in table:
        fmt = lambda x: f"{x:.1f}" if isinstance(x, float) else "-"  # noqa: E731
        ratio = f"{r['ratio']:.3f}" if r["ratio"] is not None else "-"
        met = {True: "yes", False: "NO", None: "-"}[r["met"]]
        lines.append(
            f"| {r['variant']} | {fmt(r['tflops'])} | {fmt(r['control'])} | {ratio} | "
            f">= {r['target']} | {met} | {r['accuracy']} | {r['backend']} |"
        )
    if flex:
        lines += ["", "flex (tools/gpu/variants_gluon.py, same shapes, its own timing):", ""]
        for row in flex.get("speed", []):
            if isinstance(row.get("flex"), float) and isinstance(row.get("gluon"), float):
                ratio = row["gluon"] / row["flex"]
                lines.append(f"- {row['variant']}: ours / flex {ratio:.3f} (>= 1.0 wanted)")
    return "\n".join(lines) + "\n"


def main() -> int:
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    try:
        with open(sys.argv[1]) as f:
            results = json.load(f)
    except (OSError, ValueError) as e:  # the run did not get to write its results
        print(f"no fa-bench results to summarise: {e}")
        return 1
    flex = None
    try:
        with open(sys.argv[2]) as f:
            flex = json.load(f)
    except (IndexError, OSError, ValueError):
        flex = None
    print(markdown(rows(results), flex))
    return 0


if __name__ == "__main__":
    sys.exit(main())
