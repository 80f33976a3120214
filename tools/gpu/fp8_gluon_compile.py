"""Compile the Gluon fp8 forward (kernels/flash_gluon_fp8_kernels.py) for sm_90 on any
machine: every candidate launch (flash_gluon_fp8.candidate_configs) × head_dim 64/128 ×
causal, through PTX and ptxas, with shared memory, registers and spills per combination.
Gluon has no interpreter: this is how the kernel is checked before a GPU run. Against the
H200's triton 3.6.0 installed aside:

    PYTHONPATH=/tmp/tri36 python tools/gpu/fp8_gluon_compile.py [--json OUT] [--roles a,b]

Exits 1 if any combination fails to compile or needs more shared memory than sm_90 has.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time

os.environ.pop("TRITON_INTERPRET", None)  # compile, never interpret (before triton's import)

import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource

from fa_bench.kernels import flash_gluon_fp8_kernels, flash_gluon_fp8_persist
from fa_bench.kernels.flash_gluon import version_reason
from fa_bench.kernels.flash_gluon_fp8 import HEAD_DIMS, Fp8GluonConfig, candidate_configs

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from gluon_compile import ptxas_info  # tools/gluon_compile.py

TARGET = GPUTarget("cuda", 90, 32)
SMEM_LIMIT = 227 * 1024


def _desc(dtype: str, block: list[int]) -> str:
    gl_dtype = gl.bfloat16 if dtype == "bf16" else gl.float8e4nv
    layout = gl.NVMMASharedLayout.get_default_for(block, gl_dtype)
    return f"tensordesc<{dtype}[{', '.join(map(str, block))}],{layout!r}>"


def compile_one(cfg: Fp8GluonConfig, head_dim: int, causal: bool) -> object:
    """The compiled kernel (triton's CompiledKernel) for one combination."""
    sig: dict[str, str] = dict(
        q_desc=_desc("fp8e4nv", [1, 1, cfg.block_m, head_dim]),
        k_desc=_desc("fp8e4nv", [1, 1, cfg.block_n, head_dim]),
        vt_desc=_desc("fp8e4nv", [1, 1, head_dim, cfg.block_n]),
        o_desc=_desc("bf16", [1, 1, cfg.block_m, head_dim]),
        lse_ptr="*fp32",
        q_descale_ptr="*fp32",
        k_descale_ptr="*fp32",
        v_descale_ptr="*fp32",
        heads_q="i32",
        group="i32",
        seq_q="i32",
        seq_k="i32",
        sm_scale_log2="fp32",
    )
    consts: dict[str, object] = dict(
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, HEAD_DIM=head_dim, STAGES=cfg.stages,
        CAUSAL=causal, PINGPONG=cfg.pingpong, SOFTMAX=cfg.softmax_code(),
        PRODUCER_REGS=cfg.producer_regs, CONSUMER_REGS=cfg.consumer_regs, P_SMEM=cfg.p_smem,
    )  # fmt: skip
    fn = flash_gluon_fp8_kernels._fwd_fp8_ws
    if cfg.persistent:
        fn = flash_gluon_fp8_persist._fwd_fp8_persistent
        sig["n_bh"] = "i32"
        sig["bh_group"] = "i32"
        # the round robin's plan is None (a constexpr), the LPT plan an int32 tensor
        sig["plan"] = "*i32" if cfg.lpt else "constexpr"
        if not cfg.lpt:
            consts["plan"] = None
        consts["LPT"] = cfg.lpt
    else:
        consts["O_IN_P"] = cfg.o_in_p
    consts["CONSUMERS"] = cfg.consumers
    sig.update({name: "constexpr" for name in consts})
    source = GluonASTSource(fn=fn, signature=sig, constexprs=consts)
    return triton.compile(source, target=TARGET, options={"num_warps": 4})


def grid(roles: list[str] | None) -> list[tuple[str, Fp8GluonConfig, int, bool]]:
    combos = []
    for head_dim, causal in itertools.product(HEAD_DIMS, (False, True)):
        for role, cfg in candidate_configs(head_dim).items():
            if roles is None or role in roles:
                combos.append((role, cfg, head_dim, causal))
    return combos


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--roles", help="comma-separated roles (default: all)")
    args = ap.parse_args()
    print(f"triton {triton.__version__}", flush=True)
    reason = version_reason(triton.__version__)
    if reason:
        print(f"{reason}: install it aside and run with PYTHONPATH set to it")
        return 2
    roles = args.roles.split(",") if args.roles else None
    rows, failed = [], 0
    for role, cfg, head_dim, causal in grid(roles):
        row: dict[str, object] = dict(role=role, config=cfg.label(), head_dim=head_dim,
                                      causal=causal)  # fmt: skip
        start = time.time()
        try:
            kernel = compile_one(cfg, head_dim, causal)
            row.update(shared=kernel.metadata.shared, **ptxas_info(kernel.asm["ptx"]))
            row["ok"] = kernel.metadata.shared <= SMEM_LIMIT
            if not row["ok"]:
                row["error"] = f"shared memory {kernel.metadata.shared} > {SMEM_LIMIT}"
        except Exception as e:  # report every failure, then go on
            lines = str(e).strip().splitlines() or [""]
            row.update(ok=False, error=f"{type(e).__name__}: {lines[-1][:300]}")
        row["seconds"] = round(time.time() - start, 1)
        failed += not row["ok"]
        rows.append(row)
        detail = (
            f"smem {row['shared']} regs {row['registers']} spills "
            f"{row['spill_stores']}/{row['spill_loads']}"
            if row["ok"]
            else row["error"]
        )
        print(f"{'ok  ' if row['ok'] else 'FAIL'} {cfg.label():32s} d{head_dim} "
              f"causal={int(causal)}: {detail}", flush=True)  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    print(f"{len(rows)} combinations, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
