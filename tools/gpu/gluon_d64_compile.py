"""Compile the head_dim 64 study's launches (tools/gpu/gluon_d64.py) for sm_90 on any machine.

    PYTHONPATH=/tmp/tri36 python tools/gpu/gluon_d64_compile.py [--json OUT] [--ptx DIR]

Each launch of `gluon_d64.candidates()` (the exp2 split `GluonConfig.exp2_emu` on the
heuristic's kernels and the variants) is compiled by triton 3.6.0 for sm_90 in bf16 and
fp16, causal and not; ptxas reports registers and spills, and the PTX is scanned for the
split's instructions (ex2.approx count, the emulation's shl.b32). `--ptx DIR` keeps each
PTX file (to compare an exp2_emu=0 launch with the kernel before the change). Exits 1 if
a launch failed, spilled (but SPILL_OK's) or asked for too much shared memory.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)  # compile, never interpret (before triton's import)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tools/: gluon_compile
sys.path.insert(0, str(Path(__file__).resolve().parent))  # tools/gpu: gluon_d64

import triton
from gluon_compile import SMEM_LIMIT, TARGET, _desc, ptxas_info
from triton.experimental.gluon._runtime import GluonASTSource

from fa_bench.kernels import flash_gluon_kernels, flash_gluon_persist, flash_gluon_ws
from fa_bench.kernels.flash_gluon import GluonConfig, version_reason

# Launches whose spills are known and off the hot path: three consumers over 128-key steps
# (160 registers) spill the mask's per-column offsets (148 bytes at d64), stored once and
# reloaded only in masked key blocks (the last one, non-causal).
SPILL_OK = ("ws-m64-n128-s4-c3",)


def compile_cfg(cfg: GluonConfig, dtype: str, head_dim: int, causal: bool) -> object:
    """The compiled kernel of one launch, its SOFTMAX code included."""
    sig = dict(
        q_desc=_desc(dtype, [1, 1, cfg.block_m, head_dim]),
        k_desc=_desc(dtype, [1, 1, cfg.block_n, head_dim]),
        v_desc=_desc(dtype, [1, 1, cfg.block_n, head_dim]),
        o_desc=_desc(dtype, [1, 1, cfg.block_m, head_dim]),
        lse_ptr="*fp32", heads_q="i32", group="i32", seq_q="i32", seq_k="i32", qk_scale="fp32",
    )  # fmt: skip
    consts: dict[str, object] = dict(
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, HEAD_DIM=head_dim, STAGES=cfg.stages,
        CAUSAL=causal, SOFTMAX=cfg.softmax_code(),
    )  # fmt: skip
    warps = 4
    if cfg.variant == "pipelined":
        fn = flash_gluon_kernels._fwd_pipelined
        consts.update(NUM_WARPS=cfg.num_warps)
        warps = cfg.num_warps
    else:
        consts.update(NUM_WARPS=4, PINGPONG=cfg.pingpong, PRODUCER_REGS=cfg.producer_regs,
                      CONSUMER_REGS=cfg.consumer_regs)  # fmt: skip
        if cfg.persistent:
            fn = flash_gluon_persist._fwd_ws_persistent
            sig["n_bh"] = "i32"
            consts["Q_BUFFERS"] = cfg.q_buffers
        else:
            fn = flash_gluon_ws._fwd_ws
            consts["CONSUMERS"] = cfg.consumers
    sig.update({name: "constexpr" for name in consts})
    source = GluonASTSource(fn=fn, signature=sig, constexprs=consts)
    return triton.compile(source, target=TARGET, options={"num_warps": warps})


def compile_row(cfg: GluonConfig, dtype: str, head_dim: int, causal: bool,
                ptx_dir: str | None = None) -> dict:  # fmt: skip
    """One launch's row: shared memory, registers, spills, the split's instruction counts."""
    row: dict[str, object] = dict(config=cfg.label(), dtype=dtype, head_dim=head_dim,
                                  causal=causal)  # fmt: skip
    start = time.time()
    try:
        kernel = compile_cfg(cfg, dtype, head_dim, causal)
        ptx = kernel.asm["ptx"]
        info = ptxas_info(ptx)
        row.update(shared=kernel.metadata.shared, **info)
        row.update(ex2=len(re.findall(r"ex2\.approx", ptx)), shl23=ptx.count(", 23;"))
        spills_ok = info["spill_stores"] == 0 or cfg.label().startswith(SPILL_OK)
        row["ok"] = kernel.metadata.shared <= SMEM_LIMIT and spills_ok
        if not row["ok"]:
            row["error"] = f"shared {kernel.metadata.shared} / spills {info['spill_stores']}"
        if ptx_dir:
            name = f"{cfg.label()}-{dtype}-d{head_dim}-c{int(causal)}.ptx"
            Path(ptx_dir, name).write_text(ptx)
    except Exception as e:  # report every failure, then go on
        row.update(ok=False, error=f"{type(e).__name__}: {str(e).strip().splitlines()[-1][:300]}")
    row["seconds"] = round(time.time() - start, 1)
    return row


def main() -> int:
    from gluon_d64 import candidates

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--ptx", help="keep each launch's PTX in this folder")
    ap.add_argument("--dtypes", default="bf16,fp16")
    args = ap.parse_args()
    reason = version_reason(triton.__version__)
    if reason:
        print(f"{reason}: run with PYTHONPATH=/tmp/tri36 (triton 3.6.0 installed aside)")
        return 2
    if args.ptx:
        Path(args.ptx).mkdir(parents=True, exist_ok=True)
    rows, failed = [], 0
    for (head_dim, causal), cfgs in candidates().items():
        for dtype in args.dtypes.split(","):
            for cfg in dict.fromkeys(cfgs.values()):
                row = compile_row(cfg, dtype, head_dim, causal, args.ptx)
                failed += not row["ok"]
                rows.append(row)
                detail = (f"smem {row['shared']} regs {row['registers']} spills "
                          f"{row['spill_stores']}/{row['spill_loads']} ex2 {row['ex2']} "
                          f"shl23 {row['shl23']}" if "shared" in row else row["error"])  # fmt: skip
                print(f"{'ok  ' if row['ok'] else 'FAIL'} {cfg.label():34s} {dtype} d{head_dim} "
                      f"causal={int(causal)}: {detail}", flush=True)  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    print(f"{len(rows)} launches, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
