"""The variants' backward against our dense backward, timed directly (do_bench of
autograd.grad on one forward's graph, L2 flushed): bf16, 32 query / 8 KV heads, head_dim
128, causal. Issue 19 asks the variants' TFLOP/s (attended pairs only) to be within 10%
of the dense kernel's (softcap, ALiBi), >= 0.85x (a 4k window at 32k) and >= 0.9x for a
packed batch of mixed lengths against equal lengths of the same tokens.

    python tools/gpu/variants_bwd.py            # writes $OUT/variants_bwd.{md,json}

Rows: dense causal 8 x 8k, softcap 50, ALiBi; dense causal 2 x 32k, window 4096; packed
16k tokens (the variants suite's 8 documents, uniform 256-3840) against 8 x 2048 (dense
and packed equal lengths). The library's defaults, and its development switches the
other way (flash_validate): DKDV_DP_FIRST off for the softcap; the packed table on
dK/dV's fast axis (PACKED_TABLE_FAST on), in bins of 4 blocks
(SCHEDULE_BIN), the first grid (PACKED_SCHEDULE off) and the packed dK/dV kernel's
masked Q/dO loads (PACKED_CLAMP 0), its clamped loads without the unmasked whole
blocks (1), the tail block in a third loop (3) and the masked loop unpipelined
(PACKED_DIAG_STAGES 1). PACKED=1: the packed rows only (8 x 2048 dense and
packed, the mixed batch; clamped and masked loads). Each switch's gradients are
compared bit for bit with the default's (they change no arithmetic). The kernels are
compiled first by parallel child processes (one wave of up to 16, into triton's disk
cache), then timed in ROUNDS interleaved rounds (default 2; the table has the mean, the
JSON every round). A developer tool, not installed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import torch
from triton.testing import do_bench

from fa_bench.kernels import flash_attention, flash_attention_varlen, flash_validate
from fa_bench.variants import alibi_slopes, varlen_lengths, window_pairs

HQ, HKV, D = 32, 8, 128
MIXED = varlen_lengths("uniform:256-3840", 8)
# VB_CPU=1: a plumbing check on a CPU (the Triton interpreter, fp32, every size / 128,
# 4/2 heads of 16, a wall-clock timer), e.g. before a GPU call; its numbers mean nothing
CPU = os.environ.get("VB_CPU") == "1"
DEV, DTYPE, SHRINK = ("cpu", torch.float32, 128) if CPU else ("cuda", torch.bfloat16, 1)
if CPU:
    HQ, HKV, D = 4, 2, 16
# name: (kind, batch or lengths, N, kwargs, switches)
CASES: dict[str, tuple] = {
    "dense 8x8k": ("dense", 8, 8192, {}, {}),
    "softcap 50 8x8k": ("dense", 8, 8192, {"softcap": 50.0}, {}),
    "softcap 50 8x8k, dp-first off": (
        "dense",
        8,
        8192,
        {"softcap": 50.0},
        {"DKDV_DP_FIRST": "off"},
    ),
    "alibi 8x8k": ("dense", 8, 8192, {"alibi": True}, {}),
    "dense 2x32k": ("dense", 2, 32768, {}, {}),
    "window 4096 2x32k": ("dense", 2, 32768, {"window": (4096, -1)}, {}),
    "equal 8x2048": ("dense", 8, 2048, {}, {}),
    "equal 8x2048, BSHD": ("bshd", 8, 2048, {}, {}),
    "packed equal 8x2048": ("packed", (2048,) * 8, 0, {}, {}),
    "packed mixed": ("packed", MIXED, 0, {}, {}),
    "packed mixed, table fast": ("packed", MIXED, 0, {}, {"PACKED_TABLE_FAST": True}),
    "packed mixed, bins of 4": ("packed", MIXED, 0, {}, {"SCHEDULE_BIN": 4}),
    "packed mixed, first grid": ("packed", MIXED, 0, {}, {"PACKED_SCHEDULE": False}),
    # the packed dK/dV kernel's masked Q/dO loads (before PACKED_CLAMP) against the default
    "packed equal 8x2048, masked loads": ("packed", (2048,) * 8, 0, {}, {"PACKED_CLAMP": 0}),
    "packed mixed, masked loads": ("packed", MIXED, 0, {}, {"PACKED_CLAMP": 0}),
    "packed mixed, clamped loads only": ("packed", MIXED, 0, {}, {"PACKED_CLAMP": 1}),
    "packed mixed, tail loop": ("packed", MIXED, 0, {}, {"PACKED_CLAMP": 3}),
    "packed mixed, masked loop 1 stage": ("packed", MIXED, 0, {}, {"PACKED_DIAG_STAGES": 1}),
    "packed mixed, tail loop, masked 1 stage": (
        "packed",
        MIXED,
        0,
        {},
        {"PACKED_CLAMP": 3, "PACKED_DIAG_STAGES": 1},
    ),
    "packed equal 8x2048, tail loop": ("packed", (2048,) * 8, 0, {}, {"PACKED_CLAMP": 3}),
    "packed mixed, dp-first": ("packed", MIXED, 0, {}, {"DKDV_DP_FIRST": "all"}),
    "packed mixed, masked loop 2 stages": ("packed", MIXED, 0, {}, {"PACKED_DIAG_STAGES": 2}),
    "packed mixed, masked loop 3 stages": ("packed", MIXED, 0, {}, {"PACKED_DIAG_STAGES": 3}),
}
# PACKED=1 (tools/gpu/variants_bwd.sh): the packed batch's rows only
PACKED_NAMES = [
    "equal 8x2048",
    "equal 8x2048, BSHD",
    "packed equal 8x2048",
    "packed mixed",
    "packed mixed, masked loads",
    "packed mixed, tail loop",
    "packed mixed, masked loop 1 stage",
    "packed mixed, tail loop, masked 1 stage",
    "packed mixed, dp-first",
    "packed mixed, masked loop 2 stages",
]
# (what, numerator, denominator, issue's ask)
RATIOS = [
    ("softcap / dense", "softcap 50 8x8k", "dense 8x8k", 0.9),
    ("softcap, dp-first off / dense", "softcap 50 8x8k, dp-first off", "dense 8x8k", 0.9),
    ("ALiBi / dense", "alibi 8x8k", "dense 8x8k", 0.9),
    ("window / dense", "window 4096 2x32k", "dense 2x32k", 0.85),
    ("packed mixed / equal", "packed mixed", "equal 8x2048", 0.9),
    ("packed equal / equal", "packed equal 8x2048", "equal 8x2048", None),
    ("packed equal / equal BSHD", "packed equal 8x2048", "equal 8x2048, BSHD", None),
    ("equal BSHD / equal", "equal 8x2048, BSHD", "equal 8x2048", None),
    ("packed mixed, table fast / equal", "packed mixed, table fast", "equal 8x2048", 0.9),
    ("packed mixed, bins of 4 / equal", "packed mixed, bins of 4", "equal 8x2048", 0.9),
    ("packed mixed, first grid / equal", "packed mixed, first grid", "equal 8x2048", 0.9),
    ("packed mixed, masked loads / equal", "packed mixed, masked loads", "equal 8x2048", 0.9),
    (
        "packed equal, masked loads / equal",
        "packed equal 8x2048, masked loads",
        "equal 8x2048",
        None,
    ),
    ("packed mixed / masked loads", "packed mixed", "packed mixed, masked loads", None),
    ("packed mixed, tail loop / equal", "packed mixed, tail loop", "equal 8x2048", 0.9),
    (
        "packed mixed, masked loop 1 stage / equal",
        "packed mixed, masked loop 1 stage",
        "equal 8x2048",
        0.9,
    ),
    (
        "packed mixed, tail loop, masked 1 stage / equal",
        "packed mixed, tail loop, masked 1 stage",
        "equal 8x2048",
        0.9,
    ),
    ("packed equal, tail loop / equal", "packed equal 8x2048, tail loop", "equal 8x2048", None),
    ("packed mixed, dp-first / equal", "packed mixed, dp-first", "equal 8x2048", 0.9),
    (
        "packed mixed, masked loop 2 stages / equal",
        "packed mixed, masked loop 2 stages",
        "equal 8x2048",
        0.9,
    ),
    (
        "packed mixed, masked loop 3 stages / equal",
        "packed mixed, masked loop 3 stages",
        "equal 8x2048",
        0.9,
    ),
    (
        "packed mixed, clamped only / masked loads",
        "packed mixed, clamped loads only",
        "packed mixed, masked loads",
        None,
    ),
]
# pairs whose gradients must agree bit for bit
BITWISE = [
    ("packed mixed", "packed mixed, table fast"),
    ("packed mixed", "packed mixed, bins of 4"),
    ("packed mixed", "packed mixed, first grid"),
    ("softcap 50 8x8k", "softcap 50 8x8k, dp-first off"),
    # CLAMP 1 sums as the masked loads; the default (2) sums the tail block earlier:
    # compared with itself on a second run (determinism)
    ("packed mixed, clamped loads only", "packed mixed, masked loads"),
    ("packed mixed", "packed mixed"),
    ("packed mixed, tail loop", "packed mixed, masked loads"),
    ("packed mixed", "packed mixed, dp-first"),
]


def _switches(values: dict) -> None:
    flash_validate.PACKED_SCHEDULE = values.get("PACKED_SCHEDULE", True)
    flash_validate.PACKED_TABLE_FAST = values.get("PACKED_TABLE_FAST", False)
    flash_validate.DKDV_DP_FIRST = values.get("DKDV_DP_FIRST", "variants")
    flash_validate.SCHEDULE_BIN = values.get("SCHEDULE_BIN", 1)
    flash_validate.PACKED_CLAMP = values.get("PACKED_CLAMP", 2)
    flash_validate.PACKED_DIAG_STAGES = values.get("PACKED_DIAG_STAGES", 2)


def _flops(kind: str, size: object, n: int, kw: dict) -> float:
    if kind == "packed":
        pairs = sum(window_pairs(s, s, True, -1) for s in size)  # type: ignore[union-attr]
        return 2.5 * 4.0 * pairs * D * HQ
    left = kw.get("window", (-1, -1))[0]
    return 2.5 * 4.0 * window_pairs(n, n, True, left) * D * HQ * int(size)  # type: ignore[call-overload]


def _setup(name: str):
    """(grad function, FLOPs) of one case: the forward runs once, the backward replays."""
    kind, size, n, kw, switches = CASES[name]
    _switches(switches)
    g = torch.Generator(device=DEV).manual_seed(0)

    def rnd(*shape: int) -> torch.Tensor:
        return torch.randn(shape, device=DEV, generator=g, dtype=DTYPE).requires_grad_()

    kw = dict(kw)
    if kw.pop("alibi", False):
        kw["alibi_slopes"] = torch.tensor(alibi_slopes(HQ), dtype=torch.float32, device=DEV)
    if "window" in kw:
        kw["window"] = (kw["window"][0] // SHRINK, kw["window"][1])
    n = n // SHRINK
    if kind == "packed":
        size = tuple(max(1, s // SHRINK) for s in size)  # type: ignore[union-attr]
        q, k, v = rnd(sum(size), HQ, D), rnd(sum(size), HKV, D), rnd(sum(size), HKV, D)
        cu = torch.tensor([0, *torch.tensor(size).cumsum(0).tolist()], device=DEV)
        cu = cu.to(torch.int32)
        o = flash_attention_varlen(q, k, v, cu, cu, max(size), max(size), causal=True, **kw)
    elif kind == "bshd":
        # flash-attn's (B, S, H, D) layout, a packed tensor's row stride: the dense kernel
        # on (B, H, S, D) views of it
        q, k, v = rnd(size, n, HQ, D), rnd(size, n, HKV, D), rnd(size, n, HKV, D)
        o = flash_attention(*(t.transpose(1, 2) for t in (q, k, v)), causal=True, **kw)
    else:
        q, k, v = rnd(size, HQ, n, D), rnd(size, HKV, n, D), rnd(size, HKV, n, D)
        o = flash_attention(q, k, v, causal=True, **kw)
    do = torch.randn(o.shape, device=DEV, generator=g, dtype=o.dtype)
    if kind == "bshd":
        do = do.transpose(1, 2).contiguous().transpose(1, 2)  # o's layout

    def grads():
        _switches(switches)
        return torch.autograd.grad(o, (q, k, v), do, retain_graph=True)

    return grads, _flops(kind, size, n, kw)


def _time_ms(fn) -> float:
    if not CPU:
        return do_bench(fn)
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def _warm(name: str) -> None:
    """Compile a case's kernels (a child process: triton's disk cache keeps them)."""
    grads, _ = _setup(name)
    grads()
    torch.cuda.synchronize()  # the warm-up runs on the GPU only


def _precompile(names: list[str]) -> list[str]:
    def one(name: str) -> str:
        t0 = time.time()
        # killed by then (WARM_S): no child outlives a script step that times out
        cmd = [sys.executable, __file__, "--warm", name]
        limit = float(os.environ.get("WARM_S", "75"))
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=limit)
        except subprocess.TimeoutExpired:
            return f"{name}: compile timed out after {time.time() - t0:.0f} s"
        tail = (r.stderr or r.stdout).strip().splitlines()[-1:] if r.returncode else []
        return f"{name}: exit {r.returncode} in {time.time() - t0:.0f} s {' '.join(tail)}"

    with ThreadPoolExecutor(max_workers=min(16, len(names))) as pool:  # one wave
        return list(pool.map(one, names))


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--warm":
        _warm(sys.argv[2])
        return 0
    out = os.environ.get("OUT", "fa-bench-out/out")
    os.makedirs(out, exist_ok=True)
    rounds = int(os.environ.get("ROUNDS", "2"))
    picked = sys.argv[1:] or (PACKED_NAMES if os.environ.get("PACKED") == "1" else [])
    if os.environ.get("VB_NAMES"):  # ';'-separated case names (they hold commas)
        picked = os.environ["VB_NAMES"].split(";")
    names = [n for n in CASES if not picked or n in picked]
    t0 = time.time()
    warm = _precompile(names) if os.environ.get("PRECOMPILE", "1") == "1" and not CPU else []
    setups, times, bits = {}, {n: [] for n in names}, {}
    for name in names:
        try:
            setups[name] = _setup(name)
        except Exception as e:  # a failing case is a result here
            setups[name] = None
            times[name] = [f"error {type(e).__name__}: {str(e)[:160]}"]
    for _ in range(rounds):
        for name in names:
            if setups[name] is not None:
                grads, flops = setups[name]
                times[name].append(flops / _time_ms(grads) / 1e9)
    for a, b in BITWISE:
        if setups.get(a) and setups.get(b):
            ga, gb = setups[a][0](), setups[b][0]()
            bits[f"{a} == {b}"] = all(torch.equal(x, y) for x, y in zip(ga, gb, strict=True))
    mean = {n: sum(t) / len(t) for n, t in times.items() if t and not isinstance(t[0], str)}
    gpu = "CPU (interpreter, plumbing only)" if CPU else torch.cuda.get_device_name()
    head = (
        f"torch {torch.__version__}, {gpu}; {DTYPE}, {HQ}/{HKV} heads, "
        f"D {D}, causal; backward TFLOP/s (attended pairs, 2.5x forward), mean of {rounds} "
        f"interleaved do_bench rounds; mixed lengths {MIXED}"
    )
    lines = [head, "", "| case | bwd TFLOP/s | rounds |", "|---|---|---|"]
    for name in names:
        cells = ", ".join(f"{t:.1f}" if not isinstance(t, str) else t for t in times[name])
        lines.append(f"| {name} | {mean.get(name, float('nan')):.1f} | {cells} |")
    lines += ["", "| ratio | value | asked |", "|---|---|---|"]
    for what, num, den, ask in RATIOS:
        if num in mean and den in mean:
            lines.append(f"| {what} | {mean[num] / mean[den]:.3f} | {ask or ''} |")
    lines += ["", *(f"- bitwise {k}: {v}" for k, v in bits.items())]
    lines += [""] + [f"- {w}" for w in warm]
    lines.append(f"- {time.time() - t0:.0f} s in all")
    text = "\n".join(lines)
    print(text)
    with open(os.path.join(out, "variants_bwd.md"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(out, "variants_bwd.json"), "w") as f:
        json.dump({"tflops": times, "bitwise": bits, "lengths": MIXED, "warm": warm}, f, indent=1)
    return 0 if all(bits.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
