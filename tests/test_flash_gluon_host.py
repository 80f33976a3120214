"""The Gluon forward's host path: what a short call spends before its launch."""

from __future__ import annotations

import pytest
import torch

gluon = pytest.importorskip("triton.experimental.gluon")


def test_descriptor_layout_is_the_default_for_its_box():
    from triton.experimental.gluon import language as gl

    from fa_bench.kernels import flash_gluon as fg

    for dtype, gl_dtype in ((torch.bfloat16, gl.bfloat16), (torch.float16, gl.float16)):
        t = torch.empty(2, 3, 256, 64, dtype=dtype)
        desc = fg._descriptor(t, 128)
        assert desc.block_shape == [1, 1, 128, 64]
        assert desc.layout == gl.NVMMASharedLayout.get_default_for([1, 1, 128, 64], gl_dtype)
        assert desc.base is t and list(desc.strides) == list(t.stride())


def test_checked_skips_only_the_repeated_input_check(monkeypatch):
    from fa_bench.kernels import flash_gluon as fg

    calls = []
    monkeypatch.setattr(fg, "gluon_reason", lambda *a: calls.append(a) or "no GPU here")
    monkeypatch.setattr(fg, "_launch", lambda *a: None)
    q = torch.empty(1, 2, 64, 64, dtype=torch.float16)
    with pytest.raises(ValueError, match="no GPU here"):
        fg.gluon_forward(q, q, q, False, 0.125)
    assert len(calls) == 1
    o, lse2 = fg.gluon_forward(q, q, q, False, 0.125, checked=True)
    assert len(calls) == 1 and o.shape == q.shape and lse2.shape == (1, 2, 64)
