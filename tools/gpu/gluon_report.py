"""gluon.md from gluon_check.py's rows: the children's status, correctness per config,
and the TFLOP/s table (each Gluon config, our `tl` forward, SDPA cuDNN, best Gluon ÷ cuDNN).

    python tools/gpu/gluon_report.py OUT/gluon.json     # prints the Markdown
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict


def _correctness(rows: list[dict]) -> list[str]:
    checks = [r for r in rows if r.get("kind") == "check"]
    by_config: dict[str, list[dict]] = defaultdict(list)
    for r in checks:
        by_config[r["config"]].append(r)
    out = [
        "## Correctness (fa_bench.run.accuracy's rule; `tl` backward on the Gluon (o, lse2))",
        "",
        "| config | passed | failed | first failures |",
        "|---|---|---|---|",
    ]
    for config, rs in by_config.items():
        bad = [r for r in rs if not r.get("passed")]
        shown = "; ".join(_failure(r) for r in bad[:4])
        out.append(f"| {config} | {len(rs) - len(bad)} | {len(bad)} | {shown} |")
    return [*out, ""]


def _failure(r: dict) -> str:
    where = f"{r['dtype']} d{r['head_dim']} c{int(r['causal'])} {r['shape']}"
    if "error" in r:
        return f"{where}: {r['error'][:160]}"
    parts = []
    if not r.get("fwd_passed", True):
        parts.append(f"o err {r['o_err']:.3g} over the rule")
    if not r.get("layout_ok", True):
        parts.append("o not in q's layout or lse2 shape wrong")
    if not r.get("no_key_rows_ok", True):
        parts.append("rows with no key not (0, +inf)")
    if not r.get("bwd_passed", True):
        parts.append(f"bwd err {r['bwd_err']:.3g}")
    return f"{where}: {', '.join(parts)}"


def _bench(rows: list[dict]) -> list[str]:
    bench = [r for r in rows if r.get("kind") == "bench"]
    configs: list[str] = []
    table: dict[tuple, dict[str, str]] = defaultdict(dict)
    best: dict[tuple, float] = {}
    for r in bench:
        if r["config"] not in configs:
            configs.append(r["config"])
        key = (r["dtype"], r["head_dim"], r["n"], r["causal"])
        if "tflops" in r:
            table[key][r["config"]] = f"{r['tflops']:.1f}"
            if r["config"] not in ("tl", "cudnn"):
                best[key] = max(best.get(key, 0.0), r["tflops"])
        else:
            table[key][r["config"]] = "err"
    gluon = [c for c in configs if c not in ("tl", "cudnn")]
    cols = gluon + [c for c in ("tl", "cudnn") if c in configs]
    out = [
        "## Forward TFLOP/s (do_bench, L2 flushed; 16k tokens, hidden 2048; case_flops)",
        "",
        "| dtype | D | N | causal | " + " | ".join(cols) + " | best gluon ÷ cuDNN | ÷ tl |",
        "|" + "---|" * (len(cols) + 6),
    ]
    for key in sorted(table):
        cells = [table[key].get(c, "") for c in cols]
        ratio = tl_ratio = ""
        cudnn = _num(table[key].get("cudnn"))
        tl = _num(table[key].get("tl"))
        if key in best and cudnn:
            ratio = f"{best[key] / cudnn:.3f}"
        if key in best and tl:
            tl_ratio = f"{best[key] / tl:.3f}"
        dtype, d, n, causal = key
        out.append(
            f"| {dtype} | {d} | {n // 1024}k | {'yes' if causal else 'no'} | "
            + " | ".join(cells)
            + f" | {ratio} | {tl_ratio} |"
        )
    errors = [r for r in bench if "error" in r]
    if errors:
        out += ["", "Timing errors:", ""]
        out += [
            f"- {r['config']} {r['dtype']} d{r['head_dim']} {r['n']} c{int(r['causal'])}: "
            f"{r['error'][:200]}"
            for r in errors[:20]
        ]
    return [*out, ""]


def _num(text: str | None) -> float | None:
    try:
        return float(text) if text else None
    except ValueError:
        return None


def markdown(doc: dict) -> str:
    lines = [
        "# Gluon forward check (tools/gpu/gluon_check.py)",
        "",
        "```",
        json.dumps(doc["env"]),
        "```",
        "",
        "| child | status | seconds |",
        "|---|---|---|",
    ]
    for c in doc["children"]:
        status = c["status"].replace("\n", " ").replace("|", "/")[:300]
        lines.append(f"| {c['child']} | {status} | {c['seconds']} |")
    lines.append("")
    lines += _correctness(doc["rows"])
    lines += _bench(doc["rows"])
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        print(markdown(json.load(f)))
