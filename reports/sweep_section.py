"""Turns sweep.json documents into what the report page shows (figures + table rows)."""

from __future__ import annotations

from fa_bench.reports.figures import Figure
from fa_bench.reports.sweep_figures import sweep_section


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{x:+.1%}"


def sweep_parts(sweeps: list[dict]) -> tuple[list[Figure], list[dict]]:
    """Heatmap figures and, per swept case, the headline, top configs and rules."""
    figs: list[Figure] = []
    sections: list[dict] = []
    for s_index, doc in enumerate(sweeps):
        for c_index, part in enumerate(sweep_section(doc)):
            fig_id = f"sweep-{s_index}-{c_index}"
            figs.append(Figure(fig_id, f"Sweep: {part['case_id']}", "", part["heatmap"]))
            summary = part["summary"]
            if summary.get("best"):
                headline = (
                    f"Best: {summary['best']} at {summary['best_tflops']:.1f} TFLOP/s; the "
                    f"default heuristic ({summary['default']}) "
                    + (
                        f"reached {summary['default_tflops']:.1f}, so the sweep gains "
                        f"{_pct(summary['gain_over_default'])}."
                        if summary.get("default_tflops")
                        else "did not run ok."
                    )
                )
            else:
                headline = f"No config ran ok ({summary.get('counts')})."
            sections.append({
                "case_id": part["case_id"],
                "figure_id": fig_id,
                "headline": headline,
                "top": [{**t, "vs_default": _pct(t["gain_over_default"])} for t in part["top"]],
                "rules": [
                    {"rule": r["rule"], "block": r["block"] if r["block"] else "–",
                     "tflops": f"{r['tflops']:.1f}" if r.get("tflops") else "–",
                     "rank": f"{r['rank']} of {r['of']}" if r.get("rank") else "–",
                     "note": r.get("note") or ""}
                    for r in part["rules"]
                ],
            })  # fmt: skip
    return figs, sections
