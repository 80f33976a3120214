"""Fingerprints of the code our Triton kernels compile to, for checking that a refactor of
kernels/flash_kernels*.py changes no generated code.

Compiles the forward, preprocessing, dK/dV and dQ kernels for sm_90 (no GPU needed: the
stages up to PTX run on the CPU) over a grid of dtypes, head dims, causal, tail flags and
the TMA path, and writes one short hash per kernel and stage (TTIR, TTGIR, PTX) with the
debug locations stripped, so renamed arguments, comments and moved lines do not count.
Run it before and after a change and compare the files (several minutes on two cores):

    python tools/kernel_ir.py before.json     # on the old code
    python tools/kernel_ir.py after.json      # on the new code
    python tools/kernel_ir.py --compare before.json after.json

A developer tool, not installed with the package. Argument names follow the kernels'
(BLOCK_M/BLOCK_N, BLOCK_HELD/BLOCK_STREAMED, EVEN_Q/EVEN_K); adapt `_grid` when they change.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import os
import re
import sys

os.environ.pop("TRITON_INTERPRET", None)  # compile, never interpret (before triton's import)

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from fa_bench.kernels import flash_kernels, flash_kernels_bwd

TARGET = GPUTarget("cuda", 90, 32)
STAGES = ("ttir", "ttgir", "ptx")
_FP32_POINTERS = {"LSE", "DELTA"}
_I32 = {"heads_q", "heads_kv", "group", "seq_q", "seq_k"}
_F32 = {"qk_scale", "sm_scale"}


def _strip(text: str) -> str:
    """The code without debug locations, comments and debug sections."""
    text = re.sub(r"\s*loc\([^()]*(\([^()]*\))?[^()]*\)", "", text)
    text = re.sub(r"^#loc.*$", "", text, flags=re.M)
    text = re.sub(r"^\s*\.(loc|file)\b.*$", "", text, flags=re.M)
    # PTX labels that only mark debug scopes (a jit helper inlined from another file adds
    # some); nothing but the stripped debug sections refers to them
    text = re.sub(r"^\$L__tmp\d+:$", "", text, flags=re.M)
    text = re.sub(r"^\s*//.*$", "", text, flags=re.M)
    text = re.sub(r"\.section\s+\.debug.*", "", text, flags=re.S)
    return "\n".join(line for line in text.splitlines() if line.strip())


# The variants' kernel arguments (issue 19): a flag left out is off, and a runtime
# argument whose flag is off is None (a constexpr), as the launchers pass them.
# The backward's DP_FIRST (dK/dV's order) is a flag too, and a packed batch's work table
# (Sched) an argument of its table launch only (VARLEN = 2).
_VARIANT_FLAGS = ("WINDOW", "SOFTCAP", "ALIBI", "VARLEN", "DP_FIRST", "CLAMP")
_VARIANT_ARGS = {
    "win_left": ("WINDOW", "i32"), "win_right": ("WINDOW", "i32"),
    "softcap2": ("SOFTCAP", "fp32"), "Slopes": ("ALIBI", "*fp32"),
    "stride_slope_b": ("ALIBI", "i32"), "CuQ": ("VARLEN", "*i32"), "CuK": ("VARLEN", "*i32"),
    "Sched": ("VARLEN", "*i32"),
}  # fmt: skip


def _fingerprint(fn: object, consts: dict, dtype: str, warps: int, stages: int) -> dict:
    signature: dict[str, str] = {}
    names = fn.arg_names  # type: ignore[attr-defined]
    consts = dict(consts)
    for flag in _VARIANT_FLAGS:
        if flag in names:
            consts.setdefault(flag, False)
    if "DIAG_STAGES" in names:  # the packed dK/dV's masked loop's depth: the launch's
        consts.setdefault("DIAG_STAGES", None)
    for name, (flag, ty) in _VARIANT_ARGS.items():
        off = consts.get(flag) not in (2, 3) if name == "Sched" else not consts.get(flag)
        if name in names and off:
            consts[name] = None
        elif name in names:
            signature[name] = ty
    for name in names:
        if name in signature:
            continue
        if name in consts:
            signature[name] = "constexpr"
        elif name.startswith("stride_") or name in _I32:
            signature[name] = "i32"
        elif name in _F32:
            signature[name] = "fp32"
        else:
            signature[name] = "*fp32" if name in _FP32_POINTERS else f"*{dtype}"
    source = ASTSource(fn=fn, signature=signature, constexprs=consts)
    kernel = triton.compile(source, target=TARGET, options={"num_warps": warps,
                                                           "num_stages": stages})  # fmt: skip
    return {s: hashlib.sha256(_strip(kernel.asm[s]).encode()).hexdigest()[:16] for s in STAGES}


def _grid() -> dict[str, tuple]:
    """name -> (kernel, constexprs, dtype, warps, stages)."""
    grid: dict[str, tuple] = {}
    held, streamed = 128, 64
    for dtype, hd, causal, even in itertools.product(
        ("fp16", "fp32"), (40, 128), (False, True), (False, True)
    ):
        pad = 64 if hd == 40 else 128
        common = dict(HEAD_DIM=hd, HEAD_DIM_PAD=pad, CAUSAL=causal,
                      DOT_PREC="ieee" if dtype == "fp32" else "tf32")  # fmt: skip
        tag = f"{dtype}-d{hd}-c{int(causal)}-e{int(even)}"
        bm, bn = (128, 64) if hd == 40 else (128, 128)
        fwd = dict(common, BLOCK_M=bm, BLOCK_N=bn, EVEN_Q=even, USE_TMA=False,
                   WARP_SPECIALIZE=False)  # fmt: skip
        grid[f"fwd-{tag}"] = (flash_kernels._fwd_kernel, fwd, dtype, 8, 3)
        dkdv = dict(common, BLOCK_HELD=held, BLOCK_STREAMED=streamed, EVEN_Q=even,
                    EVEN_K=not even)  # fmt: skip
        grid[f"dkdv-{tag}"] = (flash_kernels_bwd._bwd_dkdv_kernel, dkdv, dtype, 8, 3)
        dq = dict(common, BLOCK_HELD=held, BLOCK_STREAMED=streamed, EVEN_Q=even)
        grid[f"dq-{tag}"] = (flash_kernels_bwd._bwd_dq_kernel, dq, dtype, 8, 3)
    pre = dict(HEAD_DIM=40, HEAD_DIM_PAD=64, BLOCK_M=64)
    grid["pre-fp16-d40"] = (flash_kernels_bwd._bwd_preprocess_kernel, pre, "fp16", 4, 3)
    tma = dict(HEAD_DIM=128, HEAD_DIM_PAD=128, CAUSAL=True, USE_TMA=True, WARP_SPECIALIZE=False,
               DOT_PREC="tf32", BLOCK_M=128, BLOCK_N=128, EVEN_Q=False)  # fmt: skip
    grid["fwd-tma"] = (flash_kernels._fwd_kernel, tma, "bf16", 8, 3)
    _variant_grid(grid)
    return grid


def _variant_grid(grid: dict[str, tuple]) -> None:
    """Issue 19's variants in the forward, dK/dV and dQ kernels: a causal sliding window
    with softcap and ALiBi, a packed batch (VARLEN) with a window, ALiBi alone, a packed
    batch with a softcap; the packed backward's table launch (VARLEN = 2, backward only)."""
    base = dict(HEAD_DIM=128, HEAD_DIM_PAD=128, CAUSAL=True, DOT_PREC="tf32")
    for tag, flags in (
        ("window-softcap-alibi", dict(WINDOW=True, SOFTCAP=True, ALIBI=True)),
        ("varlen-window", dict(WINDOW=True, VARLEN=True)),
        ("alibi", dict(ALIBI=True)),
        ("varlen-softcap", dict(SOFTCAP=2, VARLEN=True)),
        ("softcap-bf16x2", dict(SOFTCAP=3)),
        ("varlen-table", dict(VARLEN=2)),
        # the default packed launch: kv heads fast, clamped Q/dO loads (flash_validate)
        ("varlen-heads-clamp", dict(VARLEN=3, CLAMP=True)),
    ):
        fwd = dict(base, **flags, BLOCK_M=128, BLOCK_N=128, EVEN_Q=False, USE_TMA=False,
                   WARP_SPECIALIZE=False)  # fmt: skip
        if flags.get("VARLEN") not in (2, 3):
            grid[f"fwd-{tag}"] = (flash_kernels._fwd_kernel, fwd, "bf16", 8, 3)
        bwd = dict(base, **flags, BLOCK_HELD=128, BLOCK_STREAMED=64, EVEN_Q=False)
        grid[f"dkdv-{tag}"] = (flash_kernels_bwd._bwd_dkdv_kernel, dict(bwd, EVEN_K=False),
                               "bf16", 8, 3)  # fmt: skip
        grid[f"dq-{tag}"] = (flash_kernels_bwd._bwd_dq_kernel, bwd, "bf16", 8, 3)


def _compare(before: str, after: str) -> int:
    with open(before) as f:
        old = json.load(f)
    with open(after) as f:
        new = json.load(f)
    if set(old) - set(new):
        print(f"kernels missing from {after}: {sorted(set(old) - set(new))}")
        return 1
    if set(new) - set(old):  # a grid extended with new kernels: nothing to compare them to
        print(f"new kernels, not in {before}: {', '.join(sorted(set(new) - set(old)))}")
    changed = {k: [s for s in STAGES if old[k][s] != new[k][s]] for k in old}
    changed = {k: v for k, v in changed.items() if v}
    for name, stages in sorted(changed.items()):
        print(f"{name}: {', '.join(stages)} changed")
    print(f"{len(old)} kernels, {len(changed)} with changed code")
    return 1 if changed else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", nargs="?", help="write the fingerprints here (JSON)")
    ap.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"))
    args = ap.parse_args()
    if args.compare:
        return _compare(*args.compare)
    if not args.out:
        ap.error("give an output file or --compare BEFORE AFTER")
    prints = {name: _fingerprint(*spec) for name, spec in _grid().items()}
    with open(args.out, "w") as f:
        json.dump(prints, f, indent=1, sort_keys=True)
    print(f"{len(prints)} kernels fingerprinted into {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
