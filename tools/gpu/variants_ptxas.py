"""Registers, spills and instruction counts of the backward's dK/dV and dQ kernels for
sm_90, dense against each variant, compiled on a CPU (no GPU needed up to the cubin).

Run with the GPU's triton (3.6.0) installed aside:

    PYTHONPATH=/tmp/tri36 python tools/gpu/variants_ptxas.py [--stages 3] [NAME ...]

One line per (variant, kernel): shared memory, registers, spill stores/loads (ptxas -v),
and the PTX's MUFU-class instruction counts (tanh, ex2) and local-memory accesses. bf16,
head_dim 128, the heuristic's backward tiles (128 held × 64 streamed, 8 warps), causal.
A developer tool, not installed.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile

os.environ.pop("TRITON_INTERPRET", None)  # compile, never interpret (before triton's import)

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from fa_bench.kernels import flash_kernels_bwd

TARGET = GPUTarget("cuda", 90, 32)
_I32 = {"heads_q", "heads_kv", "group", "seq_q", "seq_k", "win_left", "win_right"}
_I32 |= {"stride_slope_b"}
_F32 = {"qk_scale", "sm_scale", "softcap2"}
_PTR32 = {"LSE", "DELTA", "Slopes"}
_PTRI32 = {"CuQ", "CuK", "Sched"}

VARIANTS: dict[str, dict] = {
    "dense": {},
    "softcap": dict(SOFTCAP=2),
    "alibi": dict(ALIBI=True),
    "window": dict(WINDOW=True),
    "varlen": dict(VARLEN=True),
    "varlen-sched": dict(VARLEN=2),
    "varlen-heads-fast": dict(VARLEN=3),
    # the packed dK/dV kernel's clamped, unmasked Q/dO loads (flash_validate.PACKED_CLAMP
    # 1), and with its whole row blocks in an unmasked loop (2, the default)
    "varlen-clamp1": dict(VARLEN=3, CLAMP=1),
    "varlen-clamp": dict(VARLEN=3, CLAMP=2),
    "varlen-clamp3": dict(VARLEN=3, CLAMP=3),
    "varlen-clamp-diag1": dict(VARLEN=3, CLAMP=2, DIAG_STAGES=1),
    # the default packed launch (flash_validate: CLAMP 2, the masked loop 2 stages deep)
    "varlen-clamp-diag2": dict(VARLEN=3, CLAMP=2, DIAG_STAGES=2),
    "varlen-clamp-window": dict(VARLEN=3, CLAMP=2, WINDOW=True, DP_FIRST=True),
    "varlen-clamp-softcap": dict(VARLEN=3, CLAMP=2, SOFTCAP=2, ALIBI=True, DP_FIRST=True),
    "dense-dpfirst": dict(DP_FIRST=True),
    "softcap-dpfirst": dict(SOFTCAP=2, DP_FIRST=True),
    "alibi-dpfirst": dict(ALIBI=True, DP_FIRST=True),
    "window-dpfirst": dict(WINDOW=True, DP_FIRST=True),
}


def ptxas_info(ptx: str) -> dict[str, int]:
    """Registers per thread and spill bytes from `ptxas -v` (triton's own) on the PTX."""
    from triton.backends.nvidia.compiler import get_ptxas

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.ptx")
        with open(path, "w") as f:
            f.write(ptx)
        cmd = [get_ptxas(90).path, "-arch=sm_90a", "-v", path, "-o", os.devnull]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    text = out.stderr + out.stdout
    regs = re.search(r"Used (\d+) registers", text)
    spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", text)
    return {
        "registers": int(regs.group(1)) if regs else -1,
        "spill_stores": int(spill.group(1)) if spill else -1,
        "spill_loads": int(spill.group(2)) if spill else -1,
    }


def compile_one(fn: object, consts: dict, warps: int, stages: int) -> object:
    names = fn.arg_names  # type: ignore[attr-defined]
    sig: dict[str, str] = {}
    for name in names:
        if name in consts:
            sig[name] = "constexpr"
        elif name.startswith("stride_") or name in _I32:
            sig[name] = "i32"
        elif name in _F32:
            sig[name] = "fp32"
        elif name in _PTR32:
            sig[name] = "*fp32"
        elif name in _PTRI32:
            sig[name] = "*i32"
        else:
            sig[name] = "*bf16"
    # pointers, strides and the (even) lengths divisible by 16, as triton specializes them
    # at a real launch: the loads' vectorization and software pipelining depend on it
    divisible = {"seq_q", "seq_k", "heads_q"}
    attrs = {
        (i,): [["tt.divisibility", 16]]
        for i, name in enumerate(names)
        if name not in consts
        and (sig[name][0] == "*" or name.startswith("stride_") or name in divisible)
    }
    source = ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs)
    return triton.compile(source, target=TARGET, options={"num_warps": warps, "num_stages": stages})


def _consts(fn: object, flags: dict, kernel: str, even: bool = True) -> dict:
    names = fn.arg_names  # type: ignore[attr-defined]
    consts: dict = dict(HEAD_DIM=128, HEAD_DIM_PAD=128, BLOCK_HELD=128, BLOCK_STREAMED=64,
                        CAUSAL=True, EVEN_Q=even, DOT_PREC="tf32")  # fmt: skip
    if kernel == "dkdv":
        consts["EVEN_K"] = even
    for flag in ("WINDOW", "SOFTCAP", "ALIBI", "VARLEN", "DP_FIRST", "CLAMP"):
        if flag in names:
            consts[flag] = flags.get(flag, False)
    if "DIAG_STAGES" in names:  # None: the launch's num_stages
        consts["DIAG_STAGES"] = flags.get("DIAG_STAGES")
    off = {
        "win_left": "WINDOW", "win_right": "WINDOW", "softcap2": "SOFTCAP",
        "Slopes": "ALIBI", "stride_slope_b": "ALIBI", "CuQ": "VARLEN", "CuK": "VARLEN",
        "Sched": "VARLEN",
    }  # fmt: skip
    for name, flag in off.items():
        if name in names and not consts.get(flag):
            consts[name] = None
    for name, value in flags.items():
        if name not in consts and name in names:
            consts[name] = value
    return consts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help=f"variants (default all): {', '.join(VARIANTS)}")
    ap.add_argument("--stages", type=int, default=3)
    ap.add_argument("--warps", type=int, default=8)
    ap.add_argument("--ragged", action="store_true", help="lengths not a multiple of a tile")
    args = ap.parse_args()
    even = "ragged" if args.ragged else "even"
    print(
        f"triton {triton.__version__}; bf16 d128 causal, 128 x 64, "
        f"{args.warps} warps, {args.stages} stages, {even}"
    )
    kernels = {"dkdv": flash_kernels_bwd._bwd_dkdv_kernel, "dq": flash_kernels_bwd._bwd_dq_kernel}
    for name in args.names or list(VARIANTS):
        for kname, fn in kernels.items():
            try:
                k = compile_one(
                    fn, _consts(fn, VARIANTS[name], kname, not args.ragged), args.warps, args.stages
                )
            except Exception as e:  # a compile failure is a result here
                print(f"{name:10s} {kname:5s} error {type(e).__name__}: {str(e)[:200]}")
                continue
            ptx = k.asm["ptx"]
            info = ptxas_info(ptx)
            counts = {op: len(re.findall(rf"\b{op}\.", ptx)) for op in ("tanh", "ex2")}
            local = len(re.findall(r"\b(ld|st)\.local", ptx))
            print(
                f"{name:10s} {kname:5s} smem {k.metadata.shared:6d} regs {info['registers']:3d} "
                f"spills {info['spill_stores']}/{info['spill_loads']} "
                f"tanh {counts['tanh']} ex2 {counts['ex2']} local {local}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
