"""Registers, spills and the key-block loop of the fp16 softcap's threshold rescale (issue
19, session 9: the LAZY bit, flash_gluon_varhost.SOFTCAP_LAZY_FP16) beside the running-max
softcap it replaces, compiled for sm_90 on a CPU with the H200's triton installed aside:

    PYTHONPATH=/tmp/tri36 python tools/gpu/variants_gluon_s9_sass.py [--json OUT] [--quick]
        [--served]

One line per (launch, dtype, head_dim, causal, VAR): the two-consumer launch the variants
take at that head_dim (c2) and the three-consumer 64-key one (c3, flash_gluon_varhost.C3_N64,
head_dim 128: where the dispatch serves it), fp16 and bf16, causal both; VAR = softcap
alone (fp16's launch today), with LAZY, and with LAZY_WARP too (bf16 takes the fixed
offset by default: its LAZY rows only show the bits compile there too). For the key-block
loop (tools/gpu/variants_gluon_sass.softmax_loop): its instructions, its FMULs, barriers,
and the instructions a step skips when no row moved (the uniform `if`'s forward branch
over O's rescale; LAZY_WARP: the FMULs behind the PTX branches). `--quick`: d128 causal
only; `--served`: every fp16 softcap kind the switch serves (windows, ALiBi, packed; d64
and d128, causal both) on the launch the dispatch picks, the bits as variant_bits gives
them with the switches off and on. Exits 1 if a LAZY row fails to compile or spills more
than the same launch without LAZY. A developer tool, not installed.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import re
import sys
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)  # compile, never interpret (before triton's import)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from fa_bench.kernels import flash_gluon_varhost as vh
from fa_bench.kernels.flash_gluon import GluonConfig, gluon_config

SOFTCAP = vh._SOFTCAP
LAZY = vh._LAZY
WARP = vh._LAZY_WARP
VARS = (SOFTCAP, SOFTCAP | LAZY, SOFTCAP | LAZY | WARP)


@dataclasses.dataclass(frozen=True)
class Combo:
    launch: str  # c2 / c3
    dtype: str
    head_dim: int
    causal: bool
    var: int
    kind: str = "softcap"


def config(launch: str, head_dim: int, causal: bool) -> GluonConfig:
    """The launch's GluonConfig: c3 is C3_N64, c2 the variants' two-consumer launch."""
    if launch == "c3":
        return vh.C3_N64
    return vh.variant_config(gluon_config(head_dim, causal), head_dim)


def combos(quick: bool) -> list[Combo]:
    """What to compile: c2 at d64 and d128, c3 at d128, both dtypes, causal both; softcap
    without LAZY, with it, and with LAZY_WARP too (quick: d128 causal only)."""
    out = []
    head_dims, causals = ((128,), (True,)) if quick else ((64, 128), (True, False))
    for launch, dtype, hd, causal in itertools.product(("c2", "c3"), ("fp16", "bf16"),
                                                        head_dims, causals):  # fmt: skip
        if launch == "c3" and hd not in vh.C3_HEAD_DIMS:
            continue
        out += [Combo(launch, dtype, hd, causal, var) for var in VARS]
    return out


def served() -> list[Combo]:
    """Every fp16 softcap kind (variants_gluon_s8_sass.kinds) the switch serves
    (flash_gluon_varhost.lazy_max), d64 and d128, causal both, on the launch the dispatch
    picks (C3_N64 where C3_KINDS lists the kind): the VAR bits variant_bits gives with the
    switches off, with SOFTCAP_LAZY_FP16, and with SOFTCAP_LAZY_WARP too."""
    import torch
    import variants_gluon_s8_sass as s8s

    out = []
    saved = vh.SOFTCAP_LAZY_FP16, vh.SOFTCAP_LAZY_WARP
    try:
        for kind, hd, causal in itertools.product(s8s.kinds(), (64, 128), (True, False)):
            v = s8s.variant_of(kind, causal)
            if not vh.lazy_max(v, torch.float16, True):
                continue
            c3 = vh.three_consumers(v, torch.float16, hd, causal)
            cfg = config("c3" if c3 else "c2", hd, causal)
            for on, warp in ((False, False), (True, False), (True, True)):
                vh.SOFTCAP_LAZY_FP16, vh.SOFTCAP_LAZY_WARP = on, warp
                bits = vh.variant_bits(v, cfg.softmax_code(), causal, torch.float16, hd**-0.5)
                out.append(Combo("c3" if c3 else "c2", "fp16", hd, causal, bits, kind))
    finally:
        vh.SOFTCAP_LAZY_FP16, vh.SOFTCAP_LAZY_WARP = saved
    return out


def forward_span(body: list[tuple[int, str]]) -> int:
    """Instructions the rescale's branch skips: the longest conditional forward branch
    inside the loop body over code with an exp2 (alpha) but no tanh and no wgmma (the
    masked path's branches hold the tanh)."""
    best = 0
    for here, text in body:
        m = re.search(r"\bBRA\s+(?:`\()?0x([0-9a-f]+)", text)
        if m and "@" in text.split("BRA")[0]:
            target = int(m.group(1), 16)
            span = [t for a, t in body if here < a < target]
            ops = " ".join(span)
            if "MUFU.EX2" in ops and "TANH" not in ops and "HGMMA" not in ops:
                best = max(best, len(span))
    return best


def fmul_spans(body: list[tuple[int, str]]) -> int:
    """Instructions skipped by the conditional forward branches over FMULs only (LAZY_WARP's
    PTX branches, one per 16 values of O)."""
    total = 0
    for here, text in body:
        m = re.search(r"\bBRA\s+(?:`\()?0x([0-9a-f]+)", text)
        if m and "@" in text.split("BRA")[0]:
            span = [t for a, t in body if here < a < int(m.group(1), 16)]
            if span and all(t.split()[0].startswith("FMUL") for t in span):
                total += len(span)
    return total


def row(c: Combo) -> dict:
    """One combination compiled: registers, spills, the loop's counts (or the error)."""
    import gluon_compile as gc
    import variants_gluon_sass as vs

    cfg = config(c.launch, c.head_dim, c.causal)
    r: dict = dict(dataclasses.asdict(c), config=cfg.label())
    try:
        k = gc.compile_variant(cfg, c.dtype, c.head_dim, c.causal, c.var)
        r.update(shared=k.metadata.shared, **gc.ptxas_info(k.asm["ptx"]))
        lines = vs.sass(k.asm["cubin"])
        scores = 64 * cfg.block_n // 128
        ops = vs.softmax_loop(lines, scores)
        # the same loop as (address, text): the smallest backward branch's span of len(ops)
        body = _loop_lines(lines, len(ops))
        r.update(loop=len(ops), fmul=ops.count("FMUL"), bar=ops.count("BAR"),
                 skipped=(fmul_spans(body) if c.var & WARP else forward_span(body))
                 if c.var & LAZY else 0)  # fmt: skip
        r["ok"] = True
    except Exception as e:  # every failure is a row
        r.update(ok=False, error=f"{type(e).__name__}: {str(e).strip().splitlines()[-1][:300]}")
    return r


def _loop_lines(lines: list[tuple[int, str]], n: int) -> list[tuple[int, str]]:
    """The (address, text) lines of the backward branch's body that has n instructions
    and holds the wgmma (softmax_loop's choice)."""
    for here, text in lines:
        m = re.search(r"\bBRA\s+(?:`\()?0x([0-9a-f]+)", text)
        if not m or int(m.group(1), 16) >= here:
            continue
        body = [(a, t) for a, t in lines if int(m.group(1), 16) <= a <= here]
        if len(body) == n and any("HGMMA" in t for _, t in body):
            return body
    return []


def regressions(rows: list[dict]) -> list[str]:
    """LAZY rows that failed, or spill more than the same launch's row without LAZY."""

    def key(r: dict) -> tuple:
        return r["launch"], r["dtype"], r["head_dim"], r["causal"], r.get("kind", "softcap")

    plain = {key(r): r for r in rows if not r["var"] & LAZY}
    bad = []
    for r in rows:
        if not r["var"] & LAZY:
            continue
        base = plain.get(key(r))
        if not r["ok"]:
            bad.append(f"{r['config']} {r['dtype']} d{r['head_dim']}: {r['error']}")
        elif base and base["ok"] and r["spill_stores"] > base["spill_stores"]:
            bad.append(f"{r['config']} {r.get('kind')} {r['dtype']} d{r['head_dim']} "
                       f"causal={r['causal']} spills")  # fmt: skip
    return bad


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--quick", action="store_true", help="d128 causal only")
    ap.add_argument("--served", action="store_true", help="every fp16 softcap kind served")
    args = ap.parse_args()
    import triton

    print(f"triton {triton.__version__}, sm_90; loop = the consumers' key-block loop")
    print("| launch | kind | dtype | d | causal | VAR | regs | spills | smem | loop | FMUL | "
          "BAR | skipped |")  # fmt: skip
    print("|---" * 13 + "|")
    rows = []
    for c in served() if args.served else combos(args.quick):
        r = row(c)
        rows.append(r)
        if not r["ok"]:
            print(f"| {r['config']} | {c.kind} | {c.dtype} | {c.head_dim} | {int(c.causal)} | "
                  f"{c.var} | FAIL: {r['error']} |", flush=True)  # fmt: skip
            continue
        print(f"| {r['config']} | {c.kind} | {c.dtype} | {c.head_dim} | {int(c.causal)} | "
              f"{c.var} | {r['registers']} | {r['spill_stores']}/{r['spill_loads']} | "
              f"{r['shared']} | {r['loop']} | {r['fmul']} | {r['bar']} | {r['skipped']} |",
              flush=True)  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    bad = regressions(rows)
    print(f"{len(rows)} combinations; {len(bad)} LAZY regressions" + "".join(
        f"\n  {b}" for b in bad))  # fmt: skip
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
