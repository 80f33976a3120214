"""The fp8 check's summary (tools/gpu/fp8_check.sh): from one `fa-bench run` results.json,
per shape our fp8_e4m3 forward against our bf16 forward (target ≥ 1.3×) and sdpa-cudnn's
bf16, then every case's status and accuracy (error, tolerance, pass).

    python tools/gpu/fp8_summary.py RESULTS.json OUT.md
"""

from __future__ import annotations

import sys

from fa_bench.results.files import load_results

TARGET = 1.3


def _shape(c) -> tuple:
    k = c.case
    return (k.head_dim, k.seqlen_q, k.causal)


def _fmt(x: float | None, spec: str = ".1f") -> str:
    return "–" if x is None else format(x, spec)


def summary(path: str) -> str:
    doc = load_results(path)
    by: dict[tuple, dict[str, object]] = {}
    for c in doc.cases:
        by.setdefault(_shape(c), {})[f"{c.impl}/{c.case.dtype.value}"] = c
    lines = [
        "# fp8_e4m3 forward vs bf16 (fa-bench run)",
        "",
        f"Target: fp8 ≥ {TARGET}× our bf16 forward (head_dim 128, N ≥ 4k), every fp8 case "
        "passing its accuracy rule.",
        "",
        "| D | N | causal | triton fp8 TFLOP/s | triton bf16 | fp8 ÷ bf16 | sdpa-cudnn bf16 "
        "| fp8 ÷ cudnn | fp8 backend |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for (d, n, causal), cases in sorted(by.items()):
        fp8, bf16 = cases.get("triton/fp8_e4m3"), cases.get("triton/bf16")
        cudnn = cases.get("sdpa-cudnn/bf16")
        t8 = getattr(fp8, "tflops", None)
        tb = getattr(bf16, "tflops", None)
        tc = getattr(cudnn, "tflops", None)
        ratio = t8 / tb if t8 and tb else None
        vs_cudnn = t8 / tc if t8 and tc else None
        mark = "" if ratio is None else (" ✓" if ratio >= TARGET else " ✗")
        lines.append(
            f"| {d} | {n} | {causal} | {_fmt(t8)} | {_fmt(tb)} | {_fmt(ratio, '.3f')}{mark} "
            f"| {_fmt(tc)} | {_fmt(vs_cudnn, '.3f')} | {getattr(fp8, 'backend', None) or '–'} |"
        )
    lines += ["", "## Every case", "", "| case | status | max abs err | tolerance | passed "
              "| fp8 scales (q, k, v) | error |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for c in doc.cases:
        acc = c.accuracy or {}
        o = (acc.get("tensors") or {}).get("o", {})
        scales = c.fp8_scales
        sc = "–" if not scales else ", ".join(f"{scales[x]:.3g}" for x in ("q", "k", "v"))
        lines.append(
            f"| {c.id} | {c.status.value} | {_fmt(acc.get('max_abs_err'), '.3g')} "
            f"| {_fmt(o.get('tolerance'), '.3g')} | {acc.get('passed', '–')} | {sc} "
            f"| {(c.error or '')[:120]} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    text = summary(argv[0])
    with open(argv[1], "w") as f:
        f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
