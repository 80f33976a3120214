"""The softcap's per-score instruction budget in the Gluon variant kernel's SASS (issue 19,
session 7), compiled for sm_90 on a CPU: no GPU needed up to the cubin.

For each launch (the dense causal kernel, the softcap default and the session 7
candidates; bf16, head_dim 128, causal) it disassembles the cubin (triton's cuobjdump),
takes the consumers' key-block loop (the backward branch whose body holds the wgmma and
the MUFU ops) and counts its instructions by class, per score: a consumer thread holds
64 · block_n / 128 scores of a block. The loop's masked path (the diagonal blocks'
FSEL/ISETP/LOP3) is in the body but runs on few blocks, so it is counted apart.

    PYTHONPATH=/tmp/tri36 python tools/gpu/variants_gluon_sass.py [--json OUT] [NAME ...]

A developer tool, not installed.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import re
import subprocess
import sys
import tempfile

os.environ.pop("TRITON_INTERPRET", None)  # compile, never interpret (before triton's import)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import triton
from gluon_compile import compile_one, compile_variant, ptxas_info

from fa_bench.kernels.flash_gluon import GluonConfig, gluon_config
from fa_bench.kernels.flash_gluon_varhost import variant_config

# VAR bits: SOFTCAP 2, QSCALE 32, FIXED_MAX 8192, SUM_BF16 16384, P_ALU 32768
# (flash_gluon_var*.py)
DEFAULT = 2 | 32 | 8192
SUM_BF16 = 16384
P_ALU = 32768
# name -> (VAR bits, 0 = the dense kernel; GluonConfig fields over the variant launch)
LAUNCHES: dict[str, tuple[int, dict]] = {
    "dense": (0, {}),
    "softcap": (DEFAULT, {}),
    "softcap sum-bf16": (DEFAULT | SUM_BF16, {}),
    "softcap sum-bf16 palu": (DEFAULT | SUM_BF16 | P_ALU, {}),
    "softcap nopp": (DEFAULT, dict(pingpong=False)),
    "softcap s2": (DEFAULT, dict(stages=2)),
    "softcap n64 s4": (DEFAULT, dict(block_n=64, stages=4)),
    "softcap sum-bf16 nopp": (DEFAULT | SUM_BF16, dict(pingpong=False)),
    "softcap plain": (2, {}),
    "softcap c3 n64 s4": (
        DEFAULT,
        dict(consumers=3, block_n=64, stages=4, pingpong=False, consumer_regs=160),
    ),
}
# the mask's instructions (diagonal / window-edge blocks only)
MASK = ("FSEL", "ISETP", "LOP3")
CLASSES = {
    "MUFU": ("MUFU",),
    "FP32 (FFMA/FMUL/FADD)": ("FFMA", "FMUL", "FADD"),
    "FMNMX": ("FMNMX",),
    "F2FP": ("F2FP",),
    "HADD2/HFMA2": ("HADD2", "HFMA2"),
    "moves (IMAD/MOV/PRMT)": ("IMAD", "MOV", "PRMT"),
    "SHFL": ("SHFL",),
    "HGMMA": ("HGMMA",),
    "sync (BAR/SYNCS/WARPGROUP/BRA)": ("BAR", "SYNCS", "WARPGROUP", "BRA"),
    "uniform (U*)": (),
}
_LINE = re.compile(r"^\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")


def sass(cubin: bytes) -> list[tuple[int, str]]:
    """(address, instruction text) of every SASS instruction."""
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True, check=True)
    return [
        (int(m.group(1), 16), m.group(2)) for m in map(_LINE.match, out.stdout.splitlines()) if m
    ]


def opcode(text: str) -> str:
    """The instruction's opcode without predicate and modifiers ("@!P1 FADD.FTZ" → FADD)."""
    return re.sub(r"^@!?U?P\w+\s+", "", text).split()[0].split(".")[0]


def softmax_loop(lines: list[tuple[int, str]], scores: int) -> list[str]:
    """The opcodes of the smallest backward branch's body that holds wgmma and at least
    one MUFU op per score (a consumer's key-block loop; the mbarrier retry stubs past
    the kernel's end branch back into it too, over spans holding fewer)."""
    best: list[str] = []
    for here, text in lines:
        m = re.search(r"\bBRA\s+(?:`\()?0x([0-9a-f]+)", text)
        if not m or int(m.group(1), 16) >= here:
            continue
        body = [opcode(t) for a, t in lines if int(m.group(1), 16) <= a <= here]
        if "HGMMA" in body and body.count("MUFU") >= scores:
            if not best or len(body) < len(best):
                best = body
    return best


def classify(body: list[str], scores: int) -> dict[str, float]:
    """Instructions per score by class; the mask's apart; `unmasked` their total."""
    count = collections.Counter(body)
    out: dict[str, float] = {}
    seen = set()
    for name, ops in CLASSES.items():
        if not ops:
            n = sum(c for op, c in count.items() if op.startswith("U") and op not in seen)
            seen |= {op for op in count if op.startswith("U")}
        else:
            n = sum(count[op] for op in ops)
            seen |= set(ops)
        out[name] = n / scores
    mask = sum(count[op] for op in MASK)
    seen |= set(MASK)
    out["other"] = sum(c for op, c in count.items() if op not in seen) / scores
    out["mask (masked blocks only)"] = mask / scores
    out["unmasked total"] = (len(body) - mask) / scores
    return out


def launch(name: str) -> tuple[GluonConfig, int]:
    var, fields = LAUNCHES[name]
    cfg = variant_config(gluon_config(128, True), 128)
    return dataclasses.replace(cfg, **fields), var


def row(name: str) -> dict:
    cfg, var = launch(name)
    kernel = (
        compile_variant(cfg, "bf16", 128, True, var) if var else compile_one(cfg, "bf16", 128, True)
    )
    scores = 64 * cfg.block_n // 128  # a consumer thread's scores per key block
    body = softmax_loop(sass(kernel.asm["cubin"]), scores)
    info = ptxas_info(kernel.asm["ptx"])
    return dict(name=name, config=cfg.label(), var=var, loop=len(body), scores=scores,
                spills=info["spill_stores"], per_score=classify(body, scores))  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help=f"launches (default all): {', '.join(LAUNCHES)}")
    ap.add_argument("--json")
    args = ap.parse_args()
    rows = [row(n) for n in args.names or LAUNCHES]
    print(f"triton {triton.__version__}, sm_90, bf16 d128 causal; instructions per score of "
          "a consumer's key-block loop")  # fmt: skip
    cols = list(rows[0]["per_score"])
    print("| launch | config | loop | " + " | ".join(cols) + " | spills |")
    print("|---" * (len(cols) + 4) + "|")
    for r in rows:
        vals = " | ".join(f"{r['per_score'][c]:.2f}" for c in cols)
        print(f"| {r['name']} | {r['config']} | {r['loop']} | {vals} | {r['spills']} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
