"""A/B of Gluon fp8 launches in one process (session 8): check each role, then time them
interleaved, shape by shape, so clock and power drift hit every role alike.

    python tools/gpu/fp8_ab.py --roles ws-c3-persist,ws-c3-lpt [--shapes 4096:1,16384:1]
    # $OUT/fp8_ab.md, $OUT/fp8-ab-lines.jsonl (fp8_gluon_check.py's rows: fp8_pick.py reads them)

The roles run in a child process whose JSON lines the parent watches (child_watch): a
role that deadlocks on an mbarrier is killed after STALL_S seconds without a line, and a
new child goes on with the roles after it (one CUDA start per child, not per role).
In a child: per role, check_fp8_accuracy on every (batch, kv head) slice of CHECKS
(fp8_gluon_check.check_one: odd lengths with rows that see no key, the 4k causal shape,
and for persistent roles 192 causal tiles over 132 SMs in (batch, head) groups of 12, 12,
8); then per shape (head_dim 128, 16k tokens, hidden 2048) ROUNDS rounds of do_bench over
every role that passed (the order rotated each round; the best round kept), and the bf16
forward (`flash_attention`'s dispatch) last. Needs CUDA; a developer tool, not installed.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from child_watch import emit, run_watched
from fp8_gluon_check import HIDDEN, TOKENS, _l2_share, _quantised, check_one

STALL_S = 30.0
ROUNDS = int(os.environ.get("FP8_AB_ROUNDS", "3"))
# (batch, heads_q, heads_kv, seq_q, seq_k, causal): MQA with rows that see no key and odd
# lengths, the 4k causal shape
CHECKS = ((1, 4, 1, 1504, 784, True), (1, 2, 2, 4096, 4096, True))
# persistent roles also: 192 tiles over 132 SMs, causal groups of 12, 12, 8 kv-head pairs
GROUPED = (4, 8, 2, 1000, 1000, True)


def _checks(role: str, out: str) -> bool:
    from fa_bench.kernels.flash_gluon_fp8 import candidate_configs

    cfg = candidate_configs(128)[role]
    shapes = CHECKS + ((GROUPED,) if cfg.persistent else ())
    ok = True
    for shape in shapes:
        grouped = shape is GROUPED
        try:
            with _l2_share(3 * 2 * shape[4] * 128 if grouped else None):
                row = check_one(cfg, shape, 128, with_tl=False)
        except Exception as e:
            row = dict(kind="check", shape=list(shape), head_dim=128, passed=False,
                       error=f"{type(e).__name__}: {e}"[:400])  # fmt: skip
            row.update(role=role, label=cfg.label())
            emit(out, row)
            # a CUDA error leaves this process's context unusable: a new child goes on
            # with the next role
            os._exit(3)
        row.update(role=role, label=cfg.label(), bh_groups="12,12,8" if grouped else None)
        emit(out, row)
        ok &= bool(row["passed"])
    return ok


def _flops(n: int, causal: bool) -> float:
    from fa_bench.case import Case
    from fa_bench.models import case_flops

    heads = HIDDEN // 128
    case = Case(impl="triton", mode="fwd", dtype="fp8_e4m3", batch=TOKENS // n, heads_q=heads,
                heads_kv=heads, seqlen_q=n, seqlen_k=n, head_dim=128, causal=causal)  # fmt: skip
    return case_flops(case)


def _bench(roles: list[str], shapes: list[tuple[int, bool]], out: str, bf16: bool) -> None:
    import torch
    import triton

    from fa_bench.kernels.flash_attention import flash_attention
    from fa_bench.kernels.flash_gluon_fp8 import candidate_configs, fp8_gluon_forward

    cands = candidate_configs(128)
    for n, causal in shapes:
        heads, batch = HIDDEN // 128, TOKENS // n
        q8, k8, vt, ds = _quantised(batch, heads, heads, n, n, 128)
        scale = 1 / math.sqrt(128)
        fns = {role: functools.partial(fp8_gluon_forward, q8, k8, vt, ds, causal, scale,
                                       cands[role]) for role in roles}  # fmt: skip
        if bf16:
            q, k, v = (torch.randn(batch, heads, n, 128, device="cuda", dtype=torch.bfloat16)
                       for _ in range(3))  # fmt: skip
            fns["bf16"] = functools.partial(flash_attention, q, k, v, causal=causal)
        best: dict[str, float] = {}
        for fn in fns.values():
            fn()  # compile outside the timing
        for r in range(ROUNDS):
            names = list(fns)
            names = names[r % len(names) :] + names[: r % len(names)]
            for name in names:
                ms = triton.testing.do_bench(fns[name], warmup=25, rep=100)
                best[name] = min(ms, best.get(name, math.inf))
        for name, ms in best.items():
            label = cands[name].label() if name in cands else name
            emit(out, dict(kind="bench", role=name, label=label, head_dim=128, n=n,
                           causal=causal, ms=ms, rounds=ROUNDS,
                           tflops=_flops(n, causal) / (ms * 1e-3) / 1e12))  # fmt: skip


def child(roles: list[str], shapes: list[tuple[int, bool]], out: str, bf16: bool) -> None:
    import torch
    import triton

    emit(out, dict(kind="env", device=torch.cuda.get_device_name(0), torch=torch.__version__,
                   triton=triton.__version__))  # fmt: skip
    passed = []
    for role in roles:
        emit(out, dict(kind="start", role=role))
        if _checks(role, out):
            passed.append(role)
    emit(out, dict(kind="start", role="bench"))
    _bench(passed, shapes, out, bf16)
    emit(out, dict(kind="done"))


def parent(roles: list[str], shape_text: str, bf16: bool) -> int:
    out_dir = Path(os.environ.get("OUT", "fa-bench-out/out"))
    out_dir.mkdir(parents=True, exist_ok=True)
    lines = out_dir / "fp8-ab-lines.jsonl"
    lines.unlink(missing_ok=True)
    children, left = [], list(roles)
    while left:
        args = [sys.executable, __file__, "--child", "--roles", ",".join(left),
                "--shapes", shape_text, "--lines", str(lines)]  # fmt: skip
        args += [] if bf16 else ["--no-bf16"]
        log = out_dir / f"fp8-ab-child-{len(children)}.log"
        status = run_watched(args, str(lines), log, ",".join(left), STALL_S)
        children.append(status)
        print(json.dumps(status), flush=True)
        rows = [json.loads(x) for x in lines.read_text().splitlines()] if lines.exists() else []
        if status["status"] == "ok" or any(r["kind"] == "done" for r in rows):
            break
        # the role that stalled or failed: the last one started; go on after it
        started = [r["role"] for r in rows if r["kind"] == "start"]
        if not started or started[-1] == "bench":
            break
        left = left[left.index(started[-1]) + 1 :] if started[-1] in left else []
    rows = [json.loads(x) for x in lines.read_text().splitlines()] if lines.exists() else []
    env = next((r for r in rows if r["kind"] == "env"), {})
    doc = dict(env=env, children=children,
               rows=[r for r in rows if r["kind"] in ("check", "bench")])  # fmt: skip
    (out_dir / "fp8_ab.json").write_text(json.dumps(doc, indent=1))
    from fp8_gluon_report import markdown  # beside this file

    (out_dir / "fp8_ab.md").write_text(markdown(doc))
    print((out_dir / "fp8_ab.md").read_text())
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--roles", required=True, help="candidate roles, in order")
    ap.add_argument("--shapes", default="4096:1,16384:1", help="N:causal,... (head_dim 128)")
    ap.add_argument("--no-bf16", action="store_true", help="leave the bf16 forward out")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--lines", help=argparse.SUPPRESS)
    args = ap.parse_args()
    roles = [r for r in args.roles.split(",") if r]
    if args.child:
        shapes = [(int(n), c == "1") for n, c in (s.split(":") for s in args.shapes.split(","))]
        start = time.time()
        try:
            child(roles, shapes, args.lines, not args.no_bf16)
        except Exception:
            traceback.print_exc()
            return 1
        print(f"child: {time.time() - start:.1f} s", flush=True)
        return 0
    return parent(roles, args.shapes, not args.no_bf16)


if __name__ == "__main__":
    sys.exit(main())
