"""The decode split kernel's paged launches compiled for sm_90 on a CPU (no GPU needed):
per launch, its SASS instruction count, the asynchronous copies (LDGSTS), the shared
memory, and the instructions of each loop body (a backward branch's span), so the
instructions per key of the block loop compare across key blocks (issue 20, session 6:
32-key blocks at 5 stages against 64-key blocks at 4 stages, pages of 64 and 256).

    PYTHONPATH=/tmp/tri36 python tools/gpu/decode_sass.py     (triton 3.6.0, the H200's)

Uses the cuobjdump shipped with triton. A development tool, not installed.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from fa_bench.kernels import decode_kernels as dk

# (page size, keys per block, stages)
LAUNCHES = ((64, 32, 5), (64, 64, 4), (256, 32, 5), (256, 64, 4))
_ADDR = re.compile(r"/\*([0-9a-f]{4,})\*/")


def _signature(fn, consts: dict) -> dict:
    sig = {}
    for name in fn.arg_names:
        if name in consts:
            sig[name] = "constexpr"
        elif name.startswith("stride_") or name in ("heads_kv", "row_blocks"):
            sig[name] = "i32"
        elif name == "qk_scale":
            sig[name] = "fp32"
        elif name in ("SeqLens", "BlockTable", "Counters"):
            sig[name] = "*i32"
        elif name in ("Lse", "OPart", "LsePart"):
            sig[name] = "*fp32"
        else:
            sig[name] = "*bf16"
    return sig


def compile_paged(page: int, block_n: int, stages: int):
    """The split kernel (d128 bf16, GQA 4, Sq 1, with splits and PDL: the H200's batch 8 x
    8k launch) compiled for sm_90, pointers and strides divisible by 16 as at a launch."""
    fn = dk._decode_split_kernel
    consts = dict(HEAD_DIM=128, HEAD_DIM_PAD=128, GROUP=4, SEQ_Q=1, BLOCK_ROWS=16,
                  BLOCK_N=block_n, PAGED=True, PAGE_SIZE=page, SPLIT=True, DOT_PREC="tf32",
                  INTERLEAVE=False, FUSED=False, SPLITS_PAD=1, PDL=True)  # fmt: skip
    sig = _signature(fn, consts)
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names)
             if n not in consts and (sig[n][0] == "*" or n.startswith("stride_"))}  # fmt: skip
    src = ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options=dict(num_warps=4, num_stages=stages))  # fmt: skip


def sass_lines(cubin: bytes) -> list[str]:
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True, check=True)
    return [line for line in out.stdout.splitlines() if _ADDR.search(line)]


def loop_bodies(lines: list[str]) -> list[int]:
    """Instructions between each backward branch and its target (16 bytes each)."""
    bodies = []
    for line in lines:
        if " BRA " not in line:
            continue
        target = re.search(r"0x([0-9a-f]+)", line.split(" BRA ", 1)[1])
        here = int(_ADDR.search(line).group(1), 16)
        if target and int(target.group(1), 16) < here:
            bodies.append((here - int(target.group(1), 16)) // 16)
    return bodies


def main() -> int:
    print(f"triton {triton.__version__}, sm_90; d128 bf16, GQA 4, Sq 1, splits, PDL")
    print("| page | keys per block | stages | SASS | LDGSTS | shared B | loop bodies | "
          "unmasked loop per key |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for page, block_n, stages in LAUNCHES:
        kernel = compile_paged(page, block_n, stages)
        lines = sass_lines(kernel.asm["cubin"])
        bodies = loop_bodies(lines)
        per_key = f"{bodies[0] / block_n:.1f}" if bodies else "–"
        print(f"| {page} | {block_n} | {stages} | {len(lines)} | "
              f"{sum('LDGSTS' in x for x in lines)} | {kernel.metadata.shared} | "
              f"{', '.join(map(str, bodies))} | {per_key} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
