"""Compile every combination of the Gluon backward (issue 18) for sm_90 on any machine.

Gluon kernels do not run in the Triton interpreter, so this is how they are checked
before a GPU run: each (config, dtype, head_dim, causal) goes through triton's stages up
to PTX and the cubin on the CPU, and ptxas reports registers and spills. Against the
H200's triton 3.6.0, installed aside:

    PYTHONPATH=/tmp/tri36 python tools/gpu/gluon_bwd_compile.py [--json OUT] [--quick]
        [--var 0,1,2,4,7]

`--var`: the variant bits to compile each combination with (issue 19:
kernels/flash_gluon_bwd_varhost.py's window 1, softcap 2, ALiBi 4; 0 dense, the default).

One line per combination (shared memory, registers, spills, or the error); exits 1 if
any failed to compile or asked for more shared memory than sm_90 has. Not installed.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)  # compile, never interpret (before triton's import)

import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource

from fa_bench.kernels import flash_gluon_bwd_kernels
from fa_bench.kernels.flash_gluon import version_reason
from fa_bench.kernels.flash_gluon_bwd import (
    BWD_HEAD_DIMS,
    GluonBwdConfig,
    candidate_bwd_configs,
    row_layout,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gluon_compile import ptxas_info

# ptxas's note when it cannot keep wgmmas asynchronous (too few registers for the
# accumulators in flight): each then waits for the one before, a measured 15-18% loss
# (session 6 call B: the early_dq_all and dq_first=2 launches)
SERIAL_CODE = "C7512"


def wgmma_serialized(ptx: str) -> bool:
    """Whether ptxas (triton's, sm_90a) serialises the kernel's wgmmas."""
    import subprocess
    import tempfile

    from triton.backends.nvidia.compiler import get_ptxas

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.ptx")
        Path(path).write_text(ptx)
        out = subprocess.run([get_ptxas(90).path, "-arch=sm_90a", "-v", path, "-o", os.devnull],
                             capture_output=True, text=True, check=True)  # fmt: skip
    return SERIAL_CODE in out.stdout + out.stderr


TARGET = GPUTarget("cuda", 90, 32)
SMEM_LIMIT = 227 * 1024
_GL_DTYPES = {"bf16": gl.bfloat16, "fp16": gl.float16, "fp32": gl.float32}


def _desc(dtype: str, block: list[int]) -> str:
    layout = gl.NVMMASharedLayout.get_default_for(block, _GL_DTYPES[dtype])
    return f"tensordesc<{dtype}[{', '.join(map(str, block))}],{layout!r}>"


def _row_desc(rows: int) -> str:
    layout = row_layout()
    return f"tensordesc<fp32[1, {rows}],{layout!r}>"


def compile_one(cfg: GluonBwdConfig, dtype: str, head_dim: int, causal: bool, probe: int = 0,
                var: int = 0) -> object:  # fmt: skip
    """The compiled kernel (triton's CompiledKernel) for one combination (`probe`: the
    check's timing probes, flash_gluon_bwd._launch; `var`: the variant bits)."""
    tile = [1, 1, cfg.block_m, head_dim]
    kv_tile = [1, 1, cfg.keys, head_dim]
    sig: dict[str, str] = dict(
        q_desc=_desc(dtype, tile),
        k_desc=_desc(dtype, kv_tile),
        v_desc=_desc(dtype, kv_tile),
        do_desc=_desc(dtype, tile),
        dk_desc=_desc(dtype, kv_tile),
        dv_desc=_desc(dtype, kv_tile),
        dq_desc=_desc("fp32", [1, 1, cfg.block_m, cfg.dq_cols(head_dim)]),
        lse_desc=_row_desc(cfg.block_m),
        delta_desc=_row_desc(cfg.block_m),
        heads_q="i32",
        heads_kv="i32",
        seq_q="i32",
        seq_k="i32",
        qk_scale="fp32",
        scale="fp32",
        win_left="i32",
        win_right="i32",
        cap_in="fp32",
        cap_out="fp32",
        slopes="*fp32" if var & 4 else "constexpr",
        slope_stride_b="i32",
    )
    consts: dict[str, object] = dict(
        BLOCK_M=cfg.block_m,
        KEYS=cfg.keys,
        HEAD_DIM=head_dim,
        STAGES=cfg.stages,
        CAUSAL=causal,
        PRODUCER_REGS=cfg.producer_regs,
        CONSUMER_REGS=cfg.consumer_regs,
        DQ_MODE=probe or cfg.dq_mode,
        ROTATE=cfg.rotate,
        PINGPONG=cfg.pingpong,
        OPS_SMEM=cfg.ops_smem,
        DQ_PERM=cfg.dq_perm,
        VAR=var,
    )
    if not var & 4:
        consts["slopes"] = None
    sig.update({name: "constexpr" for name in consts})
    source = GluonASTSource(fn=flash_gluon_bwd_kernels._bwd_ws, signature=sig, constexprs=consts)
    return triton.compile(source, target=TARGET, options={"num_warps": 4})


def grid(quick: bool, roles: str = "") -> list[tuple[GluonBwdConfig, str, int, bool, int]]:
    """`candidate_bwd_configs` for each dtype, head_dim and causal (`roles`: a comma list
    of the roles to take, all when empty); the heuristic's bf16 kernel also as the GPU
    check's timing probe."""
    dtypes = ("bf16",) if quick else ("bf16", "fp16")
    combos = []
    only = set(filter(None, roles.split(",")))
    for dtype, head_dim, causal in itertools.product(dtypes, BWD_HEAD_DIMS, (False, True)):
        for role, cfg in candidate_bwd_configs(head_dim).items():
            if only and role not in only:
                continue
            probes = (0, 2) if role == "ws" and dtype == "bf16" else (0,)
            combos += [(cfg, dtype, head_dim, causal, probe) for probe in probes]
    return combos


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--quick", action="store_true", help="bf16 only")
    ap.add_argument("--asm", help="write each kernel's ttgir/ptx into this folder")
    ap.add_argument("--roles", default="", help="only these roles (comma list)")
    ap.add_argument("--dims", default="", help="only these head dims (comma list)")
    ap.add_argument("--var", default="0", help="variant bits to compile with (comma list)")
    args = ap.parse_args()
    print(f"triton {triton.__version__}", flush=True)
    reason = version_reason(triton.__version__)
    if reason:
        print(f"{reason}: install it aside and run with PYTHONPATH set to it (see the docstring)")
        return 2
    rows, failed = [], 0
    dims = {int(d) for d in args.dims.split(",") if d}
    bits = [int(b) for b in args.var.split(",") if b]
    for (cfg, dtype, head_dim, causal, probe), var in itertools.product(
        grid(args.quick, args.roles), bits
    ):
        if (dims and head_dim not in dims) or (var and probe):
            continue
        row: dict[str, object] = dict(config=cfg.label(), dtype=dtype, head_dim=head_dim,
                                      causal=causal, probe=probe, var=var)  # fmt: skip
        start = time.time()
        try:
            kernel = compile_one(cfg, dtype, head_dim, causal, probe, var)
            row.update(shared=kernel.metadata.shared, **ptxas_info(kernel.asm["ptx"]))
            row["serialized"] = wgmma_serialized(kernel.asm["ptx"])
            row["ok"] = kernel.metadata.shared <= SMEM_LIMIT
            if not row["ok"]:
                row["error"] = f"shared memory {kernel.metadata.shared} > {SMEM_LIMIT}"
            if args.asm:
                os.makedirs(args.asm, exist_ok=True)
                probe_tag = f"-probe{probe}" if probe else ""  # not over the kernel's own
                var_tag = f"-var{var}" if var else ""
                stem = (f"{args.asm}/{cfg.label()}{probe_tag}{var_tag}-{dtype}-d{head_dim}"
                        f"-c{int(causal)}")  # fmt: skip
                for ext in ("ttgir", "ptx"):
                    Path(f"{stem}.{ext}").write_text(kernel.asm[ext])
        except Exception as e:  # report every failure, then go on
            lines = str(e).strip().splitlines() or [""]
            row.update(ok=False, error=f"{type(e).__name__}: {' | '.join(lines[-3:])[:600]}")
        row["seconds"] = round(time.time() - start, 1)
        failed += not row["ok"]
        rows.append(row)
        detail = (
            f"smem {row['shared']} regs {row['registers']} spills "
            f"{row['spill_stores']}/{row['spill_loads']}"
            + (" WGMMA SERIALIZED (ptxas C7512)" if row["serialized"] else "")
            if row["ok"]
            else row["error"]
        )
        name = cfg.label() + (f" probe {probe}" if probe else "") + (f" var {var}" if var else "")
        print(f"{'ok  ' if row['ok'] else 'FAIL'} {name:32s} {dtype} d{head_dim} "
              f"causal={int(causal)}: {detail}", flush=True)  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    print(f"{len(rows)} combinations, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
