"""GPU tests (`-m gpu`, sm_90) of the three-consumer 64-key variant launch (issue 19,
session 8: flash_gluon_varhost.C3_N64, 192 query rows per CTA): every causal head_dim 128
check of tools/gpu/variants_gluon_checks.py (window, softcap, ALiBi, packed, their
combinations, bf16 and fp16, GQA, Sq ≠ Sk, empty rows, keys outside the window NaN, the
`tl` backward on its output) and checks aimed at 192-row tiles (odd lengths, a last tile
of one row, packed documents around 192, a window edge inside a tile), with every kind
taking the launch (C3_KINDS monkeypatched), against the float64 reference under the
accuracy rule; each asserts the launch ran. Then the committed table: every check of a
(kind, dtype) it lists, as `flash_attention` runs it by default.

Test ids carry the kind ("softcap", "window+softcap", ...) and dtype, so a GPU script
selects with -k.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from gluon_bwd_helpers import tool as _tool

from fa_bench.kernels import flash_gluon_varhost as vh

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
        reason="needs an sm_90 GPU",
    ),
]


def _kind(kw: dict, packed: bool) -> str:
    parts = (("window", "window" in kw), ("softcap", bool(kw.get("softcap"))),
             ("alibi", bool(kw.get("alibi"))), ("varlen", packed))  # fmt: skip
    return "+".join(name for name, on in parts if on)


def _checks() -> list[tuple[str, str, str, object, tuple, dict]]:
    """(id, kind, dtype name, check function, args, kwargs): the checks tool's causal d128
    cases and the 192-row ones."""
    try:
        tool = _tool("variants_gluon_checks")
    except Exception:  # CPU-only machines still collect the names
        return []
    dc, vc = tool._dense_check, tool._varlen_check
    cases = [c for c in tool._cases() if c[3].get("causal") and c[2][1] == 128]
    for dname, dt in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
        p = f"{dname} d128"
        docs = [1, 193, 191, 384, 1000, 65, 192]
        cases += [
            (f"{p} softcap 50 causal 4097 GQA 8:2 (a last tile of one row)", dc,
             (dt, 128, 1, 8, 2, 4097, 4097), dict(causal=True, softcap=50.0)),
            (f"{p} softcap 30 causal 1300x700 (empty rows)", dc, (dt, 128, 1, 4, 1, 1300, 700),
             dict(causal=True, softcap=30.0)),
            (f"{p} softcap 50 causal 191x1000", dc, (dt, 128, 2, 4, 2, 191, 1000),
             dict(causal=True, softcap=50.0)),
            (f"{p} alibi causal 577x1700", dc, (dt, 128, 1, 4, 2, 577, 1700),
             dict(causal=True, alibi="h")),
            (f"{p} window (1000,0) causal softcap 50 3000", dc, (dt, 128, 1, 4, 2, 3000, 3000),
             dict(causal=True, window=(1000, -1), softcap=50.0)),
            (f"{p} window (100,0) causal 960, keys < 500 NaN (never loaded)", dc,
             (dt, 128, 1, 2, 1, 384, 960), dict(causal=True, window=(100, -1), nan_keys=500)),
            (f"{p} packed softcap 50 causal {docs}", vc, (dt, 128, docs, docs, 4, 2),
             dict(causal=True, softcap=50.0)),
            (f"{p} packed window (200,0) causal {docs}", vc, (dt, 128, docs, docs, 4, 1),
             dict(causal=True, window=(200, -1))),
        ]  # fmt: skip
    out = []
    for name, fn, args, kw in cases:
        dname = "bf16" if args[0] == torch.bfloat16 else "fp16"
        kind = _kind(kw, fn is vc)
        out.append((f"{kind} {name}", kind, dname, fn, args, kw))
    return out


_CHECKS = _checks()
_FEATURES = ("window", "softcap", "alibi", "varlen")
_KINDS = ["+".join(c) for n in range(1, 5) for c in itertools.combinations(_FEATURES, n)]


def _run(fn, args, kw, monkeypatch) -> list[str]:
    """Run one check; the labels of every launch variant_forward took."""
    seen: list[str] = []
    forward = vh.variant_forward

    def spy(q, k, v, causal, scale, cfg, variant):
        seen.append(cfg.label())
        return forward(q, k, v, causal, scale, cfg, variant)

    monkeypatch.setattr(vh, "variant_forward", spy)
    res = fn(*args, **kw)
    assert all(r["passed"] for r in res.values()), res
    return seen


@pytest.mark.parametrize("case", _CHECKS, ids=[c[0] for c in _CHECKS])
def test_gpu_c3_launch_against_the_float64_reference(case, monkeypatch):
    """Every causal d128 check on C3_N64 (every kind listed) passes the accuracy rule; a
    kind C3_SPILLS names keeps the two-consumer launch."""
    _id, kind, _dname, fn, args, kw = case
    every = frozenset(_KINDS)
    monkeypatch.setattr(vh, "C3_KINDS", {"bf16": every, "fp16": every})
    seen = _run(fn, args, kw, monkeypatch)
    want = vh.C3_N64.label() if kind not in vh.C3_SPILLS else "ws-m64-n128-s3"
    assert seen and set(seen) == {want}, seen


def _served() -> list[tuple]:
    """Every check of a (kind, dtype) the committed table serves (not in C3_SPILLS)."""
    return [
        c for c in _CHECKS
        if c[1] in vh.C3_KINDS.get(c[2], frozenset()) and c[1] not in vh.C3_SPILLS
    ]  # fmt: skip


@pytest.mark.parametrize("case", _served(), ids=[f"default {c[0]}" for c in _served()])
def test_gpu_the_committed_table_runs_c3_by_default(case, monkeypatch):
    """flash_attention's own choice (FlashConfig(forward="gluon"), no field set) takes
    C3_N64 for a kind the committed table lists, and passes the accuracy rule."""
    _id, _kind_name, _dname, fn, args, kw = case
    seen = _run(fn, args, kw, monkeypatch)
    assert seen and set(seen) == {vh.C3_N64.label()}, seen


_FP16_SOFTCAP = [c for c in _CHECKS if c[2] == "fp16" and "softcap" in c[1]]


@pytest.mark.parametrize("case", _FP16_SOFTCAP, ids=[f"qscale {c[0]}" for c in _FP16_SOFTCAP])
def test_gpu_c3_fp16_softcap_with_q_scaled_once(case, monkeypatch):
    """fp16 softcap checks on C3_N64 with SOFTCAP_QSCALE_FP16 on pass the accuracy rule,
    and their launches carried the QSCALE bit (a kind C3_SPILLS names keeps two consumers)."""
    _id, kind, _dname, fn, args, kw = case
    every = frozenset(_KINDS)
    monkeypatch.setattr(vh, "C3_KINDS", {"bf16": every, "fp16": every})
    monkeypatch.setattr(vh, "SOFTCAP_QSCALE_FP16", True)
    bits: list[int] = []
    real = vh.variant_bits
    monkeypatch.setattr(vh, "variant_bits", lambda *a, **k: bits.append(real(*a, **k)) or bits[-1])
    seen = _run(fn, args, kw, monkeypatch)
    want = vh.C3_N64.label() if kind not in vh.C3_SPILLS else "ws-m64-n128-s3"
    assert seen and set(seen) == {want}, seen
    assert bits and all(b & vh._QSCALE for b in bits), bits
