"""Whether a change leaves the Gluon backward's machine code alone, checked on a CPU.

Compiles roles of the Gluon backward for sm_90a with the H200's triton (installed aside)
and writes each kernel's SASS, the kernel's name blanked; with --against, compares every
file with the same-named one there and says how far they agree:

- `same`: byte for byte;
- `registers`: the same up to register and predicate names;
- `schedule`: the same instructions (a multiset), some in another order; the line
  ranges that moved are printed (a prologue's differ; a loop's should not);
- `differs`: other instructions (exit 1, as for a file missing there).

    git stash; PYTHONPATH=/tmp/tri36 python tools/gpu/gluon_bwd_sass.py --out /tmp/a
    git stash pop; PYTHONPATH=/tmp/tri36 python tools/gpu/gluon_bwd_sass.py --out /tmp/b \\
        --against /tmp/a

Session 16 checked the kb_major fold and the head groups' grid shape so, without a GPU.
Not installed.
"""

from __future__ import annotations

import argparse
import difflib
import itertools
import re
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gluon_bwd_compile as gbc

from fa_bench.kernels.flash_gluon_bwd import candidate_bwd_configs

_NAMES = re.compile(r"\bU?R\d+\b|\bU?P\d\b")


def _registers_blank(line: str) -> str:
    return _NAMES.sub("R", line).replace(".reuse", "")


def _instruction(line: str) -> str:
    """The instruction without its control bits (the part before the tab)."""
    return _registers_blank(line.split("\t", 1)[-1])


def compare(a: str, b: str) -> tuple[str, list[str]]:
    """How far SASS texts a and b agree, and (schedule, differs) the ranges of b that moved."""
    if a == b:
        return "same", []
    la, lb = a.splitlines(), b.splitlines()
    if [_registers_blank(x) for x in la] == [_registers_blank(x) for x in lb]:
        return "registers", []
    ia, ib = [_instruction(x) for x in la], [_instruction(x) for x in lb]
    moved = [f"{j1 + 1}-{j2}" for tag, _, _, j1, j2 in
             difflib.SequenceMatcher(None, ia, ib, autojunk=False).get_opcodes()
             if tag != "equal" and j2 > j1]  # fmt: skip
    return ("schedule" if Counter(ia) == Counter(ib) else "differs"), moved


VERDICTS = ("same", "registers", "schedule", "differs")


def report(name: str, old: Path, sass: str) -> int:
    """Print how `sass` agrees with the file `old`; the verdict's rank (3: differs or
    no such file)."""
    if not old.exists():
        print(f"{name}: nothing to compare in {old.parent}")
        return 3
    verdict, moved = compare(old.read_text(), sass)
    where = ", ".join(moved[:8]) + (f" and {len(moved) - 8} more" if moved[8:] else "")
    print(f"{name}: {verdict}" + (f" (lines {where})" if moved else ""))
    return VERDICTS.index(verdict)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="write each kernel's SASS here")
    ap.add_argument("--roles", default="ws", help="comma list of candidate_bwd_configs roles")
    ap.add_argument("--against", help="compare with the SASS files in this folder")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    worst = 0
    for dtype, head_dim, causal in itertools.product(("bf16", "fp16"), (64, 128), (False, True)):
        roles = candidate_bwd_configs(head_dim)
        for role in args.roles.split(","):
            if role not in roles:
                print(f"skip {role} d{head_dim}: not a role there")
                continue
            kernel = gbc.compile_one(roles[role], dtype, head_dim, causal)
            sass = re.sub(r"_bwd_ws\w*", "KERNEL", kernel.asm["sass"])
            name = f"{role}-{dtype}-d{head_dim}-{'causal' if causal else 'full'}.sass"
            (out / name).write_text(sass)
            if args.against:
                worst = max(worst, report(name, Path(args.against) / name, sass))
            else:
                print(name)
    return 1 if worst == 3 else 0


if __name__ == "__main__":
    sys.exit(main())
