"""Check and time the Gluon backward (issue 18) on an sm_90 GPU: one command, ~2 minutes.

    python tools/gpu/gluon_bwd_check.py      # writes $OUT/gluon_bwd.md and gluon_bwd.json

Four children, each killed when it stops making progress for STALL_S seconds (a
deadlock on an mbarrier), so a hang costs one child, not the call:

1. "check": the Gluon backward (`gluon_backward` on our forward's o and lse2) against the
   float64 reference with fa_bench.run.accuracy's rule on dq/dk/dv of every (batch, kv
   head) slice: bf16 and fp16, head_dim 64 and 128, causal and not, odd lengths, Sq ≠ Sk
   both ways (rows without keys under causal), length 1, GQA 4:1 and 2:1, a (B, S, H, D)
   layout; and its gradients against the deterministic two-kernel backward's (their
   difference within the rule's tolerance on the first slice); then one call through
   `flash_attention(deterministic=False, config=FlashConfig(backward="gluon"))`;
2. "bench-gluon": `triton.testing.do_bench` backward TFLOP/s (FLOPs 2.5 × the forward's,
   fa_bench.models.case_flops) of the Gluon backward at bf16, head_dim 128 and 64, 4k and
   16k (16k tokens, hidden 2048), causal and not: the whole backward (delta, kernel,
   dQ cast) and the kernel alone; "bench-variant" (last) the same for VARIANT's roles;
3. "bench-base": the same shapes for our two-kernel backward (`deterministic=True`, the
   default) and SDPA's cuDNN backward. Each timed call is
   `torch.autograd.grad` with a retained graph (the forward runs once per shape).

Needs CUDA (sm_90, triton 3.6); a developer tool, not installed.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from child_watch import emit as _emit
from child_watch import run_watched

STALL_S = 30.0
BUDGET_S = 130.0
# the check child starts no new check after this many seconds (the timings must run)
CHECK_S = 60.0
# the candidate role timed beside the heuristic's ("ws"), per head_dim: FA3's shared
# dQ at 128, 64-row query blocks (the first heuristic's) at 64
VARIANT = {128: "ws-sdq", 64: "ws-m64"}
TOKENS, HIDDEN = 16384, 2048
BENCH = [(d, n, c) for d in (128, 64) for n in (4096, 16384) for c in (False, True)]
# (batch, heads_q, heads_kv, seq_q, seq_k, bshd)
SHAPES = (
    (2, 2, 2, 1000, 1000, False),
    (1, 4, 1, 4097, 4097, False),
    (1, 2, 2, 300, 1000, False),
    (1, 2, 2, 1000, 300, False),
    (1, 2, 2, 1, 1, False),
    (2, 4, 2, 128, 384, True),
    (1, 4, 4, 2048, 2048, False),
)
_DTYPES = {"bf16": "bfloat16", "fp16": "float16"}


def _inputs(shape, dtype, head_dim, seed=0):
    import torch

    batch, hq, hkv, sq, sk, bshd = shape
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def make(heads, seq):
        if bshd:  # a (B, S, H, D) tensor seen as (B, H, S, D): no copy
            t = torch.randn(batch, seq, heads, head_dim, device="cuda", dtype=dtype, generator=gen)
            return t.transpose(1, 2)
        return torch.randn(batch, heads, seq, head_dim, device="cuda", dtype=dtype, generator=gen)

    q, k, v = make(hq, sq), make(hkv, sk), make(hkv, sk)
    return q, k, v, make(hq, sq)


def _case(shape, dtype_name, head_dim, causal, mode="fwd_bwd"):
    from fa_bench.case import Case

    batch, hq, hkv, sq, sk, _ = shape
    return Case(impl="triton", mode=mode, dtype=dtype_name, batch=batch, heads_q=hq,
                heads_kv=hkv, seqlen_q=sq, seqlen_k=sk, head_dim=head_dim,
                causal=causal)  # fmt: skip


def check_slices(shape, dtype_name, head_dim, causal, tensors, other=None) -> dict:
    """fa_bench.run.accuracy's rule on every (batch, kv head) slice (the rule's own cheap
    slice would miss a wrong batch or head offset); `other` (dq, dk, dv of another
    backward): their largest difference and whether it is within the rule's tolerance."""
    from fa_bench.run.accuracy import check_accuracy

    q, k, v, o, do, grads = tensors
    batch, hq, hkv, sq, sk, _ = shape
    group = hq // hkv
    case = _case((1, group, 1, sq, sk, False), dtype_name, head_dim, causal)
    worst, passed, out = 0.0, True, {}
    for b in range(batch):
        for g in range(hkv):
            rows = slice(g * group, (g + 1) * group)
            qs = [t[b : b + 1, rows] for t in (q, o, do, grads[0])]
            kvs = [t[b : b + 1, g : g + 1] for t in (k, v, grads[1], grads[2])]
            report = check_accuracy(case, qs[0], kvs[0], kvs[1], qs[1], do=qs[2], dq=qs[3],
                                    dk=kvs[2], dv=kvs[3])  # fmt: skip
            worst = max(worst, report["max_abs_err"])
            passed = passed and report["passed"]
            for name, t in report["tensors"].items():  # which gradient is off, if one is
                out[f"{name}_err"] = max(out.get(f"{name}_err", 0.0), t["max_abs_err"])
                out[f"{name}_tol"] = min(out.get(f"{name}_tol", math.inf), t["tolerance"])
            if other is not None and b == 0 and g == 0:
                for name, ours, theirs in zip(("dq", "dk", "dv"), grads, other, strict=True):
                    diff = (ours.double() - theirs.double()).abs().max().item()
                    tol = report["tensors"][name]["tolerance"]
                    out[f"{name}_vs_det"] = diff
                    out["det_match"] = out.get("det_match", True) and diff <= tol
    return dict(max_abs_err=worst, passed=passed, **out)


def check_one(shape, dtype_name, head_dim, causal, against_det: bool, role: str = "ws") -> dict:
    import torch

    fa = importlib.import_module("fa_bench.kernels.flash_attention")
    from fa_bench.kernels.flash_config import heuristic_config
    from fa_bench.kernels.flash_gluon_bwd import candidate_bwd_configs, gluon_backward

    dtype = getattr(torch, _DTYPES[dtype_name])
    q, k, v, do = _inputs(shape, dtype, head_dim)
    scale = 1.0 / math.sqrt(head_dim)
    cfg = heuristic_config(head_dim, dtype, causal, q.device, max(shape[3], shape[4]))
    o, lse2 = fa._forward(q, k, v, causal, scale, cfg)
    gcfg = candidate_bwd_configs(head_dim)[role]
    grads = gluon_backward(do, q, k, v, o, lse2, causal, scale, gcfg)
    det = None
    if against_det:
        det = fa._backward_deterministic(do, q, k, v, o, lse2, causal, scale, cfg)
    torch.cuda.synchronize()
    layouts = all(g.stride() == t.stride() for g, t in zip(grads, (q, k, v), strict=True))
    res = check_slices(shape, dtype_name, head_dim, causal, (q, k, v, o, do, grads), det)
    return dict(kind="check", dtype=dtype_name, head_dim=head_dim, causal=causal, role=role,
                shape=list(shape), err=res.pop("max_abs_err"), layout_ok=layouts, **res,
                ok=bool(res["passed"] and res.get("det_match", True) and layouts))  # fmt: skip


def check_api() -> dict:
    """One call through flash_attention with FlashConfig(backward="gluon"): the dispatch."""
    import torch

    from fa_bench.kernels import flash_gluon_bwd
    from fa_bench.kernels.flash_attention import flash_attention
    from fa_bench.kernels.flash_config import FlashConfig

    calls = []
    real = flash_gluon_bwd.gluon_backward
    flash_gluon_bwd.gluon_backward = lambda *a, **kw: calls.append(1) or real(*a, **kw)
    try:
        shape = (1, 4, 2, 777, 777, False)
        q, k, v, do = _inputs(shape, torch.bfloat16, 128)
        q, k, v = (t.requires_grad_() for t in (q, k, v))
        o = flash_attention(q, k, v, causal=True, deterministic=False,
                            config=FlashConfig(backward="gluon"))  # fmt: skip
        grads = torch.autograd.grad(o, (q, k, v), do)
        res = check_slices(shape, "bf16", 128, True, (q, k, v, o, do, grads))
    finally:
        flash_gluon_bwd.gluon_backward = real
    return dict(kind="check", what="flash_attention(backward='gluon')", calls=len(calls),
                err=res["max_abs_err"], ok=bool(res["passed"] and calls))  # fmt: skip


# The checks in order of importance: (role, dtype, head_dim, causal, indices into SHAPES);
# the first of each group is also compared with the deterministic backward (bf16). Call B
# of session 5 passed bf16 d128 non-causal on every shape and causal on the first two.
PLAN = (
    ("ws", "bf16", 128, True, (2, 3, 5)),
    ("ws", "bf16", 64, False, (1, 3)),
    ("ws", "bf16", 64, True, (1, 2)),
    ("api", "", 0, False, ()),
    ("ws", "fp16", 128, False, (1,)),
    ("ws", "fp16", 128, True, (3,)),
    ("ws", "fp16", 64, False, (5,)),
    ("ws", "fp16", 64, True, (1,)),
    ("ws-early", "bf16", 128, False, (0,)),
    ("ws-early", "bf16", 128, True, (1,)),
    ("ws-rot", "bf16", 128, False, (1,)),
    ("ws-pp", "bf16", 128, True, (1,)),
    ("ws-pp", "bf16", 64, False, (3,)),
    ("ws-m64", "bf16", 64, True, (1,)),
    ("ws-sdq", "bf16", 128, False, (0,)),
    ("ws", "bf16", 128, True, (4, 6)),
    ("ws", "bf16", 64, False, (0, 4, 5, 6)),
    ("ws", "bf16", 64, True, (0, 3, 4, 5, 6)),
)


# The final call's checks (tools/gpu/gluon_bwd_final.py): the heuristic's kernel as it
# ships (the early dQ chunk, rotated non-causal) on the shapes that cover it, then more.
FINAL_PLAN = (
    ("ws", "bf16", 128, False, (1, 3)),
    ("ws", "bf16", 128, True, (1, 2)),
    ("ws", "bf16", 64, False, (1, 5)),
    ("ws", "bf16", 64, True, (1, 3)),
    ("api", "", 0, False, ()),
    ("ws", "fp16", 128, False, (0,)),
    ("ws", "fp16", 64, True, (2,)),
    ("ws", "bf16", 128, False, (0, 2, 4, 5, 6)),
    ("ws", "bf16", 128, True, (0, 3, 4, 5, 6)),
)


def child_check(out: str, plan: tuple = PLAN, limit_s: float = CHECK_S) -> None:
    """`plan`'s checks in order until `limit_s` seconds have passed (the rest: skipped
    rows)."""
    start = time.time()
    for role, dtype_name, head_dim, causal, shapes in plan:
        if role == "api":
            try:
                _emit(out, check_api())
            except Exception as e:
                _emit(out, dict(kind="check", what="api", ok=False,
                                error=f"{type(e).__name__}: {e}"))  # fmt: skip
            continue
        for i, index in enumerate(shapes):
            shape = SHAPES[index]
            row = dict(kind="check", dtype=dtype_name, head_dim=head_dim, causal=causal,
                       role=role, shape=list(shape))  # fmt: skip
            if time.time() - start > limit_s:
                _emit(out, {**row, "skipped": True})
                continue
            _emit(out, {**row, "kind": "start"})  # progress, and names a hang's check
            try:
                det = i == 0 and dtype_name == "bf16"  # its kernels compile per shape
                row = check_one(shape, dtype_name, head_dim, causal, det, role)
            except Exception as e:
                row.update(ok=False, error=f"{type(e).__name__}: {e}"[:400])
            _emit(out, row)


def _bench_setup(head_dim, n, causal):
    import torch

    b, h = TOKENS // n, HIDDEN // head_dim
    q, k, v, do = (
        torch.randn(b, h, n, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(4)
    )
    case = _case((b, h, h, n, n, False), "bf16", head_dim, causal, mode="bwd")
    return q, k, v, do, case


def _time(fn, case) -> dict:
    from triton.testing import do_bench

    from fa_bench.models import case_flops

    fn()  # compile outside the timing
    ms = do_bench(fn, warmup=10, rep=50)
    return dict(ms=round(ms, 4), tflops=round(case_flops(case) / (ms * 1e-3) / 1e12, 1))


def child_bench(out: str, which: str) -> None:
    for head_dim, n, causal in BENCH:
        _emit(out, dict(kind="start", which=which, head_dim=head_dim, n=n, causal=causal))
        for row in bench_shape(which, head_dim, n, causal):
            _emit(out, row)


def bench_shape(which: str, head_dim: int, n: int, causal: bool) -> list[dict]:
    """Timings of one shape: "gluon" the Gluon backward whole and its kernel alone
    ("variant": the same for VARIANT's role at this head_dim), "base" our two-kernel and
    `tl` one-pass backwards and cuDNN's."""
    import torch

    from fa_bench.kernels import flash_gluon_bwd as gb
    from fa_bench.kernels.flash_config import FlashConfig, heuristic_config

    fa = importlib.import_module("fa_bench.kernels.flash_attention")
    q, k, v, do, case = _bench_setup(head_dim, n, causal)
    scale = 1.0 / math.sqrt(head_dim)
    base = heuristic_config(head_dim, q.dtype, causal, q.device, n)
    runs = {}
    if which in ("gluon", "variant"):
        roles = gb.candidate_bwd_configs(head_dim)
        role = "ws" if which == "gluon" else VARIANT[head_dim]
        o, lse2 = fa._forward(q, k, v, causal, scale, base)
        cfg = roles[role]
        delta = fa._preprocess(do, o, lse2)
        ws = torch.zeros(q.shape, device="cuda", dtype=torch.float32)
        grads = (q, k, v, do, torch.empty_like(k), torch.empty_like(v), ws)
        name = "gluon" if which == "gluon" else "variant"
        runs[name] = lambda: gb.gluon_backward(do, q, k, v, o, lse2, causal, scale, cfg)
        runs[f"{name}-kernel"] = lambda: gb._launch(cfg, grads, lse2, delta, causal, scale)
        if which == "variant":  # where the heuristic's kernel spends its time (dQ wrong)
            ws_cfg, rot_cfg, early_cfg = roles["ws"], roles["ws-rot"], roles["ws-early"]
            kbm_cfg, pp_cfg = roles["ws-kbmajor"], roles["ws-pp"]
            runs["pp-kernel"] = lambda: gb._launch(pp_cfg, grads, lse2, delta, causal, scale)
            runs["no-reduce"] = lambda: gb._launch(ws_cfg, grads, lse2, delta, causal, scale,
                                                   probe=2)  # fmt: skip
            runs["early-kernel"] = lambda: gb._launch(early_cfg, grads, lse2, delta, causal,
                                                      scale)  # fmt: skip
            if not causal:  # the rotated query-block order (causal CTAs are staggered)
                runs["rot-kernel"] = lambda: gb._launch(rot_cfg, grads, lse2, delta, False,
                                                        scale)  # fmt: skip
            else:  # the first causal grid order
                runs["kbmajor-kernel"] = lambda: gb._launch(kbm_cfg, grads, lse2, delta, True,
                                                            scale)  # fmt: skip
    else:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        # (the `tl` one-pass backward: measured in call B, 350-394 TFLOP/s at d128)
        for name, det in (("two-kernel", True),):
            cfg = FlashConfig(**{**base.__dict__, "backward": "tl"})
            o = fa.flash_attention(*leaves, causal=causal, config=cfg, deterministic=det)
            runs[name] = lambda o=o: torch.autograd.grad(o, leaves, do, retain_graph=True)
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            o = torch.nn.functional.scaled_dot_product_attention(*leaves, is_causal=causal)
        runs["cudnn"] = lambda o=o: torch.autograd.grad(o, leaves, do, retain_graph=True)
    rows = []
    for name, fn in runs.items():
        row = dict(kind="bench", impl=name, head_dim=head_dim, n=n, causal=causal)
        try:
            row.update(_time(fn, case))
        except Exception as e:
            row["error"] = f"{type(e).__name__}: {e}"[:400]
        rows.append(row)
    return rows


def _run_child(args: list[str], lines: str, label: str, script: str = __file__) -> dict:
    """One child, killed when its output stops growing for STALL_S seconds; its stdout
    and stderr go to a log beside the lines (a pipe could fill and block it)."""
    log_path = Path(lines).with_name(f"gluon-bwd-{label}.log")
    return run_watched([sys.executable, script, *args], lines, log_path, label, STALL_S)


def markdown(doc: dict) -> str:
    """The report: environment, children, failed checks, the timing table."""
    rows = doc["rows"]
    checks = [r for r in rows if r["kind"] == "check"]
    skipped = [r for r in checks if r.get("skipped")]
    checks = [r for r in checks if not r.get("skipped")]
    bad = [r for r in checks if not r.get("ok")]
    lines = ["# Gluon backward (issue 18)", "", "```", json.dumps(doc["env"]), "```", ""]
    lines += [f"- child {c['child']}: {c['status'][:300]} ({c['seconds']} s)"
              for c in doc["children"]]  # fmt: skip
    for child in doc["children"]:
        if child["status"].startswith("killed"):  # the check or shape it hung in
            which = child["child"].removeprefix("bench-")
            mine = [r for r in rows if r["kind"] == "start" and r.get("which", "check") == which]
            lines.append(f"- {child['child']} hung in: {json.dumps(mine[-1]) if mine else '?'}")
    lines += ["", f"Checks: {len(checks) - len(bad)} of {len(checks)} passed "
              f"({len(skipped)} not run: time budget)."]  # fmt: skip
    lines += [f"- FAILED {json.dumps(r)[:400]}" for r in bad[:30]]
    bench = {}
    for r in rows:
        if r["kind"] == "bench":
            bench.setdefault((r["head_dim"], r["n"], r["causal"]), {})[r["impl"]] = r
    impls = ["gluon", "gluon-kernel", "no-reduce", "rot-kernel", "early-kernel", "pp-kernel",
             "kbmajor-kernel", "variant", "variant-kernel", "two-kernel", "cudnn"]  # fmt: skip
    head = "| D | N | causal | " + " | ".join(impls) + " | gluon ÷ cuDNN | gluon ÷ two-kernel |"
    lines += ["", "Backward TFLOP/s (bf16, 16k tokens, hidden 2048; do_bench ms in brackets; "
              "no-reduce: the heuristic's kernel without the dQ reduce-adds, a timing probe, "
              "the FLOPs still those of the whole backward; rot-, early-, pp-, kbmajor-kernel: "
              "the kernel of ws-rot, ws-early, ws-pp, ws-kbmajor; variant: "
              + ", ".join(f"d{d} {r}" for d, r in VARIANT.items()) + "):",
              "", head, "|---|---|---|" + "---|" * (len(impls) + 2)]  # fmt: skip
    for (d, n, c), cells in sorted(bench.items(), key=lambda kv: (-kv[0][0], kv[0][1], kv[0][2])):

        def fig(name, cells=cells):
            r = cells.get(name, {})
            return f"{r['tflops']} ({r['ms']})" if "tflops" in r else r.get("error", "–")[:60]

        def ratio(a, b, cells=cells):
            ta, tb = cells.get(a, {}).get("tflops"), cells.get(b, {}).get("tflops")
            return f"{ta / tb:.3f}" if ta and tb else "–"

        ratios = f" | {ratio('gluon', 'cudnn')} | {ratio('gluon', 'two-kernel')} |"
        lines.append(f"| {d} | {n // 1024}k | {'yes' if c else 'no'} | "
                     + " | ".join(fig(i) for i in impls) + ratios)  # fmt: skip
    return "\n".join(lines) + "\n"


def parent() -> int:
    import torch
    import triton

    from fa_bench.kernels.flash_gluon import _api_reason
    from fa_bench.kernels.flash_gluon_bwd import candidate_bwd_configs

    out_dir = Path(os.environ.get("OUT", "fa-bench-out/out"))
    out_dir.mkdir(parents=True, exist_ok=True)
    lines = str(out_dir / "gluon-bwd-lines.jsonl")
    if os.path.exists(lines):
        os.remove(lines)
    started = time.time()
    env = dict(device=torch.cuda.get_device_name(0), torch=torch.__version__,
               triton=triton.__version__, api_reason=_api_reason(),
               configs={d: {r: c.label() for r, c in candidate_bwd_configs(d).items()}
                        for d in (64, 128)})  # fmt: skip
    print(json.dumps(env), flush=True)
    children = []
    for label, args in (("check", ["--child", "check"]), ("bench-gluon", ["--child", "gluon"]),
                        ("bench-base", ["--child", "base"]),
                        ("bench-variant", ["--child", "variant"])):  # fmt: skip
        if time.time() - started > BUDGET_S:
            children.append(dict(child=label, status="skipped: time budget", seconds=0))
            continue
        children.append(_run_child([*args, "--lines", lines], lines, label))
        print(json.dumps(children[-1]), flush=True)
    rows = [json.loads(line) for line in open(lines)] if os.path.exists(lines) else []
    doc = dict(env=env, children=children, rows=rows)
    (out_dir / "gluon_bwd.json").write_text(json.dumps(doc, indent=1))
    (out_dir / "gluon_bwd.md").write_text(markdown(doc))
    print((out_dir / "gluon_bwd.md").read_text())
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--lines", help=argparse.SUPPRESS)
    ap.add_argument("--final", type=float, help=argparse.SUPPRESS)  # FINAL_PLAN for this long
    args = ap.parse_args()
    if not args.child:
        return parent()
    try:
        if args.child == "check":
            if args.final:
                child_check(args.lines, FINAL_PLAN, args.final)
            else:
                child_check(args.lines)
        else:
            child_bench(args.lines, args.child)
    except Exception:
        traceback.print_exc()
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
