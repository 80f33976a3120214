"""Registers and spills of the three-consumer 64-key variant launch (issue 19, session 8:
flash_gluon_varhost.C3_N64) for every VAR combination it could serve, compiled for sm_90
on a CPU (no GPU needed up to the cubin), with the H200's triton installed aside:

    PYTHONPATH=/tmp/tri36 python tools/gpu/variants_gluon_s8_sass.py [--json OUT] [--served]
        [--qscale-fp16]

One line per (kind, dtype, causal): the VAR bits flash_gluon_varhost.variant_bits gives
that call, shared memory, registers and ptxas's spill bytes. Every kind (window, softcap,
ALiBi, packed and their combinations), bf16 and fp16, causal both, head_dim 128 (GQA
changes no code: the KV head is an index); `--served`: only the (kind, dtype) pairs
C3_KINDS lists, causal (what the dispatch hands the launch); `--qscale-fp16`: with
flash_gluon_varhost.SOFTCAP_QSCALE_FP16 on (the VAR bits at head_dim 128's scale).
Exits 1 if a served combination spills or fails to compile. A developer tool, not
installed.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)  # compile, never interpret (before triton's import)

import torch

from fa_bench.kernels import flash_gluon_varhost as vh
from fa_bench.kernels.flash_validate import Variant, Varlen

FEATURES = ("window", "softcap", "alibi", "varlen")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
HEAD_DIM = 128


def kinds() -> list[str]:
    """Every non-empty combination of FEATURES, as flash_gluon_varhost.variant_kind names it."""
    out = []
    for n in range(1, len(FEATURES) + 1):
        out += ["+".join(c) for c in itertools.combinations(FEATURES, n)]
    return out


def variant_of(kind: str, causal: bool) -> Variant:
    """A Variant of this kind (softcap 50, a 4k left window; non-causal: (100, 50))."""
    parts = set(kind.split("+"))
    cu = torch.tensor([0, 5, 12], dtype=torch.int32)
    return Variant(
        window=((4096, 0) if causal else (100, 50)) if "window" in parts else None,
        softcap=50.0 if "softcap" in parts else 0.0,
        slopes=torch.ones((1, 4)) if "alibi" in parts else None,
        varlen=Varlen(cu, cu, 7, 7) if "varlen" in parts else None,
        tanh=1,
    )


def combos(served: bool) -> list[tuple[str, str, bool, int]]:
    """(kind, dtype name, causal, VAR bits) to compile."""
    out = []
    for kind, dname, causal in itertools.product(kinds(), DTYPES, (True, False)):
        variant = variant_of(kind, causal)
        assert vh.variant_kind(variant) == kind, kind
        if served and not vh.three_consumers(variant, DTYPES[dname], HEAD_DIM, causal):
            continue
        bits = vh.variant_bits(variant, vh.C3_N64.softmax_code(), causal, DTYPES[dname],
                               HEAD_DIM**-0.5)  # fmt: skip
        out.append((kind, dname, causal, bits))
    return out


def row(kind: str, dname: str, causal: bool, bits: int) -> dict:
    """One combination compiled: shared memory, registers, spills, or the error."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import gluon_compile as gc

    r: dict = dict(kind=kind, dtype=dname, causal=causal, var=bits,
                   served=vh.three_consumers(variant_of(kind, causal), DTYPES[dname],
                                             HEAD_DIM, causal))  # fmt: skip
    try:
        k = gc.compile_variant(vh.C3_N64, dname, HEAD_DIM, causal, bits)
        r.update(shared=k.metadata.shared, **gc.ptxas_info(k.asm["ptx"]))
        r["ok"] = r["spill_stores"] == 0 and r["spill_loads"] == 0
    except Exception as e:  # every failure is a row
        r.update(ok=False, error=f"{type(e).__name__}: {str(e).strip().splitlines()[-1][:300]}")
    return r


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--served", action="store_true", help="only what C3_KINDS serves")
    ap.add_argument(
        "--qscale-fp16", action="store_true", help="with SOFTCAP_QSCALE_FP16 on (fp16 softcap)"
    )
    args = ap.parse_args()
    vh.SOFTCAP_QSCALE_FP16 = vh.SOFTCAP_QSCALE_FP16 or args.qscale_fp16
    import triton

    print(f"triton {triton.__version__}, launch {vh.C3_N64.label()}", flush=True)
    rows, bad = [], 0
    for combo in combos(args.served):
        r = row(*combo)
        rows.append(r)
        bad += r["served"] and not r["ok"]
        detail = (
            f"smem {r['shared']} regs {r['registers']} "
            f"spills {r['spill_stores']}/{r['spill_loads']}"
            if "shared" in r
            else r["error"]
        )
        print(f"{'ok  ' if r['ok'] else 'FAIL'} {'served' if r['served'] else '      '} "
              f"{r['kind']:28s} {r['dtype']} causal={int(r['causal'])} var={r['var']}: {detail}",
              flush=True)  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    print(f"{len(rows)} combinations, {bad} served ones spill or fail")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
