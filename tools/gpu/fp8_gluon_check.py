"""Check and time the Gluon fp8 forward (issue 21 part 3) on an H200: one command, ~100 s.

    python tools/gpu/fp8_gluon_check.py [--roles ws,ws-emu2,...]   # $OUT/fp8_gluon.{md,json}

For each role of `flash_gluon_fp8.candidate_configs` (in ROLES' order), in its own child
process (a deadlock on an mbarrier is killed after STALL_S seconds without output and
the next role runs):

1. correctness (the other roles: 3 of the shapes), the launch forced through
   `fp8_gluon_forward`: fa_bench.run.accuracy's fp8 rule (check_fp8_accuracy) on every
   (batch, kv head) slice, causal and not, odd lengths (V's K-major rows padded for
   TMA), GQA 4:1, MQA, Sq ≠ Sk both ways (rows with no key: o = 0, lse2 = +inf),
   length 1, 4k; the lse's largest error against float64
   beside the `tl` fp8 kernel's on the same inputs; head_dim 128 (the heuristic's role
   also 64);
2. `triton.testing.do_bench` TFLOP/s (FLOPs of fa_bench.models.case_flops, the same
   count as bf16) at head_dim 128, N 4k and 16k (16k tokens, hidden 2048), causal and not
   (the heuristic's role also head_dim 64).

A baseline child times, on the same shapes, the bf16 Gluon forward (`flash_attention`'s
dispatch: the "ws" kernel at head_dim 128) and the `tl` fp8 kernel (forward="tl"). The
summary gives fp8 ÷ bf16 per role and shape against issue 21's target (≥ 1.3×). Needs
CUDA; a developer tool, not installed.
"""

from __future__ import annotations

import argparse
import contextlib
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

STALL_S = 25.0
# no child starts after this many seconds ($FP8_GLUON_BUDGET_S overrides)
BUDGET_S = float(os.environ.get("FP8_GLUON_BUDGET_S", "95"))
# in order of importance: roles past the budget are skipped
ROLES = ("ws", "ws-c3", "ws-c3-oinp", "ws-c3-nopp", "ws-ahead", "ws-persist", "ws-lazy",
         "ws-nopp", "ws-s3", "ws-preg", "ws-emu4", "ws-emu2", "ws-preg-emu4", "ws-s2",
         "ws-n64")  # fmt: skip
TOKENS, HIDDEN = 16384, 2048
BENCH_NS = (4096, 16384)
BENCH_SHORT = (1024, 2048)
# (batch, heads_q, heads_kv, seq_q, seq_k, causal)
SHAPES = (
    (2, 4, 4, 1000, 1000, False),
    (2, 4, 4, 1000, 1000, True),
    (1, 8, 2, 784, 1504, True),
    (1, 4, 1, 1504, 784, True),
    (1, 2, 2, 1, 1, False),
    (1, 2, 2, 300, 4097, False),
    (1, 2, 2, 4096, 4096, True),
)

# the other roles, to stay in the budget: odd lengths, rows with no key (MQA), 4k causal
VARIANT_SHAPES = (SHAPES[0], SHAPES[3], SHAPES[6])
# persistent roles also: more tiles (256) than SMs, so CTAs loop over several
PERSIST_SHAPES = ((4, 8, 2, 1000, 1000, True), (4, 8, 2, 1000, 1000, False))
# ... and causal with the (batch, head)s in groups of 12, 12 and 8 (the L2 share set to
# three kv heads' K/V; flash_gluon_fp8_table), a shorter last group included
GROUPED_SHAPE = (4, 8, 2, 1000, 1000, True)


def _quantised(batch, hq, hkv, sq, sk, head_dim, seed=0):
    """(q8, k8, v8 K-major, descales) from bf16 normal inputs, as the benchmark makes them."""
    import torch

    from fa_bench.kernels.flash_fp8 import fp8_v_layout, quantize_fp8

    gen = torch.Generator(device="cuda").manual_seed(seed)

    def make(heads, seq):
        return torch.randn(batch, heads, seq, head_dim, device="cuda", generator=gen).bfloat16()

    (q8, qd), (k8, kd), (v8, vd) = (quantize_fp8(make(h, s)) for h, s in
                                    ((hq, sq), (hkv, sk), (hkv, sk)))  # fmt: skip
    return q8, k8, fp8_v_layout(v8), dict(q_descale=qd, k_descale=kd, v_descale=vd)


def _lse2_err(lse2, q, k, causal) -> float:
    """The largest |lse2 − ref| (log2 domain) over rows that see a key; ref from float64."""
    import torch

    group = q.shape[1] // k.shape[1]
    s = q.double() @ k.double().repeat_interleave(group, dim=1).transpose(-1, -2)
    s = s / math.sqrt(q.shape[-1])
    sq, sk = q.shape[2], k.shape[2]
    if causal:
        keep = torch.ones(sq, sk, dtype=torch.bool, device=q.device).tril(sk - sq)
        s = s.masked_fill(~keep, float("-inf"))
    ref = torch.logsumexp(s, dim=-1) / math.log(2)
    seen = torch.isfinite(ref)
    if not seen.any():
        return 0.0
    return (lse2.double() - ref)[seen].abs().max().item()


def _slices_pass(shape, head_dim, q, k, v, o) -> tuple[bool, float, float]:
    """check_fp8_accuracy on every (batch, kv head) slice: (passed, worst error, its
    tolerance)."""
    from fa_bench.case import Case
    from fa_bench.run.accuracy import check_fp8_accuracy

    batch, hq, hkv, sq, sk, causal = shape
    group = hq // hkv
    case = Case(impl="triton", mode="fwd", dtype="fp8_e4m3", batch=1, heads_q=group,
                heads_kv=1, seqlen_q=sq, seqlen_k=sk, head_dim=head_dim, causal=causal)  # fmt: skip
    passed, worst, tol = True, 0.0, 0.0
    for b in range(batch):
        for h in range(hkv):
            rows = slice(h * group, (h + 1) * group)
            report = check_fp8_accuracy(case, q[b : b + 1, rows], k[b : b + 1, h : h + 1],
                                        v[b : b + 1, h : h + 1], o[b : b + 1, rows])  # fmt: skip
            passed &= bool(report["passed"])
            if report["max_abs_err"] >= worst:
                worst, tol = report["max_abs_err"], report["tensors"]["o"]["tolerance"]
    return passed, worst, tol


def check_one(cfg, shape, head_dim, with_tl: bool) -> dict:
    import torch

    from fa_bench.kernels.flash_config import FlashConfig
    from fa_bench.kernels.flash_fp8 import dequantize_fp8, flash_attention_fp8
    from fa_bench.kernels.flash_gluon_fp8 import fp8_gluon_forward

    batch, hq, hkv, sq, sk, causal = shape
    q8, k8, vt, ds = _quantised(batch, hq, hkv, sq, sk, head_dim, seed=sq + sk)
    scale = 1.0 / math.sqrt(head_dim)
    o, lse2 = fp8_gluon_forward(q8, k8, vt, ds, causal, scale, cfg)
    torch.cuda.synchronize()
    deq = [dequantize_fp8(x, ds[n]) for x, n in ((q8, "q_descale"), (k8, "k_descale"),
                                                  (vt, "v_descale"))]  # fmt: skip
    passed, err, tol = _slices_pass(shape, head_dim, *deq, o)
    empty = max(0, sq - sk) if causal else 0
    no_key_ok = bool(torch.isposinf(lse2[:, :, :empty]).all() and (o[:, :, :empty] == 0).all())
    row = dict(kind="check", shape=list(shape), head_dim=head_dim, passed=passed and no_key_ok,
               err=err, tol=tol, no_key_ok=no_key_ok,
               lse2_err=_lse2_err(lse2, deq[0], deq[1], causal))  # fmt: skip
    if with_tl:  # the `tl` fp8 kernel's lse on the same inputs, for scale
        _o, tl_lse = flash_attention_fp8(q8, k8, vt, **ds, causal=causal, return_lse=True,
                                         config=FlashConfig(forward="tl"))  # fmt: skip
        row["tl_lse2_err"] = _lse2_err(tl_lse / math.log(2), deq[0], deq[1], causal)
    return row


def _tflops(fn, n, head_dim, causal) -> dict:
    import triton

    from fa_bench.case import Case
    from fa_bench.models import case_flops

    fn()  # compile outside the timing
    ms = triton.testing.do_bench(fn, warmup=25, rep=100)
    case = Case(impl="triton", mode="fwd", dtype="fp8_e4m3", batch=TOKENS // n,
                heads_q=HIDDEN // head_dim, heads_kv=HIDDEN // head_dim, seqlen_q=n,
                seqlen_k=n, head_dim=head_dim, causal=causal)  # fmt: skip
    return dict(ms=ms, tflops=case_flops(case) / (ms * 1e-3) / 1e12)


# --quick: every role (and the baseline) at d128 4k/16k only
QUICK = os.environ.get("FP8_GLUON_QUICK") == "1"


def _bench_shapes(role: str):
    """d128 4k/16k causal both; the heuristic's role and the baseline also d64, and 1k/2k
    at d128 (where the automatic dispatch should start taking the Gluon kernel), unless
    QUICK."""
    wide = role in ("ws", "baseline") and not QUICK
    for head_dim in (128, 64) if wide else (128,):
        lengths = BENCH_SHORT + BENCH_NS if wide and head_dim == 128 else BENCH_NS
        for n in lengths:
            for causal in (False, True):
                yield head_dim, n, causal


@contextlib.contextmanager
def _l2_share(share: int | None):
    """flash_gluon_fp8_table.L2_SHARE set to `share` (None: left as it is) meanwhile."""
    from fa_bench.kernels import flash_gluon_fp8_table

    saved = flash_gluon_fp8_table.L2_SHARE
    flash_gluon_fp8_table.L2_SHARE = share or saved
    try:
        yield
    finally:
        flash_gluon_fp8_table.L2_SHARE = saved


def child_role(role: str, out: str, light: bool = False) -> None:
    """One role: its checks, then its timings. `light`: the heuristic's role too gets only
    the other roles' shapes (and one token), after a full run has passed."""
    from fa_bench.kernels.flash_gluon_fp8 import candidate_configs, fp8_gluon_forward

    failed = set()
    for head_dim in (128, 64) if role == "ws" and not light else (128,):
        cfg = candidate_configs(head_dim)[role]
        shapes = SHAPES if role == "ws" and not light else VARIANT_SHAPES
        if role == "ws" and light:
            shapes = (*shapes, SHAPES[4])
        persist = (*PERSIST_SHAPES, GROUPED_SHAPE) if cfg.persistent else ()
        for i, shape in enumerate(shapes + persist):
            grouped = cfg.persistent and i == len(shapes) + len(PERSIST_SHAPES)
            try:
                with _l2_share(3 * 2 * shape[4] * head_dim if grouped else None):
                    row = check_one(cfg, shape, head_dim, with_tl=role == "ws")
            except Exception as e:
                row = dict(kind="check", shape=list(shape), head_dim=head_dim, passed=False,
                           error=f"{type(e).__name__}: {e}"[:400])  # fmt: skip
            row.update(role=role, label=cfg.label())
            if grouped:
                row["bh_groups"] = "12,12,8"
            _emit(out, row)
            if not row["passed"]:
                failed.add(head_dim)
    for head_dim, n, causal in _bench_shapes(role):
        cfg = candidate_configs(head_dim)[role]
        row = dict(kind="bench", role=role, label=cfg.label(), head_dim=head_dim, n=n,
                   causal=causal)  # fmt: skip
        if head_dim in failed:  # timed anyway (is it worth fixing?), marked in the summary
            row["failed_checks"] = True
        try:
            q8, k8, vt, ds = _quantised(TOKENS // n, HIDDEN // head_dim, HIDDEN // head_dim,
                                        n, n, head_dim)  # fmt: skip
            scale = 1.0 / math.sqrt(head_dim)

            def run(q8=q8, k8=k8, vt=vt, ds=ds, c=causal, s=scale, cfg=cfg):
                return fp8_gluon_forward(q8, k8, vt, ds, c, s, cfg)

            row.update(_tflops(run, n, head_dim, causal))
        except Exception as e:
            row["error"] = f"{type(e).__name__}: {e}"[:400]
        _emit(out, row)


def child_baseline(out: str) -> None:
    import torch

    from fa_bench.kernels.flash_attention import flash_attention
    from fa_bench.kernels.flash_config import FlashConfig
    from fa_bench.kernels.flash_fp8 import flash_attention_fp8

    tl = FlashConfig(forward="tl")
    for head_dim, n, causal in _bench_shapes("baseline"):
        heads, batch = HIDDEN // head_dim, TOKENS // n
        q, k, v = (torch.randn(batch, heads, n, head_dim, device="cuda", dtype=torch.bfloat16)
                   for _ in range(3))  # fmt: skip
        q8, k8, vt, ds = _quantised(batch, heads, heads, n, n, head_dim)
        runs = {
            "bf16": lambda q=q, k=k, v=v, c=causal: flash_attention(q, k, v, causal=c),
            "tl-fp8": lambda q8=q8, k8=k8, vt=vt, ds=ds, c=causal: flash_attention_fp8(
                q8, k8, vt, **ds, causal=c, config=tl
            ),
        }
        for name, fn in runs.items():
            row = dict(kind="bench", role=name, head_dim=head_dim, n=n, causal=causal)
            try:
                row.update(_tflops(fn, n, head_dim, causal))
            except Exception as e:
                row["error"] = f"{type(e).__name__}: {e}"[:400]
            _emit(out, row)


def _run_child(role: str, lines: str, light: bool = False) -> dict:
    """One child, killed when its lines stop growing for STALL_S seconds."""
    log_path = Path(lines).with_name(f"fp8-gluon-child-{role}.log")
    args = [sys.executable, __file__, "--child", role, "--lines", lines]
    args += ["--light"] if light else []
    return run_watched(args, lines, log_path, role, STALL_S)


def parent(roles: list[str], light: bool = False) -> int:
    import torch
    import triton

    out_dir = Path(os.environ.get("OUT", "fa-bench-out/out"))
    out_dir.mkdir(parents=True, exist_ok=True)
    lines = str(out_dir / "fp8-gluon-lines.jsonl")
    if os.path.exists(lines):
        os.remove(lines)
    started = time.time()
    env = dict(device=torch.cuda.get_device_name(0), torch=torch.__version__,
               triton=triton.__version__)  # fmt: skip
    print(json.dumps(env), flush=True)
    children = []
    # --quick leaves the baseline out (a `fa-bench run` after it times bf16 and tl)
    for role in roles if QUICK else ("baseline", *roles):
        if time.time() - started > BUDGET_S:
            children.append(dict(child=role, status="skipped: time budget", seconds=0))
            continue
        children.append(_run_child(role, lines, light))
        print(json.dumps(children[-1]), flush=True)
    rows = [json.loads(line) for line in open(lines)] if os.path.exists(lines) else []
    doc = dict(env=env, children=children, rows=rows)
    (out_dir / "fp8_gluon.json").write_text(json.dumps(doc, indent=1))
    from fp8_gluon_report import markdown  # beside this file

    (out_dir / "fp8_gluon.md").write_text(markdown(doc))
    print((out_dir / "fp8_gluon.md").read_text())
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--lines", help=argparse.SUPPRESS)
    ap.add_argument("--roles", default=",".join(ROLES), help="candidate roles, in order")
    ap.add_argument("--light", action="store_true", help="the heuristic's role: fewer checks")
    ap.add_argument("--quick", action="store_true", help="time d128 4k/16k only")
    args = ap.parse_args()
    if args.quick:  # the children read it from the environment they inherit
        os.environ["FP8_GLUON_QUICK"] = "1"
        global QUICK
        QUICK = True
    if args.child:
        try:
            if args.child == "baseline":
                child_baseline(args.lines)
            else:
                child_role(args.child, args.lines, args.light)
        except Exception:
            traceback.print_exc()
            return 1
        return 0
    return parent(args.roles.split(","), args.light)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    sys.exit(main())
