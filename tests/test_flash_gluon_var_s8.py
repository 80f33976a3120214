"""Which launch a variant call takes (issue 19, session 8): the three-consumer 64-key
launch (flash_gluon_varhost.C3_N64) for the (kind, dtype) pairs C3_KINDS lists, causal,
head_dim 128, unless a gluon_* field pins the launch; the two-consumer one elsewhere; the
backend string names it. And the session's tools: the SASS tool's combinations, the speed
tool's pick, the plugin's tables. `slow`: every combination the table serves compiles
for sm_90 with triton 3.6 (where /tmp/tri36 holds it) without spills.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from gluon_bwd_helpers import TRI36
from gluon_bwd_helpers import tool as _tool

from fa_bench.kernels import FlashConfig, flash_dispatch, flash_gluon
from fa_bench.kernels import flash_gluon_varhost as vh
from fa_bench.kernels.flash_gluon import SMEM_BYTES, gluon_config
from fa_bench.kernels.flash_validate import Variant, Varlen, make_variant

BF16, FP16 = torch.bfloat16, torch.float16
PLAIN = gluon_config(128, causal=True)  # the two-consumer 128-key launch variants ran before


def _v(window=None, softcap=0.0, alibi=False, varlen=False) -> Variant:
    cu = torch.tensor([0, 3, 9], dtype=torch.int32)
    return Variant(window=window, softcap=softcap, slopes=torch.ones(1, 4) if alibi else None,
                   varlen=Varlen(cu, cu, 6, 6) if varlen else None, tanh=1)  # fmt: skip


def test_the_launch_is_three_consumers_over_64_key_blocks_that_fit():
    c3 = vh.C3_N64
    assert (c3.variant, c3.consumers, c3.block_n, c3.stages, c3.pingpong) == ("ws", 3, 64, 4, False)
    assert c3.rows_per_cta == 192 and not c3.persistent
    assert c3.smem_bytes(128) <= SMEM_BYTES
    assert c3.registers()[0] >= c3.consumer_regs == 160  # consumer 0 not starved
    assert c3.label() == "ws-m64-n64-s4-c3-nopp"


def test_variant_kind_names_the_features_in_a_fixed_order():
    assert vh.variant_kind(_v(softcap=50.0)) == "softcap"
    assert vh.variant_kind(_v(window=(4096, 0), softcap=50.0)) == "window+softcap"
    assert vh.variant_kind(_v(alibi=True, varlen=True)) == "alibi+varlen"
    assert vh.variant_kind(_v((1, 0), 5.0, True, True)) == "window+softcap+alibi+varlen"
    # as make_variant builds them: causal without a window has no "window"
    q = torch.zeros((1, 4, 64, 128), dtype=BF16)
    kw = dict(alibi_slopes=None, softcap=50.0, batch=1, seq_q=64, seq_k=64)
    assert vh.variant_kind(make_variant(q, causal=True, window=(-1, -1), **kw)) == "softcap"
    assert vh.variant_kind(make_variant(q, causal=True, window=(8, -1), **kw)) == "window+softcap"


def test_three_consumers_serve_the_tables_kinds_causal_d128_only(monkeypatch):
    monkeypatch.setattr(vh, "C3_KINDS", {"bf16": frozenset({"softcap", "alibi"}),
                                         "fp16": frozenset({"softcap"})})  # fmt: skip
    cap, alibi = _v(softcap=50.0), _v(alibi=True)
    assert vh.three_consumers(cap, BF16, 128, True)
    assert vh.three_consumers(cap, FP16, 128, True)
    assert vh.three_consumers(alibi, BF16, 128, True)
    assert not vh.three_consumers(alibi, FP16, 128, True)  # not listed for fp16
    assert not vh.three_consumers(cap, BF16, 128, False)  # non-causal: not measured
    assert not vh.three_consumers(cap, BF16, 64, True)  # head_dim 64 / 256: not measured
    assert not vh.three_consumers(cap, BF16, 256, True)
    assert not vh.three_consumers(cap, torch.float32, 128, True)
    assert not vh.three_consumers(cap, None, 128, True)
    # a combination is its own kind: softcap with a window is not "softcap"
    assert not vh.three_consumers(_v(window=(4096, 0), softcap=50.0), BF16, 128, True)
    # kinds that spill at 160 registers: never, listed or not
    all4 = _v((1, 0), 5.0, True, True)
    assert vh.variant_kind(all4) in vh.C3_SPILLS
    monkeypatch.setattr(vh, "C3_KINDS", {"bf16": frozenset({vh.variant_kind(all4)})})
    assert not vh.three_consumers(all4, BF16, 128, True)


def test_variant_config_takes_c3_for_a_served_call_unless_pinned(monkeypatch):
    monkeypatch.setattr(vh, "C3_KINDS", {"bf16": frozenset({"softcap"})})
    cap = _v(softcap=50.0)
    assert vh.variant_config(PLAIN, 128, cap, BF16, True) == vh.C3_N64
    # persistent non-causal heuristic: not served (non-causal), the plain launch
    persist = gluon_config(128, causal=False)
    assert persist.persistent
    assert vh.variant_config(persist, 128, cap, BF16, False) == PLAIN
    assert vh.variant_config(PLAIN, 128, cap, BF16, True, pinned=True) == PLAIN
    assert vh.variant_config(PLAIN, 128, _v(window=(8, 0)), BF16, True) == PLAIN
    assert vh.variant_config(PLAIN, 128, cap, FP16, True) == PLAIN  # fp16 not listed here
    # without a variant: session 7's rule, unchanged
    assert vh.variant_config(PLAIN, 128) == PLAIN
    assert vh.variant_config(dataclasses.replace(PLAIN, persistent=True), 128) == PLAIN


def test_the_committed_table_lists_valid_kinds_and_serves_softcap():
    every = set(_tool("variants_gluon_s8_sass").kinds())
    assert set(vh.C3_KINDS) <= {"bf16", "fp16"}
    for kinds in vh.C3_KINDS.values():
        assert isinstance(kinds, frozenset) and kinds <= every
    # call 0: softcap 50 causal bf16 8 x 8k, 0.992 x dense on C3_N64 against 0.904
    assert "softcap" in vh.C3_KINDS["bf16"]


def _qkv(dtype, n=4096):
    return tuple(torch.zeros((1, 2, n, 128), dtype=dtype) for _ in range(3))


def test_the_dispatch_and_the_backend_string_name_the_launch(monkeypatch):
    """flash_attention's dispatch (gluon_choice) hands C3_N64 to a served call and the
    backend string (forward_label) names it; a set gluon_* field pins the old launch."""
    monkeypatch.setattr(flash_gluon, "gluon_reason", lambda *a: None)
    monkeypatch.setattr(vh, "C3_KINDS", {"bf16": frozenset({"softcap"}),
                                         "fp16": frozenset({"softcap"})})  # fmt: skip
    for dtype in (BF16, FP16):
        q, k, v = _qkv(dtype)
        var = make_variant(q, causal=True, window=(-1, -1), alibi_slopes=None, softcap=50.0,
                           batch=1, seq_q=4096, seq_k=4096)  # fmt: skip
        got = flash_dispatch.gluon_choice(q, k, v, True, FlashConfig(), var)
        assert got == vh.C3_N64
        assert flash_dispatch.forward_label(got, "tl") == "gluon-ws-m64-n64-s4-c3-nopp"
        forced = flash_dispatch.gluon_choice(q, k, v, True, FlashConfig(forward="gluon"), var)
        assert forced == vh.C3_N64
        pinned = FlashConfig(gluon_pingpong=False)
        assert flash_dispatch.gluon_choice(q, k, v, True, pinned, var).consumers == 2
        assert flash_dispatch.gluon_choice(q, k, v, False, FlashConfig(), var).consumers == 2
        window = make_variant(q, causal=True, window=(64, -1), alibi_slopes=None, softcap=0.0,
                              batch=1, seq_q=4096, seq_k=4096)  # fmt: skip
        assert flash_dispatch.gluon_choice(q, k, v, True, FlashConfig(), window) == PLAIN
        # the dense call is untouched
        assert flash_dispatch.gluon_choice(q, k, v, True, FlashConfig()) == PLAIN


def test_the_sass_tools_combinations_follow_the_table(monkeypatch):
    tool = _tool("variants_gluon_s8_sass")
    assert len(tool.kinds()) == 15
    every = tool.combos(served=False)
    assert len(every) == 15 * 2 * 2
    monkeypatch.setattr(vh, "C3_KINDS", {"fp16": frozenset({"alibi", "window+softcap"})})
    served = tool.combos(served=True)
    assert {(k, d, c) for k, d, c, _bits in served} == {
        ("alibi", "fp16", True), ("window+softcap", "fp16", True)}  # fmt: skip
    bits = dict(((k, d, c), b) for k, d, c, b in every)
    assert bits[("softcap", "bf16", True)] & vh._FIXED_MAX  # bf16's fixed offset
    assert not bits[("softcap", "fp16", True)] & vh._FIXED_MAX
    assert bits[("alibi", "bf16", True)] & vh._ALIBI_COL
    assert bits[("window+varlen", "fp16", False)] == vh._WINDOW | vh._VARLEN


def _row(kind, dtype, ratio):
    return dict(kind=kind, dtype=dtype, c3_over_c2=ratio)


def test_the_pick_takes_c3_where_it_measured_faster_by_the_margin():
    tool = _tool("variants_gluon_s8")
    committed = {"bf16": frozenset({"softcap"}), "fp16": frozenset({"softcap"})}
    rows = [
        _row("softcap", "bf16", 1.08), _row("softcap", "bf16", 1.02),
        _row("softcap", "fp16", 0.97), _row("softcap", "fp16", 1.02),  # gm < 1.01
        _row("alibi", "bf16", 1.03), _row("alibi", "fp16", 1.005),
        _row("window", "bf16", 0.95),
    ]  # fmt: skip
    got = tool.pick(rows, committed)
    assert got == {"bf16": ["alibi", "softcap"], "fp16": []}
    # no rows for a kind: the committed choice stays
    assert tool.pick([], committed) == {"bf16": ["softcap"], "fp16": ["softcap"]}


def test_the_plugin_sets_the_table_around_calls_and_reads_a_pick(tmp_path):
    plugin = _tool("variants_gluon_s8_plugin")
    before = vh.C3_KINDS
    with plugin.c3_kinds({}):
        assert vh.C3_KINDS == {}
    assert vh.C3_KINDS is before
    with pytest.raises(RuntimeError), plugin.c3_kinds({}):
        raise RuntimeError("a failing call")
    assert vh.C3_KINDS is before
    path = tmp_path / "pick.json"
    path.write_text(json.dumps({"bf16": ["alibi", "softcap"], "fp16": []}))
    assert plugin.picked(str(path)) == {"bf16": frozenset({"alibi", "softcap"}),
                                        "fp16": frozenset()}  # fmt: skip
    assert plugin.picked(None) == dict(vh.C3_KINDS)
    path.write_text(json.dumps({"bf16": ["tanh"]}))
    with pytest.raises(ValueError, match=r"VAR_S8_PICK=.*tanh"):
        plugin.picked(str(path))
    assert plugin.EVERY == frozenset(_tool("variants_gluon_s8_sass").kinds())


def test_the_speed_tools_rows_are_kinds_of_the_table():
    tool = _tool("variants_gluon_s8")
    every = set(_tool("variants_gluon_s8_sass").kinds())
    assert {kind for kind, *_ in tool.ROWS} <= every
    assert set(tool._all_kinds()) == every
    assert all(set(ds) <= set(tool.DTYPES) for *_, ds in tool.ROWS)


@pytest.mark.slow
@pytest.mark.skipif(
    not os.path.exists(f"{TRI36}/triton/__init__.py"), reason="no triton 3.6 installed aside"
)
def test_every_served_combination_compiles_for_sm90_without_spills(tmp_path):
    """triton 3.6 (the H200's) compiles C3_N64 for every (kind, dtype) C3_KINDS serves,
    causal, with no ptxas spills (the 128-key three-consumer form spills ~1 KB)."""
    env = dict(os.environ, PYTHONPATH=TRI36)
    env.pop("TRITON_INTERPRET", None)
    out = tmp_path / "sass.json"
    root = Path(__file__).resolve().parent.parent
    res = subprocess.run(
        [sys.executable, "tools/gpu/variants_gluon_s8_sass.py", "--served", "--json", str(out)],
        cwd=root, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    rows = json.loads(out.read_text())
    served = {(k, d) for d, ks in vh.C3_KINDS.items() for k in ks}
    assert {(r["kind"], r["dtype"]) for r in rows} == served
    assert all(r["spill_stores"] == 0 and r["spill_loads"] == 0 for r in rows), rows


def test_the_speed_tools_rows_time_each_launch_under_its_label(monkeypatch):
    """A row's plumbing on CPU (fake timings): the c2 / c3 calls run under their tables
    and the dispatch names C3_N64 for c3 and the plain launch for c2; TFLOP/s count the
    attended pairs; the table is the committed one again after."""
    tool = _tool("variants_gluon_s8")
    monkeypatch.setattr(tool, "DEVICE", "cpu")
    monkeypatch.setattr(flash_gluon, "gluon_reason", lambda *a: None)
    calls: list[str] = []

    def fake_fn(kind, q, k, v, kw):
        def run():
            calls.append("c3" if vh.C3_KINDS else "c2")
            return q.float()

        return run

    def fake_dense(q, k, v):
        return lambda: calls.append("dense")

    ms = {"c2": 3.0, "c3": 2.0, "dense": 1.5}

    def fake_bench(fn):
        fn()
        return ms[calls[-1]]

    monkeypatch.setattr(tool, "_fn", fake_fn)
    monkeypatch.setattr(tool, "_dense", fake_dense)
    monkeypatch.setattr(tool, "_bench", fake_bench)
    before = vh.C3_KINDS
    row = tool._row("window+softcap", 1, 512, "bf16")
    assert vh.C3_KINDS is before
    assert row["labels"] == {"c2": "gluon-ws-m64-n128-s3", "c3": "gluon-ws-m64-n64-s4-c3-nopp"}
    from fa_bench.variants import window_pairs

    flops = 4.0 * window_pairs(512, 512, True, tool.WIN) * tool.D * tool.HQ
    assert row["c3"] == pytest.approx(flops / 2.0 / 1e9)
    assert row["c3_over_c2"] == pytest.approx(1.5) and row["max_diff"] == 0.0
    dense = 4.0 * window_pairs(512, 512, True) * tool.D * tool.HQ / 1.5 / 1e9
    assert row["dense"] == pytest.approx(dense)
    packed = tool._row("varlen", 2, 0, "fp16")
    assert packed["labels"]["c3"] == "gluon-ws-m64-n64-s4-c3-nopp"
    assert packed["shape"].startswith("packed uniform:256-3840")
    assert calls.count("dense") == 4  # twice per row


def test_fp16_softcap_scales_q_only_under_its_switch_and_bound(monkeypatch):
    """SOFTCAP_QSCALE_FP16 (off by default): an fp16 softcap launch carries QSCALE when
    scale / c >= QSCALE_FP16_MIN and the call's scale is known; bf16's bits unchanged."""
    cap = _v(softcap=50.0)
    scale = 128**-0.5
    assert not vh.SOFTCAP_QSCALE_FP16
    assert vh.variant_bits(cap, 0, True, FP16, scale) == vh._SOFTCAP
    monkeypatch.setattr(vh, "SOFTCAP_QSCALE_FP16", True)
    assert vh.variant_bits(cap, 0, True, FP16, scale) == vh._SOFTCAP | vh._QSCALE
    with_alibi = _v(softcap=50.0, alibi=True)
    assert vh.variant_bits(with_alibi, 0, True, FP16, scale) & vh._QSCALE
    assert not vh.variant_bits(cap, 0, True, FP16) & vh._QSCALE  # scale unknown
    big = _v(softcap=scale / vh.QSCALE_FP16_MIN * 1.01)  # scale / c just below the bound
    assert not vh.variant_bits(big, 0, True, FP16, scale) & vh._QSCALE
    assert not vh.variant_bits(_v(window=(3, 0)), 0, True, FP16, scale) & vh._QSCALE
    fast = vh._SOFTCAP | vh._FIXED_MAX | vh._QSCALE
    assert vh.variant_bits(cap, 0, True, BF16, scale) == fast  # bf16: as before


def test_the_speed_tool_times_c3q_on_fp16_softcap_rows_only(monkeypatch):
    tool = _tool("variants_gluon_s8")
    assert tool.launches("softcap", "fp16") == ("c2", "c3", "c3q")
    assert tool.launches("window+softcap", "fp16")[-1] == "c3q"
    assert tool.launches("softcap", "bf16") == ("c2", "c3")
    assert tool.launches("alibi", "fp16") == ("c2", "c3")
    seen = []
    for name in ("c2", "c3", "c3q"):
        with tool.launch(name):
            seen.append((bool(vh.C3_KINDS), vh.SOFTCAP_QSCALE_FP16))
    assert seen == [(False, False), (True, False), (True, True)]
    assert vh.SOFTCAP_QSCALE_FP16 is False
    assert tool.pick_qscale([{"c3q_over_c3": 1.03}, {"c3q_over_c3": 1.0}]) is True
    assert tool.pick_qscale([{"c3q_over_c3": 1.005}]) is False
    assert tool.pick_qscale([{"c3_over_c2": 1.2}]) is None
