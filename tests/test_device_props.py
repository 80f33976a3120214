"""The planners' shared SM count and L2 size (fa_bench.kernels.device_props)."""

import torch

from fa_bench.kernels import device_props


class _Props:
    multi_processor_count = 132
    L2_cache_size = 60 * 2**20


def test_off_cuda_both_are_zero(monkeypatch):
    assert device_props.sm_count(torch.device("cpu")) == 0
    assert device_props.l2_bytes("cpu") == 0
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert device_props.sm_count(0) == 0 and device_props.l2_bytes() == 0


def test_a_device_is_read_once(monkeypatch):
    reads = []

    def props(index):
        reads.append(index)
        return _Props()

    monkeypatch.setattr(torch.cuda, "get_device_properties", props)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    device_props._props.cache_clear()
    try:
        assert device_props.sm_count() == 132  # the current device: index 1
        assert device_props.l2_bytes(torch.device("cuda", 1)) == 60 * 2**20
        assert device_props.sm_count(3) == 132
        assert device_props.sm_count("cuda") == 132  # no index: the current device
        assert reads == [1, 3]
    finally:
        device_props._props.cache_clear()
