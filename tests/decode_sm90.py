"""The decode kernels' sm_90 compile signature, shared by the compile tests of
tests/test_decode_kernel.py and tests/test_decode_pdl.py. Those compile in a fresh process
(this one's kernels are defined interpreted) whose PYTHONPATH holds tests/, so their
scripts import it as `from decode_sm90 import signature`."""

from __future__ import annotations

from typing import Any

_I32 = ("heads_kv", "row_blocks", "heads_q", "seq_q", "num_splits")
_I32_POINTERS = ("SeqLens", "BlockTable", "Counters")
_FP32_POINTERS = ("Lse", "OPart", "LsePart")


def signature(fn: Any, consts: dict, dtype: str) -> dict[str, str]:
    """triton.compile's signature of a decode kernel: constexprs, i32 sizes and strides,
    the fp32 scale, int32 and fp32 pointers by name, the rest pointers to `dtype`.

    A constexpr parameter with a default that `consts` leaves out is added to `consts`
    with its default (so a launch option added later, e.g. MERGE_TILE, compiles as a
    launch that does not set it; else it would be typed a pointer)."""
    for param in fn.params:
        if param.is_constexpr and param.has_default and param.name not in consts:
            consts[param.name] = param.default
    out = {}
    for name in fn.arg_names:
        if name in consts:
            out[name] = "constexpr"
        elif name.startswith("stride_") or name in _I32:
            out[name] = "i32"
        elif name == "qk_scale":
            out[name] = "fp32"
        elif name in _I32_POINTERS:
            out[name] = "*i32"
        elif name in _FP32_POINTERS:
            out[name] = "*fp32"
        else:
            out[name] = "*" + dtype
    return out


def subprocess_env() -> dict[str, str]:
    """The environment of a compile subprocess: no interpreter, tests/ on the path."""
    import os
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    here = str(Path(__file__).resolve().parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH")) if p)
    return env
