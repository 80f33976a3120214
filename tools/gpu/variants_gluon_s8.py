"""Issue 19's variant forward on the H200, session 8 (SC): the three-consumer 64-key
launch (flash_gluon_varhost.C3_N64) against the two-consumer 128-key one (the launch
every variant ran before) and the dense kernel, per variant kind and dtype, and the pick.

    python tools/gpu/variants_gluon_s8.py speed [--quick] [--budget S]
    python tools/gpu/variants_gluon_s8.py pick SPEED_JSON   # the C3_KINDS the rows say
    python tools/gpu/variants_gluon_s8.py targets RESULTS_JSON [--impl NAME]

`speed`: forward TFLOP/s over the attended pairs (fa_bench.variants.window_pairs),
triton.testing.do_bench (L2 flushed), 32 query / 8 KV heads, head_dim 128, causal, bf16
and fp16 (`ROWS`): softcap 50 and ALiBi at 8 × 8k, a 4k window alone and with softcap
50 at 2 × 32k, the packed 16k tokens of fa-bench's `uniform:256-3840` (8 documents),
softcap at 2 × 16k. Each row times "c2" (C3_KINDS empty: the two-consumer launch) and
"c3" (every kind listed: C3_N64) through flash_attention / flash_attention_varlen with
FlashConfig(forward="gluon") (the dispatch's own path, host time included), and the dense
Gluon kernel of the same shape (for the packed row: 8 × 2048, the equal-length control),
each twice in turn; the backend label each launch ran under; max |o_c3 − o_c2| (a smoke
check: the GPU tests apply the accuracy rule). Kernels are compiled first in parallel
worker processes. Writes $OUT/variants_gluon_s8_speed.{md,json} as it goes (a step cap
may cut it) and $OUT/variants_gluon_s8_pick.json (`pick`'s answer).

`pick`: per (kind, dtype), C3_N64 where its time is at least PICK_MARGIN below c2's in
the geometric mean over that kind's rows; a kind with no rows keeps the committed table's
choice. Prints C3_KINDS as Python and writes the JSON the plugin's `triton-pick` reads;
prints whether c3q (fp16 softcap rows: Q scaled by scale / c once per tile,
flash_gluon_varhost.SOFTCAP_QSCALE_FP16) beat c3 by the same margin.

`targets`: tools/gpu/variants_summary.py's table (each variant ÷ its dense control, the
backend) of a `fa-bench run`, for implementation NAME (default triton; the plugin's
`triton-pick` when the call-2 script picked in-process).

A developer tool, not installed.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import contextlib
import dataclasses
import json
import math
import multiprocessing as mp
import os
import sys
import time
from collections.abc import Iterator

import torch

HQ, HKV, D, CAP, WIN = 32, 8, 128, 50.0, 4096
PACKED = "uniform:256-3840"  # fa-bench's packed target: 8 documents, 17460 tokens
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
# (kind, batch, N, dtypes): kind as flash_gluon_varhost.variant_kind names it; "varlen"
# is the packed batch (batch = its documents, N unused)
ROWS: tuple[tuple[str, int, int, tuple[str, ...]], ...] = (
    ("softcap", 8, 8192, ("bf16", "fp16")),
    ("alibi", 8, 8192, ("bf16", "fp16")),
    ("window", 2, 32768, ("bf16", "fp16")),
    ("window+softcap", 2, 32768, ("bf16", "fp16")),
    ("varlen", 8, 0, ("bf16", "fp16")),
    ("softcap", 2, 16384, ("bf16", "fp16")),
)
QUICK = 4  # --quick: the first rows only
LAUNCHES = ("c2", "c3")
# fp16 softcap rows also time "c3q": C3_N64 with Q scaled by scale / c once per tile
# (flash_gluon_varhost.SOFTCAP_QSCALE_FP16; bf16 has it with the fixed offset already)
QSCALE_LAUNCH = "c3q"
# session 9 (tools/gpu/variants_gluon_s9.py): c2 / c3 with the fp16 softcap's threshold
# rescale (flash_gluon_varhost.SOFTCAP_LAZY_FP16), "...w" with its per-warp form too
# (SOFTCAP_LAZY_WARP)
LAZY_LAUNCHES = ("c2l", "c3l", "c2w", "c3w")
# session 10: "...s" with the fp16 softcap's sum check (SOFTCAP_SUM_FP16), "c3sq" with
# QSCALE's fp16 form too (SOFTCAP_QSCALE_FP16)
SUM_LAUNCHES = ("c2s", "c3s", "c3sq", "c3s4", "c3s8", "c3st", "c3s3", "c3s2", "c3se")
# "c3se": c3s with P rounded before the check (SOFTCAP_SUM_EARLY)
# "c3s3" / "c3s2": c3s with a 3- / 2-deep K/V ring (C3_N64 has 4, the most GluonConfig takes)
C3_ALT = {"c3s3": {"stages": 3}, "c3s2": {"stages": 2}}
# "c3s4" / "c3s8": c3s with every 4th / 8th exponential on the FMA pipes (SOFTCAP_EMU);
# "c3st": c3s with tree-shaped row sums (TREE: the sum the check waits for, depth 5)
EMU_LAUNCHES = {"c3s4": 4, "c3s8": 8}
PICK_MARGIN = 0.01
DEVICE = "cuda"  # a CPU test runs the rows' plumbing with "cpu"


def _out(name: str) -> str:
    folder = os.environ.get("OUT", "fa-bench-out/out")
    os.makedirs(folder, exist_ok=True)
    return os.path.join(folder, name)


@contextlib.contextmanager
def launch(name: str) -> Iterator[None]:
    """flash_gluon_varhost.C3_KINDS for launch `name` ("c2", "c2l": none, "c3", "c3l": every
    kind, both dtypes; "...l": SOFTCAP_LAZY_FP16 on, "...w": SOFTCAP_LAZY_WARP too), the
    committed table back after."""
    from fa_bench.kernels import flash_gluon_varhost as vh

    names = ("C3_KINDS", "SOFTCAP_QSCALE_FP16", "SOFTCAP_LAZY_FP16", "SOFTCAP_LAZY_WARP",
             "SOFTCAP_SUM_FP16", "SOFTCAP_EMU", "TREE", "C3_N64", "SOFTCAP_SUM_EARLY")  # fmt: skip
    saved = [getattr(vh, n) for n in names]
    every = frozenset(_all_kinds())
    vh.C3_KINDS = {} if name.startswith("c2") else {d: every for d in DTYPES}
    vh.SOFTCAP_QSCALE_FP16 = name in (QSCALE_LAUNCH, "c3sq")
    vh.SOFTCAP_LAZY_FP16 = name in LAZY_LAUNCHES
    vh.SOFTCAP_LAZY_WARP = name in LAZY_LAUNCHES and name.endswith("w")
    vh.SOFTCAP_SUM_FP16 = name in SUM_LAUNCHES
    vh.SOFTCAP_EMU = EMU_LAUNCHES.get(name, 0)
    vh.TREE = name == "c3st"
    vh.SOFTCAP_SUM_EARLY = name == "c3se"
    if name in C3_ALT:
        vh.C3_N64 = dataclasses.replace(vh.C3_N64, **C3_ALT[name])
    try:
        yield
    finally:
        for n, value in zip(names, saved, strict=True):
            setattr(vh, n, value)


def _all_kinds() -> list[str]:
    import itertools

    feats = ("window", "softcap", "alibi", "varlen")
    return ["+".join(c) for n in range(1, 5) for c in itertools.combinations(feats, n)]


def launches(kind: str, dname: str) -> tuple[str, ...]:
    """The launches a row times: c2 and c3, and c3q for an fp16 softcap."""
    return LAUNCHES + ((QSCALE_LAUNCH,) if dname == "fp16" and "softcap" in kind else ())


def _inputs(kind: str, b: int, n: int, dtype: torch.dtype, seed: int = 0) -> tuple:
    """(q, k, v, kwargs, attended pairs, the dense control's (q, k, v) and pairs)."""
    from fa_bench.variants import alibi_slopes, varlen_lengths, window_pairs

    g = torch.Generator(device=DEVICE).manual_seed(seed)
    rand = lambda *s: torch.randn(s, generator=g, device=DEVICE).to(dtype)  # noqa: E731
    if kind == "varlen":
        lens = varlen_lengths(PACKED, b)
        t = sum(lens)
        q, k, v = rand(t, HQ, D), rand(t, HKV, D), rand(t, HKV, D)
        cu = torch.tensor([0, *_cumsum(lens)], dtype=torch.int32, device=DEVICE)
        kw = dict(cu=cu, max_len=max(lens))
        pairs = sum(window_pairs(n_, n_, True) for n_ in lens)
        n_ctrl = 2048  # fa-bench's control (variants_targets_s7.toml): 8 x 2048, dense
        ctrl = tuple(rand(b, h, n_ctrl, D) for h in (HQ, HKV, HKV))
        return q, k, v, kw, pairs, ctrl, b * window_pairs(n_ctrl, n_ctrl, True)
    q, k, v = rand(b, HQ, n, D), rand(b, HKV, n, D), rand(b, HKV, n, D)
    kw: dict = {}
    left = -1
    if "window" in kind:
        kw["window"], left = (WIN, -1), WIN
    if "softcap" in kind:
        kw["softcap"] = CAP
    if "alibi" in kind:
        kw["alibi_slopes"] = torch.tensor(alibi_slopes(HQ), dtype=torch.float32, device=DEVICE)
    pairs = b * window_pairs(n, n, True, left)
    return q, k, v, kw, pairs, (q, k, v), b * window_pairs(n, n, True)


def _cumsum(xs):
    total, out = 0, []
    for x in xs:
        total += x
        out.append(total)
    return out


def _fn(kind: str, q, k, v, kw: dict):
    """The forward of this row's variant through the dispatch (forward forced to Gluon)."""
    from fa_bench.kernels import FlashConfig, flash_attention, flash_attention_varlen

    cfg = FlashConfig(forward="gluon")
    if kind == "varlen":
        cu, m = kw["cu"], kw["max_len"]
        return lambda: flash_attention_varlen(q, k, v, cu, cu, m, m, causal=True, config=cfg)
    return lambda: flash_attention(q, k, v, causal=True, config=cfg, **kw)


def _dense(q, k, v):
    from fa_bench.kernels import flash_attention

    return lambda: flash_attention(q, k, v, causal=True)


def _label(kind: str, q, k, v, kw: dict) -> str:
    """The launch the dispatch picks for this row now (its backend label)."""
    from fa_bench.kernels import FlashConfig, flash_dispatch
    from fa_bench.kernels.flash_validate import Varlen, make_variant

    if kind == "varlen":
        cu, m = kw["cu"], kw["max_len"]
        varlen = Varlen(cu, cu, m, m)
        q4, k4, v4 = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))
    else:
        varlen, (q4, k4, v4) = None, (q, k, v)
    variant = make_variant(
        q4, causal=True, window=kw.get("window", (-1, -1)), alibi_slopes=kw.get("alibi_slopes"),
        softcap=kw.get("softcap", 0.0), batch=q4.shape[0], seq_q=q4.shape[2], seq_k=k4.shape[2],
        varlen=varlen,
    )  # fmt: skip
    cfg = flash_dispatch.gluon_choice(q4, k4, v4, True, FlashConfig(forward="gluon"), variant)
    return flash_dispatch.forward_label(cfg, "tl")


def _warm(job: tuple) -> str:
    """A worker process: compile (launch, kind, dtype) by one small call (no kernel
    specialises on these lengths: multiples of 16, none equal to 1; the packed row's own
    documents, whose token total triton specialises on)."""
    name, kind, dname = job
    b = next((b for k, b, _n, _d in ROWS if k == kind), 2) if kind == "varlen" else 2
    q, k, v, kw, *_ = _inputs(kind, b, 1024, DTYPES[dname])
    if name == "dense":
        _dense(q, k, v)()
    else:
        with launch(name):
            _fn(kind, q, k, v, kw)()
    torch.cuda.synchronize()
    return f"{name} {kind} {dname}"


def warm(rows, workers: int) -> None:
    jobs = sorted(
        {(n, kind, d) for kind, _b, _n, ds in rows for d in ds for n in launches(kind, d)}
    )
    jobs += [("dense", "softcap", d) for d in DTYPES]
    ctx = mp.get_context("spawn")
    with cf.ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
        for done in pool.map(_warm, jobs):
            print(f"compiled {done}", flush=True)


def _bench(fn) -> float:
    from triton.testing import do_bench

    return do_bench(fn, warmup=25, rep=100)


def _row(kind: str, b: int, n: int, dname: str) -> dict:
    """One (kind, shape, dtype): TFLOP/s of c2, c3 and the dense control (each the mean of
    two timings in turn), the labels, max |o_c3 − o_c2|."""
    q, k, v, kw, pairs, ctrl, ctrl_pairs = _inputs(kind, b, n, DTYPES[dname])
    fns, outs, labels = {}, {}, {}
    for name in launches(kind, dname):
        with launch(name):
            labels[name] = _label(kind, q, k, v, kw)
            outs[name] = _fn(kind, q, k, v, kw)().float()
        fns[name] = _switched(name, _fn(kind, q, k, v, kw))
    fns["dense"] = _dense(*ctrl)
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(2):
        for name, fn in fns.items():
            times[name].append(_bench(fn))
    # pairs of every sequence (or document) of the batch, times the query heads
    flops = {name: 4.0 * (ctrl_pairs if name == "dense" else pairs) * D * HQ for name in fns}
    tf = {name: flops[name] / (sum(t) / len(t)) / 1e9 for name, t in times.items()}
    shape = f"packed {PACKED} x{b}" if kind == "varlen" else f"{b} x {n}"
    row = dict(kind=kind, dtype=dname, shape=shape, c2=tf["c2"], c3=tf["c3"],
               dense=tf["dense"], c3_over_c2=tf["c3"] / tf["c2"],
               c2_over_dense=tf["c2"] / tf["dense"], c3_over_dense=tf["c3"] / tf["dense"],
               ms={name: sum(t) / len(t) for name, t in times.items()},
               labels=labels,
               max_diff=(outs["c3"] - outs["c2"]).abs().max().item())  # fmt: skip
    if QSCALE_LAUNCH in tf:
        row.update(c3q=tf["c3q"], c3q_over_c3=tf["c3q"] / tf["c3"],
                   c3q_over_dense=tf["c3q"] / tf["dense"],
                   max_diff_c3q=(outs["c3q"] - outs["c2"]).abs().max().item())  # fmt: skip
    return row


def _switched(name: str, fn):
    def run():
        with launch(name):
            return fn()

    return run


def speed(rows, deadline: float) -> list[dict]:
    out = []
    for kind, b, n, dnames in rows:
        for dname in dnames:
            if time.time() > deadline:
                print(f"time budget spent before {kind} {dname} {b} x {n}", flush=True)
                return out
            row = _row(kind, b, n, dname)
            print(json.dumps(row), flush=True)
            out.append(row)
            _write(out)  # as it goes
    return out


def _md(rows: list[dict]) -> str:
    lines = [
        "| kind | dtype | shape | c2 TFLOP/s | c3 TFLOP/s | dense | c2 ÷ dense | c3 ÷ dense | "
        "c3 ÷ c2 | max |o_c3 − o_c2| | c3q ÷ dense (max diff) | c3's launch |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        c3q = f"{r['c3q_over_dense']:.3f} ({r['max_diff_c3q']:.1e})" if "c3q" in r else "–"
        lines.append(
            f"| {r['kind']} | {r['dtype']} | {r['shape']} | {r['c2']:.1f} | {r['c3']:.1f} | "
            f"{r['dense']:.1f} | {r['c2_over_dense']:.3f} | {r['c3_over_dense']:.3f} | "
            f"{r['c3_over_c2']:.3f} | {r['max_diff']:.2e} | {c3q} | {r['labels']['c3']} |"
        )
    return "\n".join(lines) + "\n"


def _write(rows: list[dict]) -> None:
    with open(_out("variants_gluon_s8_speed.md"), "w") as f:
        f.write(_md(rows))
    with open(_out("variants_gluon_s8_speed.json"), "w") as f:
        json.dump(rows, f, indent=1)


def pick(rows: list[dict], committed: dict[str, frozenset[str]]) -> dict[str, list[str]]:
    """Per dtype, the kinds C3_N64 should serve: where the geometric mean of c3 ÷ c2 over
    the kind's rows is at least 1 + PICK_MARGIN; kinds without rows keep `committed`'s
    choice."""
    ratios: dict[tuple[str, str], list[float]] = {}
    for r in rows:
        ratios.setdefault((r["kind"], r["dtype"]), []).append(r["c3_over_c2"])
    out: dict[str, list[str]] = {}
    for dname in DTYPES:
        kinds = set(committed.get(dname, frozenset()))
        for (kind, d), rs in ratios.items():
            if d != dname:
                continue
            gm = math.exp(sum(math.log(x) for x in rs) / len(rs))
            if gm >= 1 + PICK_MARGIN:
                kinds.add(kind)
            else:
                kinds.discard(kind)
        out[dname] = sorted(kinds)
    return out


def pick_qscale(rows: list[dict]) -> bool | None:
    """Whether c3q (fp16 softcap, Q scaled once) beat c3 by PICK_MARGIN in the geometric
    mean over the rows that timed it (None: none did)."""
    rs = [r["c3q_over_c3"] for r in rows if "c3q_over_c3" in r]
    if not rs:
        return None
    return math.exp(sum(math.log(x) for x in rs) / len(rs)) >= 1 + PICK_MARGIN


def targets(path: str, impl: str) -> str:
    """variants_summary's table of `impl`'s records in a run's results (named `triton` for
    it: the table reads that implementation), flex's kept for its column."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import variants_summary

    recs = [r for r in variants_summary._records([path]) if r["impl"] in (impl, "flex")]
    for r in recs:
        r["impl"] = "triton" if r["impl"] == impl else r["impl"]
    return "\n".join(variants_summary.summary(recs)) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=("speed", "pick", "targets"))
    ap.add_argument("results", nargs="?", help="pick: a speed JSON; targets: a results.json")
    ap.add_argument("--impl", default="triton", help="targets: the implementation's records")
    ap.add_argument("--quick", action="store_true", help=f"speed: the first {QUICK} rows")
    ap.add_argument("--budget", type=float, default=60.0, help="speed: seconds to stop timing")
    ap.add_argument("--workers", type=int, default=8, help="speed: compile processes")
    args = ap.parse_args()
    from fa_bench.kernels import flash_gluon_varhost as vh

    if args.what == "targets":
        print(targets(args.results, args.impl))
        return 0
    if args.what == "pick":
        with open(args.results) as f:
            rows = json.load(f)
    else:
        deadline = time.time() + args.budget  # from the start: compiling counts too
        print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}", flush=True)
        todo = ROWS[:QUICK] if args.quick else ROWS
        warm(todo, args.workers)
        rows = speed(todo, deadline)
        print(_md(rows), flush=True)
    chosen = pick(rows, vh.C3_KINDS)
    with open(_out("variants_gluon_s8_pick.json"), "w") as f:
        json.dump(chosen, f, indent=1)
    print("C3_KINDS =", {d: f"frozenset({set(k) or '{}'})" for d, k in chosen.items()})
    print("SOFTCAP_QSCALE_FP16 =", pick_qscale(rows), "(None: not timed)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
