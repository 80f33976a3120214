"""tools/gpu/fp8_sass.py: the key loops of a Gluon fp8 launch's SASS counted by
instruction class (docs/kernel.md's reading of the step): the parser keeps each
instruction's address and predicate, a loop is a conditional backward branch over a body
with wgmma and MUFU, the out-of-line mbarrier retries (unconditional branches back) and
enclosing loops are not counted."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _tool():
    path = ROOT / "tools" / "gpu" / "fp8_sass.py"
    spec = importlib.util.spec_from_file_location("fp8_sass", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _line(addr: int, text: str) -> str:
    return f"        /*{addr:04x}*/                   {text} ;   /* 0x000000000000 */"


SASS = "\n".join(
    _line(a, t)
    for a, t in [
        (0x00, "MOV R1, c[0x0][0x28]"),
        (0x10, "SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR5+0x10], R3"),  # outer loop head
        (0x20, "QGMMA.64x128x32.F32.E4M3.E4M3 R24, gdesc[UR16], RZ, !UPT"),  # inner head
        (0x30, "FMNMX R5, R24, R25, !PT"),
        (0x40, "MUFU.EX2 R6, R6"),
        (0x50, "MUFU.EX2 R7, R7"),
        (0x60, "STS.U16 [R2], R6"),
        (0x70, "@P0 BRA 0x20"),  # the inner loop's latch
        (0x80, "@!P1 BRA 0x10"),  # the outer loop's latch
        (0x90, "EXIT"),
        (0xA0, "SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR5+0x10], R3"),  # a wait's retry
        (0xB0, "BRA 0x20"),
    ]
)


def test_parse_keeps_addresses_and_predicates():
    instrs = _tool().parse(SASS)
    assert len(instrs) == 12
    assert instrs[7] == (0x70, "BRA 0x20", True)
    assert instrs[11] == (0xB0, "BRA 0x20", False)


def test_only_the_innermost_conditional_loop_is_counted():
    (loop,) = _tool().key_loops(_tool().parse(SASS))
    assert (loop["start"], loop["end"], loop["count"]) == (0x20, 0x70, 6)
    assert loop["ops"] == {"QGMMA": 1, "FMNMX": 1, "MUFU": 2, "STS": 1, "BRA": 1}


def test_usage_without_arguments(capsys):
    assert _tool().main([]) == 2
    assert "fp8_sass.py ws 128 0" in capsys.readouterr().err
