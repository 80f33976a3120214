"""A/B timings of the Gluon backward's launches (issue 18, session 6): one command.

    python tools/gpu/gluon_bwd_ab.py [--roles128 ws,ws-sdq] [--roles64 ws,ws-early]

For each shape (bf16, 16k tokens, hidden 2048; head_dim 128 then 64, 4k and 16k, causal
and not) `triton.testing.do_bench` TFLOP/s (FLOPs 2.5 × the forward's) of the Gluon
kernel alone for each role of `candidate_bwd_configs` named (the first is the baseline;
each role's gradients are compared with the baseline's: dK/dV bitwise, dQ's largest
relative difference),
the baseline's kernel without its dQ reduce-adds (probe=2: dQ wrong, the time the adds
cost), with AB_WHOLE=1 the heuristic's whole backward (delta, kernel, dQ cast), and SDPA's
cuDNN backward (`autograd.grad`
with a retained graph). One child per head_dim, killed when its lines stop growing for
STALL_S seconds (a hang costs that child only). Writes $OUT/gluon_bwd_ab.md and
gluon_bwd_ab.json. Needs CUDA (sm_90, triton 3.6); a developer tool, not installed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from child_watch import emit as _emit
from child_watch import run_watched

# a child killed when its lines stop growing this long ($AB_STALL_S overrides: a hang costs
# that much of the call)
STALL_S = float(os.environ.get("AB_STALL_S", "60"))
SHAPES = [(n, c) for n in (4096, 16384) for c in (False, True)]
ROLES = {128: "ws,ws-early2,ws-dqfirst", 64: "ws,ws-dqfirst"}


def _time(fn, case) -> dict:
    from triton.testing import do_bench

    from fa_bench.models import case_flops

    fn()  # compile outside the timing
    ms = do_bench(fn, warmup=5, rep=30)
    return dict(ms=round(ms, 4), tflops=round(case_flops(case) / (ms * 1e-3) / 1e12, 1))


def bench_shape(head_dim: int, n: int, causal: bool, roles: list[str]) -> Iterator[dict]:
    """Rows of one shape: each role's kernel, the first role's kernel without its adds,
    the heuristic's whole backward, cuDNN's backward."""
    import importlib

    import torch
    from gluon_bwd_check import _bench_setup
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from fa_bench.kernels import flash_gluon_bwd as gb
    from fa_bench.kernels.flash_config import heuristic_config

    fa = importlib.import_module("fa_bench.kernels.flash_attention")
    q, k, v, do, case = _bench_setup(head_dim, n, causal)
    scale = 1.0 / math.sqrt(head_dim)
    base = heuristic_config(head_dim, q.dtype, causal, q.device, n)
    o, lse2 = fa._forward(q, k, v, causal, scale, base)
    delta = fa._preprocess(do, o, lse2)
    ws = torch.zeros(q.shape, device="cuda", dtype=torch.float32)
    grads = (q, k, v, do, torch.empty_like(k), torch.empty_like(v), ws)
    cands = gb.candidate_bwd_configs(head_dim)
    runs = {}
    for role in roles:
        cfg = cands[role]
        runs[role] = lambda cfg=cfg: gb._launch(cfg, grads, lse2, delta, causal, scale)
    first = cands[roles[0]]
    if os.environ.get("AB_PROBE", "1") == "1":  # AB_PROBE=0: two compiles fewer per dim
        runs["no-adds"] = lambda: gb._launch(first, grads, lse2, delta, causal, scale, probe=2)
    if os.environ.get("AB_WHOLE") == "1":  # one more compile per shape: off by default
        runs["gluon-whole"] = lambda: gb.gluon_backward(do, q, k, v, o, lse2, causal, scale)
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        oc = torch.nn.functional.scaled_dot_product_attention(*leaves, is_causal=causal)
    runs["cudnn"] = lambda: torch.autograd.grad(oc, leaves, do, retain_graph=True)
    base_grads = None
    for name, fn in runs.items():  # each row as it comes: the watcher sees progress
        row = dict(kind="bench", impl=name, head_dim=head_dim, n=n, causal=causal)
        label = cands[name].label() if name in cands else ""
        try:
            row.update(_time(fn, case), label=label)
            if name in cands:  # its gradients against the first role's (same compile)
                grads_r = gb.gluon_backward(do, q, k, v, o, lse2, causal, scale, cands[name])
                base_grads = base_grads or grads_r
                row.update(agreement(grads_r, base_grads))
        except Exception as e:
            row["error"] = f"{type(e).__name__}: {e}"[:400]
        yield row


def agreement(grads, base) -> dict:
    """How a role's (dq, dk, dv) differ from the baseline role's on the same inputs: dK
    and dV bitwise (the same sums in the same order), dQ's largest difference relative
    to its largest value (its reduce-adds land in any order: ~1e-3 at bf16)."""
    dq, dk, dv = grads
    rel = ((dq.float() - base[0].float()).abs().max() / base[0].float().abs().max()).item()
    same = bool(dk.equal(base[1]) and dv.equal(base[2]))
    return dict(dq_rel=float(f"{rel:.3g}"), dkdv_same=same)


def child(lines: str, head_dim: int, roles: list[str]) -> None:
    for n, causal in SHAPES:
        _emit(lines, dict(kind="start", head_dim=head_dim, n=n, causal=causal))
        for row in bench_shape(head_dim, n, causal, roles):
            _emit(lines, row)


def markdown(doc: dict) -> str:
    """The table: TFLOP/s (ms) per shape and launch, and each ÷ cuDNN."""
    out = ["# Gluon backward A/B (issue 18, session 6)", "", "```", json.dumps(doc["env"]),
           "```", ""]  # fmt: skip
    out += [
        f"- child {c['child']}: {c['status'][:300]} ({c['seconds']} s)" for c in doc["children"]
    ]
    cells: dict = {}
    for r in doc["rows"]:
        if r["kind"] == "bench":
            cells.setdefault((r["head_dim"], r["n"], r["causal"]), {})[r["impl"]] = r
    for d in (int(x) for x in doc["roles"]):  # the head dims measured (--dims), in order
        names = [*doc["roles"][str(d)], "no-adds", "gluon-whole", "cudnn"]
        out += ["", f"head_dim {d}, bf16, backward TFLOP/s (do_bench ms); ÷ cuDNN in brackets "
                f"after; roles: kernel alone; no-adds: {names[0]} without dQ reduce-adds", "",
                "| N | causal | " + " | ".join(names) + " |",
                "|---|---|" + "---|" * len(names)]  # fmt: skip
        for (hd, n, c), row in sorted(cells.items()):
            if hd != d:
                continue
            ref = row.get("cudnn", {}).get("tflops")

            def fig(name, row=row, ref=ref):
                r = row.get(name, {})
                if "tflops" not in r:
                    return r.get("error", "–")[:50]
                rel = f" [{r['tflops'] / ref:.3f}]" if ref else ""
                same = {True: "", False: " dK/dV DIFFER"}.get(r.get("dkdv_same"), "")
                dq = f" dq {r['dq_rel']:.1e}{same}" if "dq_rel" in r else ""
                return f"{r['tflops']} ({r['ms']}){rel}{dq}"

            out.append(f"| {n // 1024}k | {'yes' if c else 'no'} | "
                       + " | ".join(fig(x) for x in names) + " |")  # fmt: skip
    return "\n".join(out) + "\n"


def parent(roles: dict[int, list[str]]) -> int:
    import torch
    import triton

    from fa_bench.kernels.flash_gluon_bwd import candidate_bwd_configs

    out_dir = Path(os.environ.get("OUT", "fa-bench-out/out"))
    out_dir.mkdir(parents=True, exist_ok=True)
    lines = str(out_dir / "gluon-bwd-ab-lines.jsonl")
    if os.path.exists(lines):
        os.remove(lines)
    env = dict(device=torch.cuda.get_device_name(0), torch=torch.__version__,
               triton=triton.__version__,
               configs={d: {r: candidate_bwd_configs(d)[r].label() for r in roles[d]}
                        for d in roles})  # fmt: skip
    children = []
    for d, names in roles.items():
        args = [sys.executable, __file__, "--child", str(d), "--lines", lines,
                f"--roles{d}", ",".join(names)]  # fmt: skip
        log = Path(lines).with_name(f"gluon-bwd-ab-{d}.log")
        children.append(run_watched(args, lines, log, f"d{d}", STALL_S))
        print(json.dumps(children[-1]), flush=True)
    rows = [json.loads(x) for x in open(lines)] if os.path.exists(lines) else []
    doc = dict(env=env, children=children, rows=rows, roles={str(d): r for d, r in roles.items()})
    (out_dir / "gluon_bwd_ab.json").write_text(json.dumps(doc, indent=1))
    (out_dir / "gluon_bwd_ab.md").write_text(markdown(doc))
    print((out_dir / "gluon_bwd_ab.md").read_text())
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--roles128", default=ROLES[128])
    ap.add_argument("--roles64", default=ROLES[64])
    ap.add_argument("--dims", default="128,64", help="head dims, in order")
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--lines", help=argparse.SUPPRESS)
    ap.add_argument("--from-lines", help="print the table of a cut run's lines file")
    args = ap.parse_args()
    roles = {d: getattr(args, f"roles{d}").split(",") for d in map(int, args.dims.split(","))}
    if args.from_lines:  # no CUDA needed
        rows = [json.loads(x) for x in open(args.from_lines)]
        doc = dict(env={}, children=[], rows=rows, roles={str(d): r for d, r in roles.items()})
        print(markdown(doc))
        return 0
    if args.child is None:
        return parent(roles)
    try:
        child(args.lines, args.child, roles[args.child])
    except Exception:
        traceback.print_exc()
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
