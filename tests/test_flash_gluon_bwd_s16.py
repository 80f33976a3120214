"""Session 16's CPU check of the Gluon backward's machine code: tools/gpu/gluon_bwd_sass.py
compiles roles for sm_90a against triton 3.6.0 installed aside and says how far two
builds agree. Session 16 relied on it (no GPU at first) to say that folding kb_major and
the head groups' grid shape left the default launch's loops alone; its verdicts are
checked here on small SASS texts."""

from __future__ import annotations

import pytest
from gluon_bwd_helpers import tool


def test_the_sass_comparison_names_how_far_two_kernels_agree():
    pytest.importorskip("triton.experimental.gluon._runtime")
    compare = tool("gluon_bwd_sass").compare
    a = "--:-:-:-:1\tIMAD R2, R3, R4;\n--:-:-:-:2\t@P0 BRA L1;\n--:-:-:-:1\tFADD R5, R2, R2;"
    assert compare(a, a) == ("same", [])
    renamed = a.replace("R2", "R9").replace("P0", "P3")
    assert compare(a, renamed) == ("registers", [])
    lines = a.splitlines()
    moved = "\n".join([lines[0], lines[2], lines[1]])
    verdict, where = compare(a, moved)
    assert verdict == "schedule" and where
    assert compare(a, a.replace("FADD", "FMUL"))[0] == "differs"
