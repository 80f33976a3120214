"""The summary of tools/gpu/fp8_gluon_check.py's results: `markdown(doc)`, written to
$OUT/fp8_gluon.md. Per role: its correctness checks (passed / run, the worst error
against its tolerance, the lse's largest error beside the `tl` fp8 kernel's), then the
TFLOP/s of every role beside the bf16 forward and the `tl` fp8 kernel, with the best
fp8 ÷ bf16 per shape against issue 21's target (≥ 1.3×)."""

from __future__ import annotations

TARGET = 1.3


def _checks(rows: list[dict]) -> list[str]:
    head = (
        "| role | launch | head_dim | passed | worst err / tol | lse2 err (tl fp8's) | failures |"
    )
    out = [head, "|---|---|---|---|---|---|---|"]
    keys = sorted({(r["role"], r.get("label", ""), r["head_dim"]) for r in rows},
                  key=lambda k: (k[0], -k[2]))  # fmt: skip
    for role, label, head_dim in keys:
        mine = [r for r in rows if (r["role"], r.get("label", ""), r["head_dim"]) ==
                (role, label, head_dim)]  # fmt: skip
        ok = sum(bool(r["passed"]) for r in mine)
        timed = [r for r in mine if "err" in r]
        worst = max(timed, key=lambda r: r["err"] / max(r["tol"], 1e-30), default=None)
        ratio = f"{worst['err']:.4f} / {worst['tol']:.4f}" if worst else "-"
        lse = max((r["lse2_err"] for r in timed), default=float("nan"))
        tl_lse = max((r.get("tl_lse2_err", float("nan")) for r in timed), default=float("nan"))
        bad = [f"{r['shape']}: {r.get('error', 'rule')}" for r in mine if not r["passed"]]
        out.append(f"| {role} | {label} | {head_dim} | {ok}/{len(mine)} | {ratio} | "
                   f"{lse:.2e} ({tl_lse:.2e}) | {'; '.join(bad)[:300]} |")  # fmt: skip
    return out


def _bench(rows: list[dict]) -> list[str]:
    roles = []
    for r in rows:
        if r["role"] not in roles:
            roles.append(r["role"])
    fp8_roles = [r for r in roles if r not in ("bf16", "tl-fp8")]
    shapes = sorted({(r["head_dim"], r["n"], r["causal"]) for r in rows},
                    key=lambda s: (-s[0], s[2], s[1]))  # fmt: skip
    head = ["D", "N", "causal", *roles, "best fp8 role", "best ÷ bf16", f"≥ {TARGET}×"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for head_dim, n, causal in shapes:
        got = {r["role"]: r for r in rows if (r["head_dim"], r["n"], r["causal"]) ==
               (head_dim, n, causal)}  # fmt: skip
        cells = []
        for role in roles:
            r = got.get(role)
            mark = " ✗" if r is not None and r.get("failed_checks") else ""
            value = "-" if r is None else f"{r['tflops']:.1f}{mark}" if "tflops" in r else "err"
            cells.append(value)
        # the best role among those that passed their checks
        ok = [r for r in fp8_roles if r in got and not got[r].get("failed_checks")]
        timed = [(got[r]["tflops"], r) for r in ok if "tflops" in got[r]]
        best = max(timed, default=None)
        base = got.get("bf16", {}).get("tflops")
        if best and base:
            ratio = best[0] / base
            cells += [best[1], f"{ratio:.3f}", "yes" if ratio >= TARGET else "no"]
        else:
            cells += ["-", "-", "-"]
        n_text = f"{n // 1024}k" if n % 1024 == 0 else str(n)
        out.append(f"| {head_dim} | {n_text} | {'yes' if causal else 'no'} | " +
                   " | ".join(cells) + " |")  # fmt: skip
    errors = [f"- {r['role']} d{r['head_dim']} {r['n']} causal={r['causal']}: {r['error']}"
              for r in rows if "error" in r]  # fmt: skip
    note = "✗: the role failed a correctness check at this head_dim (timed, never chosen)"
    return [*out, "", note] + (["", *errors] if errors else [])


def markdown(doc: dict) -> str:
    env = doc["env"]
    lines = [
        "# The Gluon fp8 forward on the GPU (tools/gpu/fp8_gluon_check.py)",
        "",
        f"{env.get('device')}, torch {env.get('torch')}, triton {env.get('triton')}",
        "",
        "## Children",
        "",
        *(f"- {c['child']}: {c['status'][:400]} ({c['seconds']} s)" for c in doc["children"]),
        "",
        "## Correctness (fa_bench.run.accuracy.check_fp8_accuracy, every (batch, kv head) slice)",
        "",
        *_checks([r for r in doc["rows"] if r["kind"] == "check"]),
        "",
        "## TFLOP/s (do_bench; 16k tokens, hidden 2048; bf16 = flash_attention's Gluon forward)",
        "",
        *_bench([r for r in doc["rows"] if r["kind"] == "bench"]),
        "",
    ]
    return "\n".join(lines)
