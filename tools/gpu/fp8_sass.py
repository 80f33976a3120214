"""Where a Gluon fp8 launch's key step spends its instructions: compile a role for sm_90
(tools/gpu/fp8_gluon_compile.py, triton 3.6.0 installed aside), disassemble the cubin
with the cuobjdump triton ships, find the key loops (a backward branch over a body that
issues wgmma and MUFU.EX2) and count each loop's instructions by class (the opcode before
the first dot). A developer tool, CPU only:

    PYTHONPATH=/tmp/tri36 python tools/gpu/fp8_sass.py ws 128 0   # role, head_dim, causal
    PYTHONPATH=/tmp/tri36 python tools/gpu/fp8_sass.py --json ws 128 0   # spills, per loop

docs/kernel.md (the Gluon fp8 forward, session 7) reads the "ws" step this way.
"""

from __future__ import annotations

import collections
import json
import os
import re
import subprocess
import sys
import tempfile

_INSTR = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")


def parse(sass: str) -> list[tuple[int, str, bool]]:
    """(address, instruction text without its predicate, predicated) per SASS line."""
    out = []
    for m in _INSTR.finditer(sass):
        text = m.group(2).strip()
        bare = re.sub(r"^@!?U?P[0-9T]\s+", "", text)
        out.append((int(m.group(1), 16), bare, bare != text))
    return out


def key_loops(instrs: list[tuple[int, str, bool]]) -> list[dict]:
    """Each conditional backward branch (a loop's latch: the mbarrier waits' out-of-line
    retries jump back unconditionally) whose body holds a QGMMA and a MUFU.EX2 and no
    other such loop (the innermost key loops): its address range and instruction
    classes."""
    index = {addr: i for i, (addr, _, _) in enumerate(instrs)}
    loops = []
    for k, (addr, text, predicated) in enumerate(instrs):
        m = re.search(r"\bBRA (0x[0-9a-f]+)", text)
        target = int(m.group(1), 16) if m and predicated else None
        if target is None or target >= addr or target not in index:
            continue
        body = instrs[index[target] : k + 1]
        ops = collections.Counter(t.split()[0].split(".")[0] for _, t, _ in body)
        if ops["QGMMA"] and ops["MUFU"]:
            loops.append(dict(start=target, end=addr, count=len(body), ops=dict(ops)))
    # innermost: drop a loop that contains another found loop
    return [a for a in loops
            if not any(b is not a and a["start"] <= b["start"] and b["end"] <= a["end"]
                       for b in loops)]  # fmt: skip


def spill_report(role: str, head_dim: int, causal: bool) -> dict:
    """A launch's spill bytes (ptxas) and its key loops' local-memory instructions (LDL,
    STL: spills inside the loop), from one compile."""
    loops, info = _compiled_loops(role, head_dim, causal)
    in_loops = [dict(start=lp["start"], count=lp["count"], ldl=lp["ops"].get("LDL", 0),
                     stl=lp["ops"].get("STL", 0)) for lp in loops]  # fmt: skip
    return dict(role=role, head_dim=head_dim, causal=causal, loops=in_loops, **info)


def _compiled_loops(role: str, head_dim: int, causal: bool) -> tuple[list[dict], dict]:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import triton
    from fp8_gluon_compile import compile_one
    from gluon_compile import ptxas_info  # tools/gluon_compile.py

    from fa_bench.kernels.flash_gluon_fp8 import candidate_configs

    kernel = compile_one(candidate_configs(head_dim)[role], head_dim, causal)
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin",
                        "cuobjdump")  # fmt: skip
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        sass = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True,
                              check=True).stdout  # fmt: skip
    return key_loops(parse(sass)), ptxas_info(kernel.asm["ptx"])


def main(argv: list[str]) -> int:
    as_json = argv[:1] == ["--json"]
    argv = argv[1:] if as_json else argv
    if len(argv) != 3:
        usage = [line.strip() for line in __doc__.splitlines() if "fp8_sass.py" in line]
        print("\n".join(usage), file=sys.stderr)
        return 2
    # compile, never interpret (before triton's import; not at this module's import nor
    # before the usage: the CPU tests load it beside interpreter tests)
    os.environ.pop("TRITON_INTERPRET", None)
    role, head_dim, causal = argv[0], int(argv[1]), argv[2] == "1"
    if as_json:  # the spills (tests/test_fp8_compile_strict.py)
        print(json.dumps(spill_report(role, head_dim, causal)))
        return 0
    loops, _info = _compiled_loops(role, head_dim, causal)
    for loop in loops:
        top = sorted(loop["ops"].items(), key=lambda kv: -kv[1])
        print(f"{loop['start']:#x}-{loop['end']:#x}: {loop['count']} instructions: "
              + ", ".join(f"{n} {op}" for op, n in top))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
