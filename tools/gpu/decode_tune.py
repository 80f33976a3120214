"""Time our decode kernel's launch parameters on the GPU (issue 20): for representative
shapes (tools/gpu/decode_space.py), candidate (block_n, num_warps, num_stages, splits,
interleaved splits) against the heuristic's choice and torch SDPA on the dense cache.

    python tools/gpu/decode_tune.py [--out DIR] [--budget 140] [--workers 12]

Writes DIR/decode_tune.md (per shape: the heuristic, the best candidate, SDPA, GB/s and
fraction of the copy bandwidth; then the best per shape of each config) and
DIR/decode_tune.json (every measurement). DIR defaults to $OUT, else fa-bench-out/out.

Timing: triton.testing.do_bench medians (its L2 flush between calls, so no shape is timed
out of L2) of a CUDA graph of one call, so the figure is the GPU's time, not Python's;
the heuristic and SDPA are also timed as plain calls, as `fa-bench run` times them.
GB/s by fa_bench.models.decode_bytes (valid K/V bytes + q + o). The copy bandwidth: a
1 GiB device-to-device copy, read + write bytes over its do_bench median. Candidates are
compiled first in parallel processes (triton's on-disk cache); the phases stop at the
budget (compiling included) and the files say how many candidates were left out.
A development tool, not installed.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from dataclasses import asdict

import decode_space as sp
import torch
import triton
import triton.testing

from fa_bench import models
from fa_bench.case import Case

_REP_MS, _WARMUP_MS = 15, 5


def _bytes(shape: sp.Shape) -> int:
    case = Case(impl="triton", mode="decode", dtype="bf16", batch=shape.batch, heads_q=sp.HQ,
                heads_kv=sp.HKV, seqlen_q=shape.sq, seqlen_k=shape.ctx, head_dim=sp.D,
                causal=True, page_size=shape.page)  # fmt: skip
    return models.decode_bytes(case)


def _bench(fn) -> float:
    return triton.testing.do_bench(fn, warmup=_WARMUP_MS, rep=_REP_MS, return_mode="median")


def _graphed(fn):
    """A CUDA graph of one call of `fn` (its first, compiling call made before)."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def copy_gbps() -> float:
    n = 1 << 30
    src = torch.ones(n, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = _bench(functools.partial(dst.copy_, src))
    return 2 * n / ms / 1e6


class Tuner:
    def __init__(self, budget_s: float, sms: int):
        self.t0, self.budget_s, self.sms = time.perf_counter(), budget_s, sms
        self.rows: list[dict] = []
        self.skipped = 0
        self._inputs: tuple | None = None

    def over(self) -> bool:
        return time.perf_counter() - self.t0 > self.budget_s

    def inputs(self, shape: sp.Shape) -> dict:
        if self._inputs is None or self._inputs[0] != shape:
            self._inputs = None
            torch.cuda.empty_cache()
            self._inputs = (shape, sp.make_inputs(shape))
        return self._inputs[1]

    def record(self, shape: sp.Shape, kind: str, label: str, ms: float | None, **extra):
        gbps = _bytes(shape) / ms / 1e6 if ms else None
        self.rows.append({"shape": shape.label, **asdict(shape), "kind": kind, "label": label,
                          "ms": ms, "gbps": gbps, **extra})  # fmt: skip

    def cand(self, shape: sp.Shape, c: sp.Cand, phase: int) -> float | None:
        if self.over():
            self.skipped += 1
            return None
        x = self.inputs(shape)
        try:
            ms = _bench(_graphed(lambda: sp.call(x, c)))
        except Exception as exc:  # a config over the shared memory: recorded
            error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
            self.record(shape, "cand", c.label, None, phase=phase, cand=asdict(c), error=error)
            return None
        self.record(shape, "cand", c.label, ms, phase=phase, cand=asdict(c))
        return ms

    def baselines(self, shape: sp.Shape) -> None:
        """The heuristic (graphed and plain) and SDPA (plain and graphed) on `shape`."""
        from fa_bench.kernels.decode_attention import plan_launch

        if self.over():
            self.skipped += 1
            return
        x = self.inputs(shape)
        launch = plan_launch(x["q"], x["k"], x["table"])
        sp.call(x, None, check_values=True)
        label = (f"bn{launch.block_n} w{launch.num_warps} s{launch.num_stages} "
                 f"x{launch.num_splits}{' inter' if launch.interleave else ''}")  # fmt: skip
        self.record(shape, "heuristic", label, _bench(_graphed(lambda: sp.call(x, None))),
                    launch=asdict(launch))  # fmt: skip
        self.record(shape, "heuristic-plain", label, _bench(lambda: sp.call(x, None)))
        for kind, graphed in (("sdpa-plain", False), ("sdpa", True)):
            ms, extra = self._sdpa(shape, x, graphed)
            self.record(shape, kind, "sdpa", ms, **extra)

    def _sdpa(self, shape: sp.Shape, x: dict, graphed: bool) -> tuple:
        from torch.nn.functional import scaled_dot_product_attention as sdpa

        q = x["q"].transpose(1, 2)
        lengths = x["seqlens"].long()
        last = lengths[:, None] - shape.sq + torch.arange(shape.sq, device=q.device)
        keys = torch.arange(shape.ctx, device=q.device)
        mask = (keys[None, None, :] <= last[:, :, None])[:, None]

        def fn():
            return sdpa(q, x["k_dense"], x["v_dense"], attn_mask=mask, enable_gqa=True)

        try:
            return _bench(_graphed(fn) if graphed else fn), {}
        except Exception as exc:  # recorded: the peer is for scale only
            return None, {"error": f"{type(exc).__name__}: {exc}"[:200]}

    def best(self, shape: sp.Shape, n: int) -> list[sp.Cand]:
        rows = [r for r in self.rows if r["shape"] == shape.label and r["kind"] == "cand"
                and r["ms"]]  # fmt: skip
        rows.sort(key=lambda r: r["ms"])
        seen, out = set(), []
        for r in rows:
            c = sp.Cand(**r["cand"])
            key = (c.block_n, c.num_warps, c.num_stages)
            if key not in seen:
                seen.add(key)
                out.append(c)
        return out[:n]


def _device_name() -> str:
    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"


def _precompile(args: argparse.Namespace, sms: int) -> dict:
    """Every candidate's kernels compiled in parallel processes; the compile figures."""
    sq1, sq4 = sp.shapes_sq1(), sp.shapes_sq4()
    jobs = [(s, c) for s in sq1 for c in sp.phase1(s, sms)]
    # phase 2's split counts and interleaving of any grid config (its best are not known yet)
    jobs += [(s, c) for s in sq1 for c in sp.phase2(s, sp.phase1(s, sms), sms)]
    jobs += [(s, c) for s in sq4 for c in sp.phase2(s, sp.phase1(s, sms), sms)]
    t = time.perf_counter()
    errors = sp.precompile(jobs, args.workers) if args.workers else {}
    return {
        "compile_s": time.perf_counter() - t,
        "compile_errors": len(errors),
        "compile_keys": len({k for s, c in jobs for k in sp.compile_keys(s, c)}),
    }


def _sq4(tuner: Tuner, shape: sp.Shape) -> None:
    """An Sq-4 shape: the best three of its Sq-1 twin at their split count, half and twice."""
    tuner.baselines(shape)
    twin = sp.Shape(shape.batch, shape.ctx, shape.page, 1)
    for c in tuner.best(twin, 3):
        for s in sorted({c.splits, max(1, c.splits // 2), min(2 * c.splits, sp.MAX_SPLITS)}):
            cand = sp.Cand(c.block_n, c.num_warps, c.num_stages, c.interleave and s > 1, s)
            tuner.cand(shape, cand, 3)


def run(args: argparse.Namespace, save=None) -> dict:
    """The phases (decode_space's docstring); `save(result)` after each."""
    sms = args.sms or torch.cuda.get_device_properties(0).multi_processor_count
    tuner = Tuner(args.budget, sms)  # the budget counts from here, compiling included
    meta = _precompile(args, sms)
    meta["copy_gbps"] = copy_gbps()
    print(f"compiled in {meta['compile_s']:.0f} s; copy {meta['copy_gbps']:.0f} GB/s", flush=True)
    meta.update(sms=sms, device=_device_name(), torch=torch.__version__, triton=triton.__version__)
    result = {"meta": meta, "rows": tuner.rows}

    def done(phase: str) -> None:
        meta.update(skipped=tuner.skipped, wall_s=time.perf_counter() - tuner.t0, last=phase)
        if save:
            save(result)

    sq1, sq4 = sp.shapes_sq1()[: args.shapes], sp.shapes_sq4()[: args.shapes]
    for shape in sq1:
        tuner.baselines(shape)
        for c in sp.phase1(shape, sms):
            tuner.cand(shape, c, 1)
    done("phase 1")
    for shape in sq1:
        for c in sp.phase2(shape, tuner.best(shape, 3), sms):
            tuner.cand(shape, c, 2)
    done("phase 2")
    for shape in sq4:
        _sq4(tuner, shape)
    done("phase 3")
    return result


def _saver(out: str):
    from decode_tune_report import report

    def save(result: dict) -> None:
        with open(os.path.join(out, "decode_tune.json"), "w") as f:
            json.dump(result, f, indent=1)
        with open(os.path.join(out, "decode_tune.md"), "w") as f:
            f.write(report(result))

    return save


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT") or "fa-bench-out/out")
    ap.add_argument(
        "--budget",
        type=float,
        default=140.0,
        help="seconds in all (compiling included) before the remaining candidates are left out",
    )
    ap.add_argument("--workers", type=int, default=min(12, (os.cpu_count() or 2) - 2))
    ap.add_argument("--shapes", type=int, default=None, help="only the first N shapes per Sq")
    ap.add_argument("--sms", type=int, default=None, help=argparse.SUPPRESS)  # CPU smoke test
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("decode_tune: needs CUDA", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    run(args, _saver(args.out))
    with open(os.path.join(args.out, "decode_tune.md")) as f:
        print(f.read())
    return 0


if __name__ == "__main__":
    sys.exit(main())
