"""Markdown for tools/gpu/gluon_d64.py's rows (kept apart so the tests can build it on a CPU)."""

from __future__ import annotations

from collections import defaultdict


def _fmt(x: float | None, digits: int = 1) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def shape_tables(rows: list[dict]) -> dict[tuple, dict[str, dict]]:
    """{(dtype, head_dim, causal): {role: {"label", "check", n: tflops}}} from the rows."""
    out: dict[tuple, dict[str, dict]] = defaultdict(dict)
    for row in rows:
        if row.get("kind") not in ("check", "bench"):
            continue
        key = (row["dtype"], row["head_dim"], row["causal"])
        cell = out[key].setdefault(row["role"], {"label": row.get("label", row["role"])})
        if row["kind"] == "check":
            error = row.get("error", "")
            diag = error.startswith("diagnostic")
            cell["check"] = "pass" if row.get("passed") else ("diag" if diag else f"FAIL {error}")
            cell["err"] = row.get("max_abs_err")
        else:
            cell[row["n"]] = row.get("tflops")
            if "error" in row:
                cell["bench_error"] = row["error"]
    return out


def winners(tables: dict, target: float, ns: tuple[int, ...] = (4096, 16384)) -> list[str]:
    """Launches at or above `target` × cuDNN at every N of their shape (passing checks)."""
    found = []
    for (dtype, head_dim, causal), roles in sorted(tables.items(), key=str):
        ref = roles.get("cudnn", {})
        for role, cell in roles.items():
            if role == "cudnn" or cell.get("check") != "pass":
                continue
            ratios = [cell[n] / ref[n] for n in ns if cell.get(n) and ref.get(n)]
            if len(ratios) == len(ns) and min(ratios) >= target:
                found.append(
                    f"{dtype} d{head_dim} {'causal' if causal else 'non-causal'}: {role} "
                    f"({cell['label']}) {' / '.join(f'{r:.3f}' for r in ratios)}"
                )
    return found


def markdown(rows: list[dict], target: float = 1.02) -> str:
    env = next((r for r in rows if r.get("kind") == "env"), {})
    lines = [
        "# Gluon forward at head_dim 64: exp2 split and variants (tools/gpu/gluon_d64.py)",
        "",
        f"{env.get('device', '?')}, torch {env.get('torch', '?')}, triton "
        f"{env.get('triton', '?')}; do_bench TFLOP/s, 16k tokens, hidden 2048; cuDNN = SDPA's "
        "cuDNN backend in the same process.",
        "",
    ]
    warm = [r for r in rows if r.get("kind") == "warm"]
    bad = [r for r in warm if r.get("error")]
    if warm:
        lines.append(f"Compiled {len(warm)} launches ({len(bad)} failed).")
        lines += [f"- compile FAILED {r['label']}: {r['error']}" for r in bad]
        lines.append("")
    tables = shape_tables(rows)
    for (dtype, head_dim, causal), roles in tables.items():
        ref = roles.get("cudnn", {})
        base = roles.get("heuristic", {})
        lines += [
            f"## {dtype} d{head_dim} {'causal' if causal else 'non-causal'}",
            "",
            "| role | launch | check | 4k | 16k | ÷ cuDNN 4k | ÷ cuDNN 16k | ÷ heur. 4k "
            "| ÷ heur. 16k |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for role, cell in roles.items():
            vals = {n: cell.get(n) for n in (4096, 16384)}
            rc = [v / ref[n] if v and ref.get(n) else None for n, v in vals.items()]
            rh = [v / base[n] if v and base.get(n) else None for n, v in vals.items()]
            lines.append(
                f"| {role} | {cell['label']} | {cell.get('check', '')} | {_fmt(vals[4096])} | "
                f"{_fmt(vals[16384])} | {_fmt(rc[0], 3)} | {_fmt(rc[1], 3)} | {_fmt(rh[0], 3)} | "
                f"{_fmt(rh[1], 3)} |"
            )
        lines.append("")
    skipped = [r for r in rows if r.get("kind") == "skipped"]
    lines += [
        f"- skipped (budget): {r['dtype']} d{r['head_dim']} causal={r['causal']}" for r in skipped
    ]
    found = winners(tables, target)
    lines.append(f"At or above {target}× cuDNN at 4k and 16k:")
    lines += [f"- {w}" for w in found] or ["- none"]
    return "\n".join(lines) + "\n"
