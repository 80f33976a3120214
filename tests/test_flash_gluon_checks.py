"""kernels/flash_gluon_checks.py: the Gluon forward's input checks, moved out of
flash_gluon.py, and the bounded cache of their answers."""

from __future__ import annotations

import warnings

import pytest
import torch

from fa_bench.kernels import flash_gluon, flash_gluon_checks
from fa_bench.kernels.flash_gluon_checks import gluon_reason


def test_every_moved_name_is_still_importable_from_flash_gluon():
    for name in ("gluon_reason", "version_reason", "_api_reason", "_tensor_reason",
                 "GLUON_TRITON", "HEAD_DIMS", "_TMA_ALIGN"):  # fmt: skip
        assert getattr(flash_gluon, name) is getattr(flash_gluon_checks, name), name


@pytest.fixture
def counted(monkeypatch):
    """gluon_reason's uncached checks, counted; an empty cache."""
    calls = []
    real = flash_gluon_checks._reason
    monkeypatch.setattr(flash_gluon_checks, "_REASONS", type(flash_gluon_checks._REASONS)())

    def counting(q, k, v):
        calls.append((q, k, v))
        return real(q, k, v)

    monkeypatch.setattr(flash_gluon_checks, "_reason", counting)
    return calls


def _t(shape=(1, 2, 64, 64), dtype=torch.float16):
    return torch.randn(shape, dtype=dtype)


def test_the_same_inputs_are_checked_once(counted):
    q, k, v = _t(), _t(), _t()
    first = gluon_reason(q, k, v, False)
    assert gluon_reason(q, k, v, True) == first and len(counted) == 1
    # other tensors of the same shape, strides, dtype, device and alignment: the same answer
    assert gluon_reason(_t(), _t(), _t(), False) == first and len(counted) == 1


@pytest.mark.parametrize(
    "change",
    [
        lambda t: t.new_empty(1, 2, 65, 64),  # shape
        lambda t: t.transpose(1, 2).contiguous().transpose(1, 2),  # strides
        lambda t: t.to(torch.bfloat16),  # dtype
        lambda t: t.new_empty(2 * 64 * 64 + 4)[4:].view(1, 2, 64, 64),  # base 8 B off 16
        lambda t: t.float(),  # a dtype the kernel does not take
    ],
)
def test_a_change_the_checks_read_is_checked_again(counted, change):
    q, k, v = _t(), _t(), _t()
    gluon_reason(q, k, v, False)
    other = change(q)
    assert gluon_reason(other, k, v, False) == flash_gluon_checks._reason(other, k, v)
    assert len(counted) == 3  # the first check, the changed one, and the comparison's own


def test_misaligned_base_gets_its_own_answer(counted, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    q, k, v = _t(), _t(), _t()
    assert "CUDA" in gluon_reason(q, k, v, False)
    shifted = torch.empty(2 * 64 * 64 + 4, dtype=torch.float16)[4:].view(1, 2, 64, 64)
    assert "16-byte aligned" in gluon_reason(shifted, k, v, False)


def test_the_interpreter_flag_is_part_of_the_key(counted, monkeypatch):
    q, k, v = _t(), _t(), _t()
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert "interpreter" in gluon_reason(q, k, v, False)
    monkeypatch.delenv("TRITON_INTERPRET")
    assert "CUDA" in gluon_reason(q, k, v, False)
    assert len(counted) == 2


def test_non_tensors_are_checked_every_time(counted):
    q = _t()
    assert "list" in gluon_reason([1], q, q, False)
    assert "list" in gluon_reason([1], q, q, False)
    assert len(counted) == 2 and not flash_gluon_checks._REASONS


def test_tensor_subclasses_are_checked_uncached_without_their_address(counted):
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q = torch.empty(1, 2, 64, 64, dtype=torch.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # FakeTensor warns when its data pointer is read
        assert "float32" in gluon_reason(q, q, q, False)
    assert len(counted) == 1 and not flash_gluon_checks._REASONS


def test_the_cache_is_bounded_least_recently_used_first(counted, monkeypatch):
    monkeypatch.setattr(flash_gluon_checks, "MAX_REASONS", 4)
    k = _t()
    tensors = [torch.empty(1, 2, 64 + i, 64, dtype=torch.float16) for i in range(6)]
    for t in tensors[:4]:
        gluon_reason(t, k, k, False)
    gluon_reason(tensors[0], k, k, False)  # used again: now the most recent
    for t in tensors[4:]:
        gluon_reason(t, k, k, False)
    assert len(flash_gluon_checks._REASONS) == 4 and len(counted) == 6
    gluon_reason(tensors[0], k, k, False)  # kept
    assert len(counted) == 6
    gluon_reason(tensors[1], k, k, False)  # evicted first
    assert len(counted) == 7
