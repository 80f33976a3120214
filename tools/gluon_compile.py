"""Compile every supported combination of the Gluon forward for sm_90 on any machine.

Gluon kernels do not run in the Triton interpreter, so this is how they are checked
before a GPU run: each (config, dtype, head_dim, causal) is compiled by triton (the
stages up to PTX and the cubin run on the CPU) and ptxas reports registers and spills.
Build against the H200's triton 3.6.0, installed aside:

    PYTHONPATH=/tmp/tri36 python tools/gluon_compile.py [--json OUT] [--quick] [--variants]

`--variants` compiles the variant kernel (issue 19: window, softcap, ALiBi, packed,
every combination, kernels/flash_gluon_var_ws.py) instead of the dense ones.

Prints one line per combination (shared memory, registers, spills, or the error) and
exits 1 if any combination that the heuristic or the check script uses failed to compile
or asked for more shared memory than sm_90 has. A developer tool, not installed.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
import time

# Compile, never interpret: a script run from a test inherits its TRITON_INTERPRET=1. A
# test that imports this module (or a tool built on it) in-process keeps the variable:
# kernels its later tests import must still be interpreted.
if "pytest" not in sys.modules:
    os.environ.pop("TRITON_INTERPRET", None)

import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource

from fa_bench.kernels import (
    flash_gluon_kernels,
    flash_gluon_persist,
    flash_gluon_var_ws,
    flash_gluon_ws,
)
from fa_bench.kernels.flash_gluon import (
    HEAD_DIMS,
    GluonConfig,
    candidate_configs,
    version_reason,
)

TARGET = GPUTarget("cuda", 90, 32)
# sm_90's opt-in shared memory per block
SMEM_LIMIT = 227 * 1024
_GL_DTYPES = {"bf16": gl.bfloat16, "fp16": gl.float16}


def _desc(dtype: str, block: list[int]) -> str:
    layout = gl.NVMMASharedLayout.get_default_for(block, _GL_DTYPES[dtype])
    return f"tensordesc<{dtype}[{', '.join(map(str, block))}],{layout!r}>"


def compile_one(cfg: GluonConfig, dtype: str, head_dim: int, causal: bool) -> object:
    """The compiled kernel (triton's CompiledKernel) for one combination."""
    sig = dict(
        q_desc=_desc(dtype, [1, 1, cfg.block_m, head_dim]),
        k_desc=_desc(dtype, [1, 1, cfg.block_n, head_dim]),
        v_desc=_desc(dtype, [1, 1, cfg.block_n, head_dim]),
        o_desc=_desc(dtype, [1, 1, cfg.block_m, head_dim]),
        lse_ptr="*fp32",
        heads_q="i32",
        group="i32",
        seq_q="i32",
        seq_k="i32",
        qk_scale="fp32",
    )
    consts: dict[str, object] = dict(
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        HEAD_DIM=head_dim,
        STAGES=cfg.stages,
        CAUSAL=causal,
    )
    if cfg.variant == "ws":
        fn = flash_gluon_ws._fwd_ws
        if cfg.persistent:
            fn = flash_gluon_persist._fwd_ws_persistent
            sig["n_bh"] = "i32"
        consts.update(
            NUM_WARPS=4,
            PINGPONG=cfg.pingpong,
            PRODUCER_REGS=cfg.producer_regs,
            CONSUMER_REGS=cfg.consumer_regs,
        )
        if cfg.persistent:
            consts["Q_BUFFERS"] = cfg.q_buffers
        else:
            consts["CONSUMERS"] = cfg.consumers
        warps = 4
    else:
        fn = flash_gluon_kernels._fwd_pipelined
        consts.update(NUM_WARPS=cfg.num_warps)
        warps = cfg.num_warps
    sig.update({name: "constexpr" for name in consts})
    source = GluonASTSource(fn=fn, signature=sig, constexprs=consts)
    return triton.compile(source, target=TARGET, options={"num_warps": warps})


# The variant kernel's runtime arguments: (name, type, the VAR bit that uses it); an
# argument whose bit is off is None (a constexpr), as flash_gluon_varhost passes it.
_VAR_ARGS = (
    ("win_left", "i32", 1), ("win_right", "i32", 1), ("cap_mul", "fp32", 2),
    ("slopes_ptr", "*fp32", 4), ("stride_slope_b", "i32", 4), ("alibi_mul", "fp32", 4),
    ("cu_q", "*i32", 8), ("cu_k", "*i32", 8), ("o_ptr", "*{dtype}", 8),
    ("stride_os", "i32", 8), ("stride_oh", "i32", 8),
)  # fmt: skip
# Every combination of window (1), softcap (2), ALiBi (4), packed (8), and the softcap
# with the development f16x2 tanh (16) alone and with everything, and with the
# development Q scaling (32); ALiBi's per-column form (4096, causal calls) alone, with a
# window, with everything; the softcap's fixed offset (8192) alone, with a window, packed,
# with Q scaling; the threshold rescale (65536, fp16 softcap's development switch) with the
# softcap alone, with a window, packed, and with ALiBi's per-column form; its per-warp form
# (+ 131072) with the softcap alone and packed.
VAR_BITS = (*range(1, 16), 18, 31, 34, 4100, 4101, 4103, 4111, 8194, 8195, 8202, 8226,
            65538, 65539, 65546, 69638, 196610, 196618)  # fmt: skip


def compile_variant(cfg: GluonConfig, dtype: str, head_dim: int, causal: bool, var: int) -> object:
    """The compiled variant kernel (flash_gluon_var_ws._fwd_ws_var) for one combination;
    `var` the VAR bits."""
    sig: dict[str, str] = dict(
        q_desc=_desc(dtype, [1, 1, cfg.block_m, head_dim]),
        k_desc=_desc(dtype, [1, 1, cfg.block_n, head_dim]),
        v_desc=_desc(dtype, [1, 1, cfg.block_n, head_dim]),
        o_desc=_desc(dtype, [1, 1, cfg.block_m, head_dim]),
        lse_ptr="*fp32", heads_q="i32", group="i32", seq_q="i32", seq_k="i32", sc="fp32",
    )  # fmt: skip
    consts: dict[str, object] = {}
    for name, kind, bit in _VAR_ARGS:
        sig[name] = kind.format(dtype=dtype) if var & bit else "constexpr"
        if not var & bit:
            consts[name] = None
    tiles = dict(
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, HEAD_DIM=head_dim, STAGES=cfg.stages,
        CAUSAL=causal, NUM_WARPS=4, PINGPONG=cfg.pingpong, PRODUCER_REGS=cfg.producer_regs,
        CONSUMER_REGS=cfg.consumer_regs, CONSUMERS=cfg.consumers, VAR=var,
    )  # fmt: skip
    sig.update({name: "constexpr" for name in tiles})
    consts.update(tiles)
    source = GluonASTSource(fn=flash_gluon_var_ws._fwd_ws_var, signature=sig, constexprs=consts)
    return triton.compile(source, target=TARGET, options={"num_warps": 4})


def ptxas_info(ptx: str) -> dict[str, int]:
    """Registers per thread and spill bytes from `ptxas -v` on the kernel's PTX."""
    from triton.backends.nvidia.compiler import get_ptxas

    ptxas = get_ptxas(90).path
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.ptx")
        with open(path, "w") as f:
            f.write(ptx)
        out = subprocess.run(
            [ptxas, "-arch=sm_90a", "-v", path, "-o", os.devnull],
            capture_output=True,
            text=True,
            check=True,
        )
    text = out.stderr + out.stdout
    regs = re.search(r"Used (\d+) registers", text)
    spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", text)
    return {
        "registers": int(regs.group(1)) if regs else -1,
        "spill_stores": int(spill.group(1)) if spill else -1,
        "spill_loads": int(spill.group(2)) if spill else -1,
    }


def grid(quick: bool, variants: bool = False) -> list[tuple[GluonConfig, str, int, bool, int]]:
    """The combinations (config, dtype, head_dim, causal, VAR bits; 0 = the dense kernel):
    `candidate_configs` (the heuristic's and the variants the GPU check measures) for each
    dtype, head_dim and causal; with `variants`, the variant kernel's launch
    (flash_gluon_varhost.variant_config of the heuristic's) for every VAR combination."""
    from fa_bench.kernels.flash_gluon import gluon_config
    from fa_bench.kernels.flash_gluon_varhost import variant_config

    combos = []
    dtypes = ("bf16",) if quick else ("bf16", "fp16")
    for dtype, head_dim, causal in itertools.product(dtypes, HEAD_DIMS, (False, True)):
        if variants:
            cfg = variant_config(gluon_config(head_dim, causal), head_dim)
            combos += [(cfg, dtype, head_dim, causal, var) for var in VAR_BITS]
            continue
        for cfg in candidate_configs(head_dim).values():
            combos.append((cfg, dtype, head_dim, causal, 0))
    return combos


def _compile_row(cfg: GluonConfig, dtype: str, head_dim: int, causal: bool, var: int) -> dict:
    """One combination's result row: shared memory, registers, spills, or the error."""
    row: dict[str, object] = dict(
        config=cfg.label(), dtype=dtype, head_dim=head_dim, causal=causal, var=var
    )
    start = time.time()
    try:
        if var:
            kernel = compile_variant(cfg, dtype, head_dim, causal, var)
        else:
            kernel = compile_one(cfg, dtype, head_dim, causal)
        row.update(shared=kernel.metadata.shared, **ptxas_info(kernel.asm["ptx"]))
        row["ok"] = kernel.metadata.shared <= SMEM_LIMIT
        if not row["ok"]:
            row["error"] = f"shared memory {kernel.metadata.shared} > {SMEM_LIMIT}"
    except Exception as e:  # report every failure, then go on
        row.update(ok=False, error=f"{type(e).__name__}: {str(e).strip().splitlines()[-1][:300]}")
    row["seconds"] = round(time.time() - start, 1)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--quick", action="store_true", help="bf16 only")
    ap.add_argument(
        "--variants", action="store_true", help="the variant kernel, every VAR combination"
    )
    args = ap.parse_args()
    print(f"triton {triton.__version__}", flush=True)
    reason = version_reason(triton.__version__)
    if reason:
        print(f"{reason}: install it aside and run with PYTHONPATH set to it (see the docstring)")
        return 2
    rows, failed = [], 0
    for cfg, dtype, head_dim, causal, var in grid(args.quick, args.variants):
        row = _compile_row(cfg, dtype, head_dim, causal, var)
        failed += not row["ok"]
        rows.append(row)
        detail = (
            f"smem {row['shared']} regs {row['registers']} spills "
            f"{row['spill_stores']}/{row['spill_loads']}"
            if row["ok"]
            else row["error"]
        )
        print(
            f"{'ok  ' if row['ok'] else 'FAIL'} {cfg.label():28s} {dtype} d{head_dim} "
            f"causal={int(causal)} var={var}: {detail}",
            flush=True,
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    print(f"{len(rows)} combinations, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
