"""Issue 20's targets, met or missed, from a decode run's results.json (the `decode` suite
or any run with decode cases), with the numbers behind each verdict:

1. batch x KV heads >= 64, context >= 8k, contiguous or pages >= 64: our kernel at
   >= 0.9 x the run's copy bandwidth (each case in scope, the worst first; a ragged
   batch is in scope when its shortest context is);
2. batch 1, context 32k-128k: >= 0.7 x the copy bandwidth;
3. ours >= 1.0 x every peer on every decode case (the exceptions listed, with the peer);
4. NVML's bytes per call within 10% of the byte model on the long-context cases (our
   kernel's cases from 32k on, whose cache outgrows the L2);

then each implementation's statuses and its reasons for `unsupported`.

    python tools/gpu/decode_summary.py results.json [more.json ...] [--copy-gbps N]
        [--json out.json]

The copy bandwidth is the run's calibration (env.telemetry.calibration.gbps_copy), else
--copy-gbps. A development tool, not installed.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter, defaultdict

from decode_check_report import OURS, _copy_gbps, target

from fa_bench.case import Case

LONG_CONTEXT = 32768
_CASE_KEYS = ("impl", "mode", "dtype", "batch", "heads_q", "heads_kv", "seqlen_q", "seqlen_k",
              "head_dim", "causal", "page_size", "ctx_spread")  # fmt: skip
NVML_TOLERANCE = 0.10


def _shape(rec: dict) -> str:
    return rec["id"].split("/", 1)[1]


def _ok_gbps(rec: dict | None) -> float | None:
    if not rec or rec.get("status") != "ok":
        return None
    g = rec.get("gbps_model")
    return g if isinstance(g, (int, float)) and g > 0 else None


def _scope(rec: dict) -> float | None:
    """The issue's fraction of the copy bandwidth for this case, or None: decode_check_report's
    rule on the case's shortest context (a ragged batch of 8k down to 2k is not "contexts
    >= 8k")."""
    shortest = min(Case.from_dict({k: rec[k] for k in _CASE_KEYS if k in rec}).context_lengths())
    return target({**rec, "seqlen_k": shortest})


def _bandwidth_targets(ours: list[dict], copy: float | None) -> dict:
    """Targets 1 and 2: per target level, the cases in scope with their ÷ copy."""
    out: dict = {}
    for want in (0.9, 0.7):
        rows = []
        for rec in ours:
            if _scope(rec) != want:
                continue
            g = _ok_gbps(rec)
            frac = g / copy if g and copy else None
            rows.append({"case": _shape(rec), "gbps": g, "copy_fraction": frac,
                         "status": rec.get("status")})  # fmt: skip
        rows.sort(key=lambda r: (r["copy_fraction"] is not None, r["copy_fraction"] or 0))
        met = [r for r in rows if r["copy_fraction"] is not None and r["copy_fraction"] >= want]
        out[str(want)] = {"target": want, "cases": rows, "met": len(met), "in_scope": len(rows)}
    return out


def _peer_ratios(by_shape: dict[str, dict[str, dict]]) -> dict:
    """Target 3: ours ÷ the best peer per shape where ours and a peer ran."""
    rows = []
    for shape, recs in by_shape.items():
        g = _ok_gbps(recs.get(OURS))
        peers = {impl: _ok_gbps(r) for impl, r in recs.items() if impl != OURS}
        peers = {k: v for k, v in peers.items() if v}
        if not g or not peers:
            continue
        best = max(peers, key=lambda k: peers[k])
        rows.append({"case": shape, "ours_gbps": g, "best_peer": best,
                     "peer_gbps": peers[best], "ratio": g / peers[best]})  # fmt: skip
    rows.sort(key=lambda r: r["ratio"])
    exceptions = [r for r in rows if r["ratio"] < 1.0]
    return {"compared": len(rows), "exceptions": exceptions, "worst": rows[:1]}


def _nvml(ours: list[dict]) -> dict:
    """Target 4: NVML bytes ÷ the byte model on our long-context cases."""
    rows = []
    for rec in ours:
        tel = rec.get("telemetry") or {}
        ratio = tel.get("bytes_ratio_measured_to_model")
        if rec["seqlen_k"] >= LONG_CONTEXT and isinstance(ratio, (int, float)):
            rows.append({"case": _shape(rec), "ratio": ratio})
    bad = [r for r in rows if abs(r["ratio"] - 1) > NVML_TOLERANCE]
    lo = min((r["ratio"] for r in rows), default=None)
    hi = max((r["ratio"] for r in rows), default=None)
    return {"cases": len(rows), "min": lo, "max": hi, "outside": bad}


def _statuses(doc: dict) -> dict:
    counts: dict[str, Counter] = defaultdict(Counter)
    reasons: dict[str, Counter] = defaultdict(Counter)
    for rec in doc["cases"]:
        counts[rec["impl"]][rec["status"]] += 1
        if rec["status"] != "ok":
            reasons[rec["impl"]][f"{rec['status']}: {(rec.get('error') or '')[:160]}"] += 1
    return {
        impl: {"statuses": dict(c), "reasons": dict(reasons[impl])} for impl, c in counts.items()
    }


def summarize(doc: dict, copy_override: float | None = None) -> dict:
    cases = [r for r in doc["cases"] if r.get("mode") == "decode"]
    ours = [r for r in cases if r["impl"] == OURS]
    by_shape: dict[str, dict[str, dict]] = defaultdict(dict)
    for rec in cases:
        by_shape[_shape(rec)][rec["impl"]] = rec
    copy = _copy_gbps(doc) or copy_override
    return {
        "copy_gbps": copy,
        "cases": len(cases),
        "bandwidth": _bandwidth_targets(ours, copy),
        "peers": _peer_ratios(by_shape),
        "nvml": _nvml(ours),
        "impls": _statuses({"cases": cases}),
    }


def _f(x: float | None, fmt: str = ".2f") -> str:
    return "–" if x is None else format(x, fmt)


def markdown(s: dict) -> str:
    lines = [f"# issue 20 targets ({s['cases']} decode cases; copy bandwidth "
             f"{_f(s['copy_gbps'], '.0f')} GB/s)", ""]  # fmt: skip
    names = {"0.9": "1. batch x KV heads >= 64, context >= 8k, contiguous or pages >= 64",
             "0.7": "2. batch 1, context 32k-128k"}  # fmt: skip
    for key, t in s["bandwidth"].items():
        verdict = "MET" if t["in_scope"] and t["met"] == t["in_scope"] else "MISSED"
        if not t["in_scope"]:
            verdict = "NOT MEASURED"
        lines += [f"## {names[key]}: >= {t['target']} x copy: {verdict} "
                  f"({t['met']} of {t['in_scope']} cases)", "",
                  "| case | ours GB/s | ÷ copy |", "|---|---|---|"]  # fmt: skip
        lines += [f"| {r['case']} | {_f(r['gbps'], '.0f') if r['gbps'] else r['status']} | "
                  f"{_f(r['copy_fraction'])} |" for r in t["cases"]]  # fmt: skip
        lines.append("")
    p = s["peers"]
    verdict = "MET" if p["compared"] and not p["exceptions"] else "MISSED"
    lines += [f"## 3. ours >= 1.0 x every peer: {verdict if p['compared'] else 'NOT MEASURED'} "
              f"({p['compared'] - len(p['exceptions'])} of {p['compared']} cases)", ""]  # fmt: skip
    if p["exceptions"]:
        lines += ["| exception | ours GB/s | best peer | its GB/s | ours ÷ peer |",
                  "|---|---|---|---|---|"]  # fmt: skip
        lines += [
            f"| {r['case']} | {r['ours_gbps']:.0f} | {r['best_peer']} | "
            f"{r['peer_gbps']:.0f} | {r['ratio']:.3f} |"
            for r in p["exceptions"]
        ]
    lines.append("")
    n = s["nvml"]
    verdict = "MET" if n["cases"] and not n["outside"] else "MISSED"
    lines += [f"## 4. NVML bytes ÷ model within {NVML_TOLERANCE:.0%} (ours, context >= "
              f"{LONG_CONTEXT // 1024}k): {verdict if n['cases'] else 'NOT MEASURED'} "
              f"({n['cases']} cases, {_f(n['min'])}-{_f(n['max'])})", ""]  # fmt: skip
    lines += [f"- outside: {r['case']}: {r['ratio']:.3f}" for r in n["outside"]]
    lines += ["", "## Statuses", ""]
    for impl, st in sorted(s["impls"].items()):
        counts = ", ".join(f"{k} {v}" for k, v in sorted(st["statuses"].items()))
        lines.append(f"- {impl}: {counts}")
        lines += [f"  - {n_} x {why}" for why, n_ in st["reasons"].items()]
    return "\n".join(lines) + "\n"


def merge(docs: list[dict]) -> dict:
    """Several runs' results as one: their cases by id (a later run's case replaces an
    earlier one's) and the env of the first run that measured a copy bandwidth, which
    then divides every case's GB/s (the runs are meant to be calls of one session on one
    GPU model)."""
    cases: dict[str, dict] = {}
    for doc in docs:
        cases.update((rec["id"], rec) for rec in doc["cases"])
    env = next((d.get("env") for d in docs if _copy_gbps(d)), docs[0].get("env"))
    return {"run": docs[0].get("run", {}), "env": env, "cases": list(cases.values())}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="issue 20's targets from results.json files")
    ap.add_argument("results", nargs="+", help="results.json of one run, or of several")
    ap.add_argument("--copy-gbps", type=float, default=None)
    ap.add_argument("--json", help="also write the summary here")
    args = ap.parse_args(argv)
    docs = []
    for path in args.results:
        with open(path) as f:
            docs.append(json.load(f))
    s = summarize(merge(docs), args.copy_gbps)
    print(markdown(s), end="")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(s, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
