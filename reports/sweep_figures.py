"""Figures and tables of the sweep section, built from a sweep.json document (pure functions).

Per case: a BLOCK_M × BLOCK_N heatmap (best TFLOP/s over warps and stages, annotated;
empty cells were pruned, failed or not measured), the top configs, the gain of the best
over the default heuristic, and where each rule of thumb would have landed.
"""

from __future__ import annotations

from fa_bench.case import Case
from fa_bench.sweep.space import case_rules


def case_rows(doc: dict, case_id: str) -> list[dict]:
    return [r for r in doc["rows"] if r["case_id"] == case_id]


def heatmap_cells(rows: list[dict]) -> dict[tuple[int, int], dict]:
    """(block_m, block_n) -> the fastest ok row of that tile (over warps and stages)."""
    cells: dict[tuple[int, int], dict] = {}
    for r in rows:
        if r["status"] != "ok" or not r["tflops"]:
            continue
        key = (r["config"]["block_m"], r["config"]["block_n"])
        if key not in cells or r["tflops"] > cells[key]["tflops"]:
            cells[key] = r
    return cells


def heatmap_figure(doc: dict, case_id: str) -> object:
    import plotly.graph_objects as go

    from fa_bench.reports.figures import esc  # the case id is data: plotly reads markup

    rows = case_rows(doc, case_id)
    cells = heatmap_cells(rows)
    ms = sorted({r["config"]["block_m"] for r in rows})
    ns = sorted({r["config"]["block_n"] for r in rows})
    z = [[cells[(m, n)]["tflops"] if (m, n) in cells else None for n in ns] for m in ms]
    text = [[_cell_text(cells[(m, n)]) if (m, n) in cells else "–" for n in ns] for m in ms]
    over = "Gluon launches" if _is_gluon(rows) else "warps × stages"
    fig = go.Figure(
        go.Heatmap(
            z=z, x=[str(n) for n in ns], y=[str(m) for m in ms], text=text,
            texttemplate="%{text}", colorscale="Viridis", colorbar={"title": "TFLOP/s"},
            hovertemplate="BLOCK_M %{y} × BLOCK_N %{x}: %{z:.4g} TFLOP/s<extra></extra>",
        )
    )  # fmt: skip
    fig.update_layout(
        title=f"{esc(case_id)}: best TFLOP/s over {over} (– = pruned, failed or not run)",
        xaxis_title="BLOCK_N",
        yaxis_title="BLOCK_M",
    )
    return fig


def _is_gluon(rows: list[dict]) -> bool:
    """A Gluon forward sweep's rows (`fa-bench sweep --kernel gluon`); older rows: tl."""
    return bool(rows) and rows[0].get("kernel") == "gluon"


def _cell_text(row: dict) -> str:
    """A heatmap cell: TFLOP/s, then warps and stages, or for a Gluon launch its label (the
    variant, ring, ping-pong and persistence the cell's best ran with)."""
    head = f"{row['tflops']:.4g}<br>"
    if row.get("kernel") == "gluon":
        return head + row["label"].removeprefix("gluon-")
    return head + f"w{row['config']['num_warps']} s{row['config']['num_stages']}"


def top_configs(doc: dict, case_id: str, n: int = 5) -> list[dict]:
    """The n fastest ok configs, with their rank and gain over the default heuristic."""
    rows = case_rows(doc, case_id)
    ok = sorted(
        (r for r in rows if r["status"] == "ok" and r["tflops"]), key=lambda r: -r["tflops"]
    )
    default = next((r for r in rows if r["is_default"] and r["status"] == "ok"), None)
    out = []
    for rank, r in enumerate(ok[:n], 1):
        gain = r["tflops"] / default["tflops"] - 1 if default and default["tflops"] else None
        out.append({"rank": rank, "label": r["label"], "tflops": r["tflops"],
                    "median_ms": (r["latency_ms"] or {}).get("median"),
                    "compile_s": r["compile_s"], "is_default": r["is_default"],
                    "gain_over_default": gain})  # fmt: skip
    return out


def rule_of_thumb_table(doc: dict, case_id: str) -> list[dict]:
    """Each rule's square tile, its best TFLOP/s over warps/stages and its rank among the
    case's ok configs (1 = the fastest); `note` says why there is no number."""
    rows = case_rows(doc, case_id)
    if not rows or _is_gluon(rows):  # the rules pick tiles of the `tl` kernel
        return []
    # Every row of a case carries the case's fields.
    rules = case_rules(Case.from_dict(rows[0]), doc["run"].get("smem_limit_bytes"))
    ok = sorted((r["tflops"] for r in rows if r["status"] == "ok" and r["tflops"]), reverse=True)
    cells = heatmap_cells(rows)
    out = []
    for name, block in rules.items():
        entry = {"rule": name, "block": block, "tflops": None, "rank": None, "of": len(ok)}
        if block is None:
            entry["note"] = "the rule says nothing for this case"
        elif (block, block) in cells:
            best = cells[(block, block)]
            entry.update(tflops=best["tflops"], rank=ok.index(best["tflops"]) + 1,
                         label=best["label"], note=None)  # fmt: skip
        else:
            tried = [r for r in rows if r["config"]["block_m"] == block == r["config"]["block_n"]]
            entry["note"] = (
                "not in the swept space"
                if not tried
                else "no ok config: " + ", ".join(sorted({r["status"] for r in tried}))
            )
        out.append(entry)
    return out


def sweep_section(doc: dict) -> list[dict]:
    """Everything the report shows, per case, in sweep order."""
    return [
        {
            "case_id": c["case_id"],
            "summary": c,
            "heatmap": heatmap_figure(doc, c["case_id"]),
            "top": top_configs(doc, c["case_id"]),
            "rules": rule_of_thumb_table(doc, c["case_id"]),
        }
        for c in doc["cases"]
    ]
