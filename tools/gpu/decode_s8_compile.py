"""Issue 20, session 8: the decode launches with the tile merge compiled for sm_90 on a
CPU (no GPU needed), beside the launches without it: per launch its registers per
thread, spills (local loads/stores in the PTX), shared memory, asynchronous copies (the
key/value pipeline) and the PTX's GPU-scope atomics, so a fused merge that would cost the
split kernel programs per SM (registers or shared memory) shows before a GPU run.

    PYTHONPATH=/tmp/tri36 python tools/gpu/decode_s8_compile.py     (triton 3.6.0)

Prints the triton version, then one line per launch: name regs spills shared copies
atomics (registers per thread from the cubin: ptxas' choice, which differs between
triton versions; the H200 runs 3.6.0). A development tool,
not installed; tests/test_decode_s8.py runs it (slow).
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)  # compile, never interpret (before triton)
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))

import triton
from decode_sm90 import signature
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from fa_bench.kernels import decode_kernels as dk
from fa_bench.kernels import decode_merge as dm

# (name, group, Sq, page, block_n, stages, fused, merge_tile, chunk): batch 8 x 8k's
# launches (8 splits) at Sq 1/4 and GQA 4/8, contiguous and pages of 64
SPLIT_LAUNCHES = [
    ("contig sq4 two-kernel", 4, 4, 0, 64, 2, False, False, 1),
    ("contig sq4 fused-tile", 4, 4, 0, 64, 2, True, True, 8),
    ("page64 sq4 two-kernel", 4, 4, 64, 32, 5, False, False, 1),
    ("page64 sq4 fused-tile", 4, 4, 64, 32, 5, True, True, 8),
    ("page64 g8 fused-tile", 8, 1, 64, 32, 5, True, True, 8),
    ("contig sq1 fused-tile", 4, 1, 0, 64, 2, True, True, 8),
    ("contig g8 sq8 fused-tile", 8, 8, 0, 64, 2, True, True, 2),
]
# (name, group, Sq, block_rows, chunk)
TILE_COMBINES = [("combine-tile sq4", 4, 4, 16, 8), ("combine-tile g8 sq8", 8, 8, 64, 2)]
TARGET = GPUTarget("cuda", 90, 32)


def _attrs(fn, consts: dict, sig: dict) -> dict:
    # pointers and strides divisible by 16, as triton specializes them at a launch
    return {
        (i,): [["tt.divisibility", 16]]
        for i, name in enumerate(fn.arg_names)
        if name not in consts and (sig[name][0] == "*" or name.startswith("stride_"))
    }


def compile_one(fn, consts: dict, stages: int):
    sig = signature(fn, consts, "bf16")
    src = ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=_attrs(fn, consts, sig))
    return triton.compile(src, target=TARGET, options=dict(num_warps=4, num_stages=stages))


def describe(name: str, kernel) -> str:
    ptx = kernel.asm["ptx"]
    spills = len(re.findall(r"\b(ld|st)\.local", ptx))
    copies = kernel.asm["ttgir"].count("async_copy_global_to_local")
    atomics = len(re.findall(r"\batom\.[a-z.]*gpu", ptx))
    regs = getattr(kernel, "n_regs", None)
    if regs is None:  # triton 3.6 fills n_regs when the kernel is loaded; read the cubin
        regs = _regs_from_cubin(kernel)
    return f"{name.replace(' ', '_')} {regs} {spills} {kernel.metadata.shared} {copies} {atomics}"


def _regs_from_cubin(kernel) -> int:
    import subprocess
    import tempfile

    from triton.backends.nvidia.compiler import get_ptxas  # noqa: F401  (the toolkit's dir)

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        out = subprocess.run([str(tool), "-res-usage", f.name], capture_output=True, text=True)
    found = re.search(r"REG:(\d+)", out.stdout)
    return int(found.group(1)) if found else -1


def main() -> int:
    print("triton", triton.__version__, flush=True)
    for name, group, sq, page, bn, stages, fused, tile, chunk in SPLIT_LAUNCHES:
        consts = dict(HEAD_DIM=128, HEAD_DIM_PAD=128, GROUP=group, SEQ_Q=sq,
                      BLOCK_ROWS=max(16, group * sq), BLOCK_N=bn, PAGED=bool(page),
                      PAGE_SIZE=page, SPLIT=True, DOT_PREC="tf32", INTERLEAVE=False,
                      FUSED=fused, SPLITS_PAD=8 if fused else 1, PDL=not fused,
                      ONE_LOOP=False, MERGE_TILE=tile, CHUNK=chunk)  # fmt: skip
        print(describe(name, compile_one(dk._decode_split_kernel, consts, stages)), flush=True)
    for name, group, sq, rows, chunk in TILE_COMBINES:
        consts = dict(HEAD_DIM=128, HEAD_DIM_PAD=128, GROUP=group, SEQ_Q=sq, BLOCK_ROWS=rows,
                      CHUNK=chunk, PDL=True)  # fmt: skip
        print(describe(name, compile_one(dm._decode_combine_tile_kernel, consts, 1)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
