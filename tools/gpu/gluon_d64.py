"""The Gluon forward at head_dim 64 (issue 21): check and time the exp2 split and variants.

    python tools/gpu/gluon_d64.py [--budget 90]   # writes $OUT/gluon_d64.md, .json, .jsonl

Launches (`candidates()`): at each (head_dim, causal) the heuristic's (`gluon_config`),
the same with tree-shaped row reductions (`tree_reduce`), with every 8th exponential of P
on the FMA pipes (`exp2_emu`, kernels/gluon_exp2.py) and with both; at d64 non-causal
also every 4th / 2nd, the persistent two-Q-buffer kernel and three consumers over
128-key steps (FA3's d64 shape), with and without them.

1. compiles every launch first, in parallel worker processes (triton's on-disk cache then
   serves the timed process), at the shapes' specialisations;
2. correctness of each launch against the float64 reference with fa_bench.run.accuracy's
   rule on every (batch, kv head) slice (tools/gpu/gluon_check.check_slices): GQA 4:1 at
   1000 tokens and GQA 2:1 with Sq 1100 > Sk 600 (causal rows without keys: o = 0);
3. `triton.testing.do_bench` TFLOP/s at 4k and 16k (16k tokens, hidden 2048; FLOPs of
   fa_bench.models.case_flops), SDPA's cuDNN backend and every launch of the shape back
   to back in this process; a launch that failed its check is not timed.

Order: bf16 d64 non-causal first, then fp16 d64 non-causal, d64 causal, d128; no new
shape starts after `--budget` seconds (its rows say "skipped"). The markdown lists per
shape the TFLOP/s, ratio to cuDNN and to the heuristic, and which launches clear 1.02×
cuDNN. Needs CUDA; a developer tool, not installed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # gluon_check beside this file

from fa_bench.kernels.flash_gluon import GluonConfig  # imports no triton

TOKENS, HIDDEN = 16384, 2048
DEVICE = "cuda"
BENCH_NS = (4096, 16384)
TARGET_RATIO = 1.02
# do_bench's timed window per launch and length, ms (--rep)
REP_MS = 50
# (batch, heads_q, heads_kv, seq_q, seq_k, transposed) for gluon_check.check_slices
CHECK_SHAPES = ((2, 4, 1, 1000, 1000, False), (1, 4, 2, 1100, 600, False))
# (dtype, head_dim, causal) in the order they are run (the budget cuts the tail)
ORDER = (
    ("bf16", 64, False),
    ("fp16", 64, False),
    ("bf16", 64, True),
    ("fp16", 64, True),
    ("bf16", 128, False),
    ("bf16", 128, True),
    ("fp16", 128, False),
    ("fp16", 128, True),
)


class NoExp2(GluonConfig):
    """A launch with the softmax's exponentials replaced by their arguments (no MUFU work,
    wrong results: gluon_exp2.DIAG_NO_EXP2_BIT): timed, never checked, to show what the
    exp2 costs. A GluonConfig (module level: the compile workers unpickle it), so
    gluon_forward launches it as it is."""

    def softmax_code(self) -> int:
        from fa_bench.kernels.gluon_exp2 import DIAG_NO_EXP2_BIT

        return super().softmax_code() | DIAG_NO_EXP2_BIT

    def label(self) -> str:
        return super().label() + "-noexp2"


def diagnostic(cfg: GluonConfig) -> NoExp2:
    return NoExp2(**dataclasses.asdict(cfg))


def candidates() -> dict[tuple[int, bool], dict[str, object]]:
    """{(head_dim, causal): {role: GluonConfig}}; role "heuristic" is `gluon_config` (at
    d64 non-causal three consumers over 128-key steps since call C: its ptxas spills are
    the mask's column offsets, reloaded only in the masked last key block), "t" adds tree
    reductions, "eN" the exp2 split (every N-th exponential emulated); at d64 "ws" is the
    two-consumer ping-pong launch (the heuristic before call C), "pq2" its persistent
    two-Q-buffer form, "c3-n64" three consumers over 64-key steps."""
    from fa_bench.kernels.flash_gluon import candidate_configs, gluon_config

    def vary(cfg, tag: str, **fields) -> tuple[str, object]:
        return tag, dataclasses.replace(cfg, **fields)

    out: dict[tuple[int, bool], dict[str, object]] = {}
    for head_dim in (64, 128):
        for causal in (False, True):
            base = gluon_config(head_dim, causal)
            roles = dict([("heuristic", base), vary(base, "t", tree_reduce=True),
                          vary(base, "e8", exp2_emu=8),
                          vary(base, "e8-t", exp2_emu=8, tree_reduce=True)])  # fmt: skip
            ws = candidate_configs(head_dim)["ws"]
            pq2 = candidate_configs(head_dim)["ws-persist-q2"]
            if head_dim == 64 and not causal:  # where the softmax bounds the most
                roles.update([("ws", ws), vary(ws, "ws-e8", exp2_emu=8),
                              vary(ws, "ws-e4", exp2_emu=4), vary(ws, "ws-e2", exp2_emu=2),
                              vary(ws, "ws-t", tree_reduce=True), ("pq2", pq2),
                              vary(pq2, "pq2-t", tree_reduce=True),
                              vary(pq2, "pq2-e8-t", exp2_emu=8, tree_reduce=True),
                              vary(base, "c3-n64", block_n=64),
                              vary(ws, "ws-s3", stages=3), vary(ws, "ws-nopp", pingpong=False),
                              # timing diagnostics (no exponentials, wrong results)
                              ("diag-noexp2", diagnostic(base)),
                              ("diag-ws-noexp2", diagnostic(ws))])  # fmt: skip
            if head_dim == 64 and causal:  # the warp-specialised kernels, beside "pipelined"
                roles.update([vary(ws, "ws-t", tree_reduce=True),
                              vary(ws, "ws-e8-t", exp2_emu=8, tree_reduce=True),
                              vary(pq2, "pq2-e8-t", exp2_emu=8, tree_reduce=True)])  # fmt: skip
            out[(head_dim, causal)] = roles
    return out


def _torch_dtype(name: str):
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16}[name]


def _warm_one(job: tuple) -> tuple[str, float, str]:
    """Compile one launch at the bench's and the checks' specialisations (a worker)."""
    import torch

    from fa_bench.kernels.flash_gluon import gluon_forward

    cfg, dtype_name, head_dim, causal = job
    start = time.time()
    try:
        dtype = _torch_dtype(dtype_name)
        heads = HIDDEN // head_dim  # divisible by 16, group 1: the bench's specialisation
        shapes = [(1, heads, heads, 256, 256)] + [s[:5] for s in CHECK_SHAPES]
        for b, hq, hkv, sq, sk in shapes:
            q = torch.randn(b, hq, sq, head_dim, device="cuda", dtype=dtype)
            k = torch.randn(b, hkv, sk, head_dim, device="cuda", dtype=dtype)
            gluon_forward(q, k, torch.randn_like(k), causal, 0.125, cfg)
        torch.cuda.synchronize()
        return cfg.label(), time.time() - start, ""
    except Exception as e:
        return cfg.label(), time.time() - start, f"{type(e).__name__}: {e}"[:300]


def warm(jobs: list[tuple], workers: int) -> list[dict]:
    """Compile every job in `workers` spawned processes (each with its own CUDA context)."""
    ctx = mp.get_context("spawn")
    with ctx.Pool(workers) as pool:
        done = pool.map(_warm_one, jobs, chunksize=1)
    return [dict(kind="warm", label=lab, seconds=round(s, 1), error=err) for lab, s, err in done]


def check(cfg, dtype_name: str, head_dim: int, causal: bool) -> dict:
    """The accuracy rule on CHECK_SHAPES (every slice); rows without keys must be 0."""
    import torch
    from gluon_check import _inputs, _no_key_rows_ok, check_slices

    from fa_bench.kernels.flash_gluon import gluon_forward

    worst, ok = 0.0, True
    for shape in CHECK_SHAPES:
        q, k, v = _inputs(shape, _torch_dtype(dtype_name), head_dim)
        o, lse2 = gluon_forward(q, k, v, causal, 1.0 / math.sqrt(head_dim), cfg)
        if DEVICE == "cuda":
            torch.cuda.synchronize()
        rep = check_slices(shape, dtype_name, head_dim, causal, q, k, v, o)
        worst = max(worst, rep["max_abs_err"])
        ok = ok and rep["passed"] and _no_key_rows_ok(lse2, o, shape[3], shape[4], causal)
    return dict(max_abs_err=worst, passed=bool(ok))


def bench(fn, n: int, head_dim: int, dtype_name: str, causal: bool) -> dict:
    import triton

    from fa_bench.case import Case
    from fa_bench.models import case_flops

    fn()
    ms = triton.testing.do_bench(fn, warmup=10, rep=REP_MS)
    heads = HIDDEN // head_dim
    case = Case(impl="gluon", mode="fwd", dtype=dtype_name, batch=TOKENS // n, heads_q=heads,
                heads_kv=heads, seqlen_q=n, seqlen_k=n, head_dim=head_dim,
                causal=causal)  # fmt: skip
    return dict(ms=ms, tflops=case_flops(case) / (ms * 1e-3) / 1e12)


def run_shape(emit, roles: dict, dtype_name: str, head_dim: int, causal: bool) -> None:
    """Checks, then at each N cuDNN and every passing launch back to back."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from fa_bench.kernels.flash_gluon import gluon_forward

    key = dict(dtype=dtype_name, head_dim=head_dim, causal=causal)
    passing = {}
    for role, cfg in roles.items():
        if role.startswith("diag"):  # wrong results by design: timed, not checked
            emit(dict(kind="check", role=role, label=cfg.label(), passed=False,
                      error="diagnostic: not checked", **key))  # fmt: skip
            passing[role] = cfg
            continue
        try:
            res = check(cfg, dtype_name, head_dim, causal)
        except Exception as e:
            res = dict(passed=False, error=f"{type(e).__name__}: {e}"[:300])
        emit(dict(kind="check", role=role, label=cfg.label(), **key, **res))
        if res["passed"]:
            passing[role] = cfg
    for n in BENCH_NS:
        heads = HIDDEN // head_dim
        q, k, v = (torch.randn(TOKENS // n, heads, n, head_dim, device=DEVICE,
                               dtype=_torch_dtype(dtype_name)) for _ in range(3))  # fmt: skip
        scale = 1.0 / math.sqrt(head_dim)

        def cudnn(q=q, k=k, v=v):
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

        runs = {"cudnn": (cudnn, "sdpa-cudnn")}
        for role, cfg in passing.items():
            runs[role] = (lambda q=q, k=k, v=v, cfg=cfg, s=scale: gluon_forward(q, k, v, causal,
                                                                                s, cfg),
                          cfg.label())  # fmt: skip
        for role, (fn, label) in runs.items():
            row = dict(kind="bench", role=role, label=label, n=n, **key)
            try:
                row.update(bench(fn, n, head_dim, dtype_name, causal))
            except Exception as e:
                row["error"] = f"{type(e).__name__}: {e}"[:300]
            emit(row)
        del q, k, v


def write_outputs(out_dir: Path, lines: Path) -> str:
    """gluon_d64.json and .md from the rows so far (after every shape: a run stopped by its
    caller's time limit still leaves its tables)."""
    from gluon_d64_report import markdown  # beside this file

    rows = [json.loads(line) for line in open(lines)]
    (out_dir / "gluon_d64.json").write_text(json.dumps(rows, indent=1))
    text = markdown(rows, TARGET_RATIO)
    (out_dir / "gluon_d64.md").write_text(text)
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, default=90.0, help="no new shape after this (s)")
    workers = max(1, min(14, (os.cpu_count() or 2) - 2))
    ap.add_argument("--workers", type=int, default=workers,
                    help="compile processes (0: each compiles when first run)")  # fmt: skip
    ap.add_argument("--only", help="comma list of ORDER indices to run (default all)")
    ap.add_argument("--roles", help="comma list of roles to keep (default all; the "
                    "heuristic's always runs, as the baseline)")  # fmt: skip
    ap.add_argument("--rep", type=int, default=REP_MS, help="do_bench's rep window (ms)")
    args = ap.parse_args(argv)
    globals()["REP_MS"] = args.rep
    import torch
    import triton

    out_dir = Path(os.environ.get("OUT", "fa-bench-out/out"))
    out_dir.mkdir(parents=True, exist_ok=True)
    lines = out_dir / "gluon_d64.jsonl"
    lines.unlink(missing_ok=True)
    started = time.time()

    def emit(row: dict) -> None:
        row["t"] = round(time.time() - started, 1)
        with open(lines, "a") as f:
            f.write(json.dumps(row) + "\n")
        print(json.dumps(row), flush=True)

    order = [ORDER[int(i)] for i in args.only.split(",")] if args.only else list(ORDER)
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else DEVICE
    emit(dict(kind="env", device=device, torch=torch.__version__, triton=triton.__version__,
              order=order))  # fmt: skip
    cands = candidates()
    if args.roles:
        keep = {"heuristic", *args.roles.split(",")}
        cands = {key: {r: c for r, c in roles.items() if r in keep} for key, roles in cands.items()}
    if args.workers > 0:
        jobs = [(cfg, d, hd, c) for d, hd, c in order for cfg in cands[(hd, c)].values()]
        for row in warm(jobs, args.workers):
            emit(row)
    for dtype_name, head_dim, causal in order:
        if time.time() - started > args.budget:
            emit(dict(kind="skipped", dtype=dtype_name, head_dim=head_dim, causal=causal))
            continue
        run_shape(emit, cands[(head_dim, causal)], dtype_name, head_dim, causal)
        write_outputs(out_dir, lines)
    print(write_outputs(out_dir, lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
