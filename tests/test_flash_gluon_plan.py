"""kernels/flash_gluon_plan.py: the Gluon forward's launches planned once per tensors'
key and replayed. On a CPU: the cache (hit, a miss on each part of the key, the bound,
no tensor kept) with the launch stood in for; on the H200: planned results bit for bit
those of an unplanned launch, and a refilled buffer giving the new result."""

from __future__ import annotations

import gc
import os
import weakref

import pytest
import torch

from fa_bench.kernels import device_props, flash_gluon, flash_gluon_plan
from fa_bench.kernels.flash_gluon import GluonConfig, candidate_configs

CFG = GluonConfig()


class _Fake:
    """Stands in for triton: counts JIT launches and bound launches."""

    def __init__(self) -> None:
        self.jit, self.bound = [], []

    def call(self, cfg, tensors, lse2, causal, qk_scale, sms):
        fake = self

        class Kernel:
            def __getitem__(self, grid):
                return lambda *a, **kw: fake.jit.append(tensors) or "compiled"

        return Kernel(), (1,), (), {}

    def bind(self, cfg, fn, compiled, tensors, lse2, causal, qk_scale):
        return (lambda: self.bound.append(tensors[0].data_ptr())), ""


@pytest.fixture
def fake(monkeypatch):
    f = _Fake()
    monkeypatch.setattr(flash_gluon_plan, "call", f.call)
    monkeypatch.setattr(flash_gluon_plan, "_bind", f.bind)
    monkeypatch.setattr(flash_gluon_plan, "_PLANS", type(flash_gluon_plan._PLANS)())
    return f


def _io(shape=(1, 2, 64, 64), dtype=torch.float16):
    q, k, v = (torch.randn(shape, dtype=dtype) for _ in range(3))
    o = torch.empty_like(q)
    lse2 = torch.empty(shape[:3], dtype=torch.float32)
    return [q, k, v, o, lse2]


def _go(t, cfg=CFG, causal=False, scale=0.18):
    flash_gluon._launch(cfg, *t, causal, scale)


def test_the_same_tensors_replay_the_plan(fake):
    t = _io()
    for _ in range(3):
        _go(t)
    assert len(fake.jit) == 1 and len(fake.bound) == 2


@pytest.mark.parametrize("part", range(5))
@pytest.mark.parametrize("change", ["pointer", "shape", "stride", "dtype"])
def test_a_change_in_any_tensor_is_planned_anew(fake, part, change):
    t = _io()
    _go(t)
    x = t[part]
    if change == "pointer":
        x = x.clone()
    elif change == "shape":
        x = x.new_empty(*x.shape[:-1], x.shape[-1] + 8)
    elif change == "stride":
        x = x.transpose(1, 2).contiguous().transpose(1, 2)
    else:
        x = x.to(torch.bfloat16 if x.dtype == torch.float16 else torch.float64)
    _go([*t[:part], x, *t[part + 1 :]])
    assert len(fake.jit) == 2 and not fake.bound


@pytest.mark.parametrize("kw", [{"cfg": GluonConfig(stages=3)}, {"causal": True}, {"scale": 0.2}])
def test_a_change_in_config_causal_or_scale_is_planned_anew(fake, kw):
    t = _io()
    _go(t)
    _go(t, **kw)
    _go(t, **kw)
    assert len(fake.jit) == 2 and len(fake.bound) == 1


def test_plans_are_bounded_least_recently_used_first(fake, monkeypatch):
    monkeypatch.setattr(flash_gluon_plan, "MAX_PLANS", 3)
    ts = [_io() for _ in range(4)]
    for t in ts[:3]:
        _go(t)
    _go(ts[0])  # replayed: now the most recent
    _go(ts[3])  # evicts ts[1]
    assert len(flash_gluon_plan._PLANS) == 3 and len(fake.jit) == 4
    _go(ts[0])
    _go(ts[2])
    assert len(fake.jit) == 4
    _go(ts[1])
    assert len(fake.jit) == 5


def test_no_plan_off_cuda(monkeypatch):
    monkeypatch.setattr(flash_gluon_plan, "_PLANS", type(flash_gluon_plan._PLANS)())
    t = _io()
    bound, why = flash_gluon_plan._bind(CFG, None, "compiled", tuple(t[:4]), t[4], False, 0.1)
    assert bound is None and "JIT" in why


def test_a_pointer_stand_in_keeps_no_tensor_alive():
    t = torch.randn(1, 2, 64, 64, dtype=torch.float16)
    p = flash_gluon_plan._Ptr(t)
    ref = weakref.ref(t)
    assert (p.data_ptr(), p.shape, p.stride(), p.dtype) == (t.data_ptr(), t.shape, t.stride(),
                                                           t.dtype)  # fmt: skip
    del t
    gc.collect()
    assert ref() is None


def test_a_descriptor_of_the_stand_in_is_the_tensors_but_for_its_base():
    pytest.importorskip("triton.experimental.gluon")
    for dtype in (torch.bfloat16, torch.float16):
        t = torch.empty(2, 3, 256, 64, dtype=dtype).transpose(1, 2)
        a, b = flash_gluon._descriptor(t, 64), flash_gluon._descriptor(flash_gluon_plan._Ptr(t), 64)
        assert b.base.data_ptr() == t.data_ptr() and b.base is not t
        for field in ("shape", "strides", "block_shape", "layout", "padding"):
            assert getattr(a, field) == getattr(b, field), field


def test_the_call_of_the_stand_ins_is_the_tensors_but_for_the_bases():
    pytest.importorskip("triton.experimental.gluon")
    t = _io(shape=(2, 4, 200, 128), dtype=torch.bfloat16)
    ptrs = tuple(flash_gluon_plan._Ptr(x) for x in t)
    for cfg in candidate_configs(128).values():
        fa, ga, aa, ka = flash_gluon_plan.call(cfg, tuple(t[:4]), t[4], True, 0.2, 132)
        fb, gb, ab, kb = flash_gluon_plan.call(cfg, ptrs[:4], ptrs[4], True, 0.2, 132)
        assert (fa, ga, ka) == (fb, gb, kb) and len(aa) == len(ab)
        for x, y in zip(aa, ab, strict=True):
            if hasattr(x, "block_shape"):
                assert (x.shape, x.strides, x.block_shape) == (y.shape, y.strides, y.block_shape)
                assert x.base.data_ptr() == y.base.data_ptr()
            elif isinstance(x, torch.Tensor):
                assert x.data_ptr() == y.data_ptr()
            else:
                assert x == y


def _writer(o, lse2, value):
    def bound():
        o.fill_(value)
        lse2.fill_(value)

    return bound


def test_a_bound_launch_is_kept_only_if_it_reproduces_the_jit_launch():
    o, lse2 = torch.full((2, 8), 3.0, dtype=torch.float16), torch.full((2,), 3.0)
    assert flash_gluon_plan._reproduces(_writer(o, lse2, 3.0), o, lse2)
    assert not flash_gluon_plan._reproduces(_writer(o, lse2, 4.0), o, lse2)
    assert torch.equal(o, torch.full_like(o, 3.0)) and torch.equal(lse2, torch.full_like(lse2, 3))
    # one that writes nothing does not pass for one that wrote the same
    assert not flash_gluon_plan._reproduces(lambda: None, o, lse2)
    assert torch.equal(o, torch.full_like(o, 3.0))

    def raising():
        raise RuntimeError("another triton")

    assert not flash_gluon_plan._reproduces(raising, o, lse2)


# --- on the H200 ------------------------------------------------------------------------

needs_gluon_gpu = pytest.mark.skipif(
    not torch.cuda.is_available()
    or os.environ.get("TRITON_INTERPRET") == "1"
    or torch.cuda.get_device_capability() != (9, 0),
    reason="needs an sm_90 GPU",
)


def _unplanned(cfg, q, k, v, causal, scale):
    """The launch as before plans: triton's JIT, fresh descriptors."""
    o = torch.empty_like(q)
    lse2 = torch.empty(q.shape[:3], device=q.device, dtype=torch.float32)
    fn, grid, args, kw = flash_gluon_plan.call(cfg, (q, k, v, o), lse2, causal,
                                               scale * flash_gluon._LOG2E,
                                               device_props.sm_count(q.device))  # fmt: skip
    fn[grid](*args, **kw)
    return o, lse2


def _same_bits(a, b):
    return torch.equal(a.view(torch.int16 if a.element_size() == 2 else torch.int32),
                       b.view(torch.int16 if b.element_size() == 2 else torch.int32))  # fmt: skip


GPU_CASES = [  # (batch, heads_q, heads_kv, seq_q, seq_k, head_dim, (B, S, H, D) layout)
    (2, 4, 2, 1000, 1000, 128, False),
    (1, 8, 8, 777, 1500, 64, True),
    (4, 16, 16, 1024, 1024, 128, False),
]


def _qkv(case, dtype, seed=0):
    b, hq, hkv, sq, sk, d, bshd = case
    g = torch.Generator(device="cuda").manual_seed(seed)

    def one(h, s):
        if bshd:
            return torch.randn(b, s, h, d, device="cuda", dtype=dtype, generator=g).transpose(1, 2)
        return torch.randn(b, h, s, d, device="cuda", dtype=dtype, generator=g)

    return one(hq, sq), one(hkv, sk), one(hkv, sk)


def _launches(head_dim, causal, dtype):
    """One config per kernel function (the plan binds each one's own parameter list):
    bf16 the pipelined, the ws and the persistent ws kernel; fp16 the heuristic's."""
    if dtype == torch.float16:
        return {"heuristic": flash_gluon.gluon_config(head_dim, causal)}
    roles = candidate_configs(head_dim)
    return {r: roles[r] for r in ("ws", "ws-persist-q2", "pipelined")}


@pytest.mark.gpu
@needs_gluon_gpu
@pytest.mark.parametrize("case", GPU_CASES[:2])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_planned_results_are_the_unplanned_bit_for_bit(case, causal, dtype):
    q, k, v = _qkv(case, dtype)
    for role, cfg in _launches(case[5], causal, dtype).items():
        want_o, want_lse = _unplanned(cfg, q, k, v, causal, 0.1)
        flash_gluon_plan.clear()
        hits = flash_gluon_plan.hits
        o, lse2 = torch.empty_like(q), torch.empty(q.shape[:3], device="cuda")
        for _ in range(3):  # planned, then replayed twice: each launch writes all of it
            o.fill_(float("nan"))
            lse2.fill_(float("nan"))
            flash_gluon._launch(cfg, q, k, v, o, lse2, causal, 0.1 * flash_gluon._LOG2E)
            assert _same_bits(o, want_o) and _same_bits(lse2, want_lse), role
        assert flash_gluon_plan.last_reason == "", (role, flash_gluon_plan.last_reason)
        assert flash_gluon_plan.hits == hits + 2, role
        for _ in range(3):  # the public call, its outputs at whatever addresses they get
            got = flash_gluon.gluon_forward(q, k, v, causal, 0.1, cfg)
            assert _same_bits(got[0], want_o) and _same_bits(got[1], want_lse), role


@pytest.mark.gpu
@needs_gluon_gpu
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_a_refilled_buffer_gives_the_new_result(causal):
    case = GPU_CASES[0]
    q, k, v = _qkv(case, torch.bfloat16)
    q2, k2, v2 = _qkv(case, torch.bfloat16, seed=1)
    flash_gluon_plan.clear()
    o1, _ = flash_gluon.gluon_forward(q, k, v, causal, 0.1)
    flash_gluon.gluon_forward(q, k, v, causal, 0.1)  # replayed
    for x, new in ((q, q2), (k, k2), (v, v2)):
        x.copy_(new)
    o = torch.empty_like(q)  # kept alive: the next output takes another address...
    lse2 = torch.empty(q.shape[:3], device="cuda", dtype=torch.float32)
    cfg = flash_gluon.gluon_config(q.shape[3], causal)
    flash_gluon._launch(cfg, q, k, v, o, lse2, causal, 0.1 * flash_gluon._LOG2E)
    flash_gluon._launch(cfg, q, k, v, o, lse2, causal, 0.1 * flash_gluon._LOG2E)  # ...replayed
    want_o, want_lse = _unplanned(cfg, q2, k2, v2, causal, 0.1)
    assert _same_bits(o, want_o) and _same_bits(lse2, want_lse)
    assert not _same_bits(o, o1)


@pytest.mark.gpu
@needs_gluon_gpu
def test_gpu_a_planned_forward_replays_in_a_cuda_graph():
    q, k, v = _qkv(GPU_CASES[2], torch.bfloat16)
    flash_gluon_plan.clear()
    want, _ = flash_gluon.gluon_forward(q, k, v, False, 0.1)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        flash_gluon.gluon_forward(q, k, v, False, 0.1)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out, _ = flash_gluon.gluon_forward(q, k, v, False, 0.1)
        out2, _ = flash_gluon.gluon_forward(q, k, v, False, 0.1)
    g.replay()
    torch.cuda.synchronize()
    assert _same_bits(out, want) and _same_bits(out2, want)


def test_disabled_plans_launch_through_the_jit_every_call(fake, monkeypatch):
    monkeypatch.setattr(flash_gluon_plan, "ENABLED", False)
    t = _io()
    for _ in range(3):
        _go(t)
    assert len(fake.jit) == 3 and not fake.bound and not flash_gluon_plan._PLANS


def test_the_bound_launch_module_is_what_decode_plans_use():
    from fa_bench.kernels import bound_launch, decode_plan

    assert decode_plan._Bound is bound_launch.Bound
    assert decode_plan._values is bound_launch.jit_values


def test_a_kernel_whose_bound_launch_failed_its_check_is_not_bound_again(monkeypatch):
    from types import SimpleNamespace

    class Compiled:  # hashable, as triton's CompiledKernel
        run = function = None

    compiled = Compiled()
    monkeypatch.setattr(flash_gluon_plan, "_VERIFIED", {compiled: False})

    def no_call(*a):
        raise AssertionError("the launch was described again")

    monkeypatch.setattr(flash_gluon_plan, "call", no_call)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    cuda = SimpleNamespace(device=torch.device("cuda", 0))
    bound, why = flash_gluon_plan._bind(CFG, None, compiled, (cuda,) * 4, cuda, False, 0.1)
    assert bound is None and "did not reproduce" in why


def test_recall_and_remember_keep_the_most_recently_used_plans():
    """The plan caches' two operations (kernels/bound_launch.py), shared by the forward's
    and the backward's plans: a recalled plan becomes the most recent, a remembered one
    drops the least recent past the limit read at that call."""
    from collections import OrderedDict

    from fa_bench.kernels.bound_launch import recall, remember

    plans: OrderedDict = OrderedDict()
    for key in "abc":
        remember(plans, key, key.upper(), 2)
    assert list(plans) == ["b", "c"]
    assert recall(plans, "b") == "B" and list(plans) == ["c", "b"]
    remember(plans, "d", "D", 2)
    assert list(plans) == ["b", "d"] and recall(plans, "c") is None
    remember(plans, "b", "B2", 1)  # replaced, and a smaller limit applies at once
    assert list(plans.items()) == [("b", "B2")]
