"""kernels/flash_gluon_bwd_plan.py: the Gluon backward's three launches planned once per
tensors' key and replayed (issue 18, sessions 8 and 13). On a CPU: the cache (hit, a miss
on each tensor and on the config, causal and scale, the bound), the preprocessing
launch's own plan and that it comes first, what is not planned, the stand-ins' launches
equal to the tensors' but for the bases, the checks of a bound replay, the workspace
zeroed by the preprocessing kernel (interpreter); on the H200: planned gradients those of
the unplanned launches (dK, dV bit for bit), a refilled buffer giving the new gradients,
flash_attention's backward taking the plan."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch

from fa_bench.kernels import flash_gluon_bwd, flash_gluon_bwd_plan
from fa_bench.kernels.flash_gluon_bwd import candidate_bwd_configs, gluon_bwd_config
from fa_bench.kernels.flash_gluon_plan import _Ptr

CFG = gluon_bwd_config(128)
_real_plannable = flash_gluon_bwd_plan.plannable


class _Fake:
    """Stands in for triton: counts JIT launches and bound replays."""

    def __init__(self) -> None:
        self.jit, self.bound = [], []

    def steps(self, cfg, tensors, lse2, delta, causal, scale, probe=0, variant=None):
        fake = self

        class Kernel:
            def __getitem__(self, grid):
                return lambda *a, **kw: fake.jit.append(tensors[0].data_ptr()) or "compiled"

        return [lambda: (Kernel(), (1,), (), {})] * 2  # the Gluon kernel, dQ's cast

    def bind(self, cfg, compiled, tensors, lse2, delta, causal, scale, variant=None):
        return (lambda: self.bound.append(tensors[0].data_ptr()),), ""


@pytest.fixture
def fake(monkeypatch):
    f = _Fake()
    monkeypatch.setattr(flash_gluon_bwd_plan, "steps", f.steps)
    monkeypatch.setattr(flash_gluon_bwd_plan, "_bind", f.bind)
    monkeypatch.setattr(flash_gluon_bwd_plan, "plannable", lambda tensors, lse2: "")
    monkeypatch.setattr(flash_gluon_bwd_plan, "_PLANS", type(flash_gluon_bwd_plan._PLANS)())
    return f


def _io(shape=(1, 2, 64, 128), heads_kv=2, dtype=torch.bfloat16):
    """(tensors, lse2, delta) of one backward, in flash_gluon_bwd_plan.NAMES' order."""
    b, h, s, d = shape
    q, o, do = (torch.randn(shape, dtype=dtype) for _ in range(3))
    k, v = (torch.randn(b, heads_kv, s, d, dtype=dtype) for _ in range(2))
    dk, dv, dq = torch.empty_like(k), torch.empty_like(v), torch.empty_like(q)
    dq_ws = torch.zeros(shape, dtype=torch.float32)
    lse2, delta = torch.randn(b, h, s), torch.empty(b, h, s)
    return [q, k, v, o, do, dk, dv, dq, dq_ws], lse2, delta


def _column_major(shape):
    strides, n = [], 1
    for size in shape:
        strides.append(n)
        n *= size
    return tuple(strides)


def _go(t, lse2, delta, cfg=CFG, causal=False, scale=0.088):
    flash_gluon_bwd_plan.launch(cfg, tuple(t), lse2, delta, causal, scale)


def test_the_same_tensors_replay_the_plan(fake):
    t, lse2, delta = _io()
    for _ in range(3):
        _go(t, lse2, delta)
    assert len(fake.jit) == 2 and len(fake.bound) == 2  # two JIT launches once
    assert flash_gluon_bwd_plan.last_reason == ""


@pytest.mark.parametrize("part", range(len(flash_gluon_bwd_plan.NAMES) + 2))
@pytest.mark.parametrize("change", ["pointer", "shape", "stride", "dtype"])
def test_a_change_in_any_tensor_is_planned_anew(fake, part, change):
    t, lse2, delta = _io()
    _go(t, lse2, delta)
    every = [*t, lse2, delta]
    x = every[part]
    # each change alone: the same address but for "pointer"
    if change == "pointer":
        x = x.clone()
    elif change == "shape":
        x = x[..., : x.shape[-1] // 2]
    elif change == "stride":
        x = x.as_strided(x.shape, _column_major(x.shape))
    else:
        x = x.view({torch.bfloat16: torch.float16, torch.float32: torch.int32}[x.dtype])
    assert (x.data_ptr() == every[part].data_ptr()) == (change != "pointer")
    every[part] = x
    _go(every[:-2], every[-2], every[-1])
    assert len(fake.jit) == 4, (part, change)


@pytest.mark.parametrize("kw", [dict(causal=True), dict(scale=0.1),
                                dict(cfg=candidate_bwd_configs(128)["ws-pss-early2"])])  # fmt: skip
def test_a_change_in_config_causal_or_scale_is_planned_anew(fake, kw):
    t, lse2, delta = _io()
    _go(t, lse2, delta)
    _go(t, lse2, delta, **kw)
    _go(t, lse2, delta, **kw)
    assert len(fake.jit) == 4 and len(fake.bound) == 1


def test_plans_are_bounded_least_recently_used_first(fake, monkeypatch):
    monkeypatch.setattr(flash_gluon_bwd_plan, "MAX_PLANS", 2)
    ios = [_io() for _ in range(3)]
    for t, lse2, delta in ios:
        _go(t, lse2, delta)
    assert len(flash_gluon_bwd_plan._PLANS) == 2
    _go(*ios[0])  # the oldest was dropped: planned anew
    assert len(fake.jit) == 8 and not fake.bound
    _go(*ios[2])
    assert len(fake.bound) == 1


def test_disabled_plans_launch_through_the_jit_every_call(fake, monkeypatch):
    monkeypatch.setattr(flash_gluon_bwd_plan, "plannable", _real_plannable)
    monkeypatch.setattr(flash_gluon_bwd_plan, "ENABLED", False)
    t, lse2, delta = _io()
    for _ in range(2):
        _go(t, lse2, delta)
    assert len(fake.jit) == 4 and not fake.bound
    assert "disabled" in flash_gluon_bwd_plan.last_reason
    monkeypatch.setattr(flash_gluon_bwd_plan, "ENABLED", True)
    monkeypatch.setenv("FA_BENCH_GLUON_BWD_PLAN", "0")
    assert "disabled" in _real_plannable((_cuda_like(t[0]), *t[1:]), lse2)
    monkeypatch.setenv("FA_BENCH_GLUON_BWD_PLAN", "1")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert _real_plannable((_cuda_like(t[0]), *t[1:]), lse2) == ""


def test_the_heuristic_takes_the_alternating_dq_and_causal_head_groups(monkeypatch):
    monkeypatch.delenv("FA_BENCH_GLUON_BWD_ROLE", raising=False)
    assert gluon_bwd_config(64).label() == "gluon-bwd-m128-n128-s2-dss-alt-perm"
    assert gluon_bwd_config(64, True).label() == "gluon-bwd-m128-n128-s2-dss-alt-perm-grp"
    assert gluon_bwd_config(128).label() == "gluon-bwd-m64-n128-s2-rot-dss-alt-perm"
    assert gluon_bwd_config(128, True).label() == "gluon-bwd-m64-n128-s2-dss-alt-perm-grp"


def _cuda_like(t):
    return SimpleNamespace(device=SimpleNamespace(type="cuda"), shape=t.shape)


def test_what_is_not_planned(monkeypatch):
    t, lse2, _ = _io()
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert "CPU" in _real_plannable(tuple(t), lse2)  # CPU tensors
    cuda = (_cuda_like(t[0]), *t[1:])
    assert _real_plannable(cuda, lse2) == ""
    # seq_q not a multiple of 4: the rows are padded copies made between the launches
    assert "seq_q=63" in _real_plannable(cuda, lse2[..., :63].contiguous())
    assert "padded" in _real_plannable(cuda, lse2.mT.contiguous().mT)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert "interpreter" in _real_plannable(cuda, lse2)


def _same_launch(a, b):
    """Two calls() equal but for the bases: descriptors field by field, pointers by
    address, the rest by value."""
    for (fa, ga, aa, ka), (fb, gb, ab, kb) in zip(a, b, strict=True):
        assert (fa, ga, sorted(ka)) == (fb, gb, sorted(kb)) and len(aa) == len(ab)
        pairs = [*zip(aa, ab, strict=True), *((ka[n], kb[n]) for n in ka)]
        for x, y in pairs:
            if hasattr(x, "block_shape"):
                assert (x.shape, x.strides, x.block_shape, x.layout) == (
                    y.shape, y.strides, y.block_shape, y.layout)  # fmt: skip
                assert x.base.data_ptr() == y.base.data_ptr() and y.base is not x.base
            elif isinstance(x, torch.Tensor):
                assert x.data_ptr() == y.data_ptr() and isinstance(y, _Ptr)
            else:
                assert x == y and type(x) is type(y)


def test_each_launch_is_built_after_the_one_before_is_queued(monkeypatch):
    # seq_q 61: the Gluon kernel's descriptors read padded copies of lse2 and delta
    # (tma_rows); made before the preprocessing kernel is queued, the delta copy would
    # hold the buffer's old contents (session 9 call 3 on the H200: dK off at seq 1001)
    events = []

    class Kernel:
        def __init__(self, i):
            self.i = i

        def __getitem__(self, grid):
            return lambda *a, **kw: events.append(f"launch {self.i}") or "compiled"

    def steps(*args, **kwargs):
        def make(i):
            return lambda: events.append(f"build {i}") or (Kernel(i), (1,), (), {})

        return [make(i) for i in (1, 2)]

    monkeypatch.setattr(flash_gluon_bwd_plan, "steps", steps)

    def pre_call(*args):
        return events.append("build 0") or (Kernel(0), (1,), (), {})

    monkeypatch.setattr(flash_gluon_bwd_plan, "pre_call", pre_call)
    t, lse2, delta = _io(shape=(1, 2, 61, 128))
    flash_gluon_bwd_plan.launch_pre(t[3], t[4], delta, t[8])
    _go(t, lse2, delta)
    assert events == ["build 0", "launch 0", "build 1", "launch 1", "build 2", "launch 2"]
    assert flash_gluon_bwd_plan.last_reason  # launched through the JIT, not planned
    assert flash_gluon_bwd_plan.last_pre_reason


def test_the_preprocessing_launch_has_its_own_plan(monkeypatch):
    """launch_pre replays its bound launch for the same (o, do, delta, dq_ws) and plans
    anew when any of them changes; nothing of the other plan is touched."""
    jit, bound = [], []

    class Kernel:
        def __getitem__(self, grid):
            return lambda *a, **kw: jit.append(1) or "compiled"

    monkeypatch.setattr(flash_gluon_bwd_plan, "pre_call", lambda *a: (Kernel(), (1,), (), {}))
    monkeypatch.setattr(flash_gluon_bwd_plan, "_bind_pre",
                        lambda *a: ((lambda: bound.append(1)), ""))  # fmt: skip
    monkeypatch.setattr(flash_gluon_bwd_plan, "plannable", lambda tensors, lse2: "")
    monkeypatch.setattr(flash_gluon_bwd_plan, "_PRE_PLANS", type(flash_gluon_bwd_plan._PLANS)())
    t, _, delta = _io()
    o, do, ws = t[3], t[4], t[8]
    for _ in range(3):
        flash_gluon_bwd_plan.launch_pre(o, do, delta, ws)
    assert (len(jit), len(bound)) == (1, 2)
    for args in ((o.clone(), do, delta, ws), (o, do[..., :64], delta, ws),
                 (o, do, delta.clone(), ws), (o, do, delta, ws.clone())):  # fmt: skip
        flash_gluon_bwd_plan.launch_pre(*args)
    assert (len(jit), len(bound)) == (5, 2)


def test_the_preprocessing_kernel_zeroes_the_workspace():
    """delta = rowsum(dO ∘ O) as without the workspace, and every row of the (NaN-filled)
    fp32 workspace zeroed, the last block's tail rows included (the interpreter)."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("runs the tl kernel in the interpreter")
    import importlib

    # the module (fa_bench.kernels exports the function under the same name)
    fa = importlib.import_module("fa_bench.kernels.flash_attention")
    for seq in (64, 100):
        t, _, delta = _io(shape=(2, 3, seq, 64), heads_kv=3, dtype=torch.float32)
        o, do, ws = t[3], t[4], t[8].fill_(float("nan"))
        fn, grid, args, kw = flash_gluon_bwd_plan.pre_call(o, do, delta, ws)
        fn[grid](*args, **kw)
        assert not bool(ws.ne(0).any())
        want = fa._preprocess(do, o, delta)
        torch.testing.assert_close(delta, want, rtol=0, atol=0)
        torch.testing.assert_close(delta, (o * do).sum(-1), rtol=1e-5, atol=1e-5)


def test_a_bound_preprocessing_replay_must_write_delta_and_zero_the_workspace():
    t, _, delta = _io(shape=(1, 1, 8, 64), heads_kv=1)
    ws = t[8]
    delta.copy_(torch.randn(delta.shape))
    want = delta.clone()

    def check(bound):
        delta.copy_(want)
        ws.zero_()
        return flash_gluon_bwd_plan.pre_reproduces(bound, delta, ws)

    assert check(lambda: (delta.copy_(want), ws.zero_()))
    assert not check(lambda: delta.copy_(want))  # the workspace left as NaN
    assert torch.equal(delta, want) and not ws.any()  # left holding the JIT's results
    assert not check(lambda: (delta.copy_(want + 1e-6), ws.zero_()))
    assert not check(lambda: None)


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_the_calls_of_the_stand_ins_are_the_tensors_but_for_the_bases(head_dim, causal):
    pytest.importorskip("triton.experimental.gluon")
    t, lse2, delta = _io(shape=(2, 4, 200, head_dim), heads_kv=1)
    ptrs = tuple(_Ptr(x) for x in t)
    for cfg in candidate_bwd_configs(head_dim).values():
        a = flash_gluon_bwd_plan.calls(cfg, tuple(t), lse2, delta, causal, 0.1)
        b = flash_gluon_bwd_plan.calls(cfg, ptrs, _Ptr(lse2), _Ptr(delta), causal, 0.1)
        _same_launch(a, b)
        # pre, the kernel (its dense arguments, then the variant's six), dQ's cast
        assert [len(x[2]) for x in a] == [11, 21, 8]


def test_the_kernel_call_is_the_one_the_tools_launch():
    """_launch (the tools' kernel-alone timing) builds its launch with main_call."""
    pytest.importorskip("triton.experimental.gluon")
    t, lse2, delta = _io()
    q, k, v, _, do, dk, dv, _, dq_ws = t
    _, grid, args, kw = flash_gluon_bwd_plan.main_call(
        CFG, (q, k, v, do, dk, dv, dq_ws), lse2, delta, False, 0.1, probe=2)  # fmt: skip
    assert kw["DQ_MODE"] == 2 and grid == (1, 1, 2) and kw["VAR"] == 0
    assert args[-8:-6] == (0.1 * 1.4426950408889634, 0.1)
    seen = []

    class Kernel:
        def __getitem__(self, g):
            return lambda *a, **k: seen.append((g, a, k))

    import fa_bench.kernels.flash_gluon_bwd_kernels as kernels

    real = kernels._bwd_ws
    kernels._bwd_ws = Kernel()
    try:
        flash_gluon_bwd._launch(CFG, (q, k, v, do, dk, dv, dq_ws), lse2, delta, False, 0.1)
    finally:
        kernels._bwd_ws = real
    assert seen[0][0] == (1, 1, 2) and seen[0][2]["DQ_MODE"] == CFG.dq_mode


def _writer(outs, values, ws_extra=0.0):
    """A stand-in for the bound launches: writes `values` into (delta, dk, dv, dq) and
    adds into dq_ws."""

    def bound():
        for t, v in zip(outs[:4], values[:4], strict=True):
            t.copy_(v)
        outs[4].add_(values[4] + ws_extra)

    return bound


def test_a_bound_replay_is_kept_only_if_it_reproduces_the_jit_launches():
    t, _, delta = _io(shape=(1, 1, 8, 64), heads_kv=1)
    dk, dv, dq, dq_ws = t[5], t[6], t[7], t[8]
    outs = (delta, dk, dv, dq, dq_ws)
    for x in outs:
        x.copy_(torch.randn(x.shape))
    jit = [x.clone() for x in outs]

    def check(bound):
        for x, w in zip(outs, jit, strict=True):  # the JIT launches' results
            x.copy_(w)
        return flash_gluon_bwd_plan.reproduces((bound,), tuple(t))

    assert check(_writer(outs, jit))
    # the reduce-adds' order: dQ within 1e-3 of its largest value passes, more does not
    peak = float(jit[4].abs().max())
    assert check(_writer(outs, jit, 1e-4 * peak))
    assert not check(_writer(outs, jit, 1e-2 * peak))
    off = [x.clone() for x in jit]
    off[1].view(torch.int16)[0, 0, 0, 0] += 1  # dK one bit off
    assert not check(_writer(outs, off))
    for x, w in zip(outs, jit, strict=True):  # left holding the JIT launches' results
        assert torch.equal(x, w)
    assert not check(lambda: None)  # writes nothing

    def raising():
        raise RuntimeError("another triton")

    assert not check(raising)
    assert all(torch.equal(x, w) for x, w in zip(outs, jit, strict=True))


def test_the_replay_check_allows_dq_one_rounding_of_its_dtype():
    """The reduce-adds' order can round a bf16 dQ element near the peak the other way: one
    bf16 unit (2^-7 of the peak) passes, where 1e-3 alone failed a correct launch on the
    H200 (session 11); four units do not, nor does an fp16 dQ one bf16 unit off."""
    for dtype, steps, ok in ((torch.bfloat16, 1, True), (torch.bfloat16, 4, False),
                             (torch.float16, 8, False), (torch.float16, 1, True)):  # fmt: skip
        t, _, delta = _io(shape=(1, 1, 8, 64), heads_kv=1, dtype=dtype)
        outs = (delta, t[5], t[6], t[7], t[8])
        for x in outs:
            x.copy_(torch.randn(x.shape))
        jit = [x.clone() for x in outs]
        off = [x.clone() for x in jit]
        at = int(jit[3].float().abs().argmax())
        off[3].view(-1).view(torch.int16)[at] += steps  # `steps` units in the last place
        got = flash_gluon_bwd_plan.reproduces((_writer(outs, off),), tuple(t))
        assert got is ok, (dtype, steps)


def test_gluon_backward_launches_the_plan_with_its_tensors(monkeypatch):
    """checked=True skips gluon_bwd_reason (the dispatch has asked it); the preprocessing
    launch comes first, with o, do, delta and the fp32 workspace, before the gradients
    exist; the plan then gets q, k, v, o, do, the gradients, that workspace, lse2 and
    delta."""
    seen = []
    monkeypatch.setattr(flash_gluon_bwd_plan, "launch", lambda *a: seen.append(a))
    monkeypatch.setattr(flash_gluon_bwd_plan, "launch_pre", lambda *a: seen.append(a))
    q, k, v, o, do = (torch.randn(1, 2, 64, 128, dtype=torch.float16) for _ in range(5))
    lse2 = torch.randn(1, 2, 64)
    dq, dk, dv = flash_gluon_bwd.gluon_backward(do, q, k, v, o, lse2, False, 0.1, checked=True)
    (po, pdo, pdelta, pws), (cfg, tensors, lse, delta, causal, scale, variant) = seen
    assert variant is None
    assert po is o and pdo is do and pdelta is delta and pws is tensors[8]
    assert tensors[:5] == (q, k, v, o, do) and tensors[5:8] == (dk, dv, dq)
    assert tensors[8].dtype == torch.float32 and tensors[8].shape == q.shape
    assert lse is lse2 and delta.shape == lse2.shape and (causal, scale) == (False, 0.1)
    # delta in the workspace's allocation, after it (one large block: a stable address)
    ws = tensors[8]
    assert delta.untyped_storage().data_ptr() == ws.untyped_storage().data_ptr()
    assert delta.data_ptr() == ws.data_ptr() + ws.numel() * 4 and delta.is_contiguous()
    assert cfg == gluon_bwd_config(128)
    with pytest.raises(ValueError, match="gluon_backward cannot run these inputs"):
        flash_gluon_bwd.gluon_backward(do, q, k, v, o, lse2, False, 0.1)


# --- on the H200 ------------------------------------------------------------------------

needs_sm90 = pytest.mark.skipif(
    not torch.cuda.is_available()
    or os.environ.get("TRITON_INTERPRET") == "1"
    or torch.cuda.get_device_capability() != (9, 0),
    reason="needs an sm_90 GPU",
)


def _gpu_inputs(dtype, head_dim, causal, seq=1024, heads=(4, 2), seed=0):
    from fa_bench.kernels.flash_attention import _forward
    from fa_bench.kernels.flash_config import FlashConfig

    g = torch.Generator(device="cuda").manual_seed(seed)
    q, _, do = (torch.randn(2, heads[0], seq, head_dim, device="cuda", dtype=dtype, generator=g)
                 for _ in range(3))  # fmt: skip
    k, v = (torch.randn(2, heads[1], seq, head_dim, device="cuda", dtype=dtype, generator=g)
            for _ in range(2))  # fmt: skip
    o, lse2 = _forward(q, k, v, causal, head_dim**-0.5, FlashConfig(), None)
    return q, k, v, o, do, lse2


def _unplanned(q, k, v, o, do, lse2, causal, cfg):
    flash_gluon_bwd_plan.ENABLED = False
    try:
        return flash_gluon_bwd.gluon_backward(do, q, k, v, o, lse2, causal, q.shape[-1] ** -0.5,
                                              cfg)  # fmt: skip
    finally:
        flash_gluon_bwd_plan.ENABLED = True


def _agree(planned, unplanned):
    dq, dk, dv = planned
    rq, rk, rv = unplanned
    assert torch.equal(dk, rk) and torch.equal(dv, rv)  # no atomics: bit for bit
    err = float((dq.float() - rq.float()).abs().max())
    assert err <= 1e-2 * float(rq.float().abs().max()), err  # the reduce-adds' order


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_gpu_planned_gradients_are_the_unplanned(dtype, causal, head_dim):
    flash_gluon_bwd_plan.clear()
    q, k, v, o, do, lse2 = _gpu_inputs(dtype, head_dim, causal)
    cfg = gluon_bwd_config(head_dim, causal)
    want = _unplanned(q, k, v, o, do, lse2, causal, cfg)
    hits = flash_gluon_bwd_plan.hits
    first = flash_gluon_bwd.gluon_backward(do, q, k, v, o, lse2, causal, head_dim**-0.5, cfg)
    assert flash_gluon_bwd_plan.last_reason == "" and flash_gluon_bwd_plan._PLANS
    _agree(first, want)
    del first  # the next calls' gradients at the freed addresses: the plan replays
    for _ in range(2):  # (the first call's check allocated clones: steady from the next)
        again = flash_gluon_bwd.gluon_backward(do, q, k, v, o, lse2, causal, head_dim**-0.5,
                                               cfg)  # fmt: skip
        _agree(again, want)
        del again
    assert flash_gluon_bwd_plan.hits >= hits + 1


@pytest.mark.gpu
@needs_sm90
def test_gpu_a_refilled_buffer_gives_the_new_gradients():
    flash_gluon_bwd_plan.clear()
    q, k, v, o, do, lse2 = _gpu_inputs(torch.bfloat16, 128, False)
    scale = 128**-0.5
    flash_gluon_bwd.gluon_backward(do, q, k, v, o, lse2, False, scale)
    flash_gluon_bwd.gluon_backward(do, q, k, v, o, lse2, False, scale)  # steady addresses
    do.copy_(torch.randn_like(do))  # refilled in place: the same key
    hits = flash_gluon_bwd_plan.hits
    got = flash_gluon_bwd.gluon_backward(do, q, k, v, o, lse2, False, scale)
    assert flash_gluon_bwd_plan.hits == hits + 1
    _agree(got, _unplanned(q, k, v, o, do, lse2, False, gluon_bwd_config(128)))


@pytest.mark.gpu
@needs_sm90
def test_gpu_unplannable_rows_still_right_and_flash_attention_takes_the_plan():
    from fa_bench.kernels.flash_attention import flash_attention
    from fa_bench.kernels.flash_config import FlashConfig

    flash_gluon_bwd_plan.clear()
    q, k, v, o, do, lse2 = _gpu_inputs(torch.bfloat16, 64, True, seq=1001)  # seq % 4 != 0
    got = flash_gluon_bwd.gluon_backward(do, q, k, v, o, lse2, True, 64**-0.5)
    assert "seq_q=1001" in flash_gluon_bwd_plan.last_reason and not flash_gluon_bwd_plan._PLANS
    _agree(got, _unplanned(q, k, v, o, do, lse2, True, gluon_bwd_config(64, True)))
    # through autograd (triton-onepass's call): planned, then replayed
    qg, kg, vg = (t.detach().requires_grad_(True) for t in _gpu_inputs(torch.bfloat16, 128,
                                                                        False)[:3])  # fmt: skip
    out = flash_attention(qg, kg, vg, config=FlashConfig(backward="gluon"), deterministic=False)
    grad = torch.randn_like(out)
    out.backward(grad, retain_graph=True)
    first = (qg.grad, kg.grad, vg.grad)
    hits = flash_gluon_bwd_plan.hits
    for _ in range(2):  # as fa-bench run times it: grads reset, the backward replayed
        qg.grad = kg.grad = vg.grad = None
        out.backward(grad, retain_graph=True)
        _agree((qg.grad, kg.grad, vg.grad), first)
    assert flash_gluon_bwd_plan.hits >= hits + 1


# --- tools/gpu/gluon_bwd_host.py's plumbing, on a CPU --------------------------------------


def test_host_tool_rows_and_table(monkeypatch, tmp_path, capsys):
    """The A/B's loop, rows and table with the GPU stood in for: each label's role and
    plan switch reach the call it measures, a failing row is named, the rest go on."""
    import json
    import sys

    from gluon_bwd_helpers import tool as load

    tool = load("gluon_bwd_host")
    seen = []

    class Impl:
        backward_reruns = True

        def __init__(self, name):
            self.name = name

        def prepare(self, case, q, k, v, options=None):
            seen.append((case.impl, os.environ.get(tool.ROLE_ENV), flash_gluon_bwd_plan.ENABLED))
            if case.head_dim == 64 and os.environ.get(tool.ROLE_ENV) == "ws-s6":
                raise RuntimeError("no such launch")
            return SimpleNamespace(fn=lambda q, k, v: (q * 2).sum(-1, keepdim=True) * v,
                                   backend=f"{case.impl}:x")  # fmt: skip

    small = lambda case, dev: tuple(torch.randn(1, 2, 8, 4) for _ in range(4))  # noqa: E731
    monkeypatch.setattr(tool, "make_inputs", small)
    monkeypatch.setattr(tool.registry, "load", lambda *a, **k: None)
    monkeypatch.setattr(tool.registry, "get", Impl)
    monkeypatch.setattr(tool.torch.cuda, "_sleep", lambda n: None)
    monkeypatch.setattr(tool.torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(tool, "profile", lambda case, *t: f"profile of {case.impl}")
    argv = ["x", "--dims", "128,64", "--seqlens", "4096", "--causal", "no",
            "--roles64", "ws-pss-early,ws-s6", "--max-time", "0.01", "--warmup-ms", "1",
            "--out", str(tmp_path), "--device", "cpu"]  # fmt: skip
    monkeypatch.setattr(sys, "argv", argv)
    tool.main()
    assert seen == [("triton-onepass", "", True), ("triton-onepass", "", False),
                    ("sdpa-cudnn", "", True), ("triton-onepass", "ws-pss-early", True),
                    ("triton-onepass", "ws-s6", True), ("triton-onepass", "ws-pss-early", False),
                    ("sdpa-cudnn", "", True)]  # fmt: skip
    rows = [json.loads(x) for x in (tmp_path / "gluon_bwd_host.jsonl").read_text().splitlines()]
    assert [r["label"] for r in rows] == ["planned", "unplanned", "sdpa-cudnn",
                                          "planned ws-pss-early", "planned ws-s6",
                                          "unplanned ws-pss-early", "sdpa-cudnn"]  # fmt: skip
    assert "no such launch" in rows[4]["error"] and rows[3]["tflops"] > 0
    table = capsys.readouterr().out
    assert "| 64 | 4k | no | planned ws-s6 | RuntimeError: no such launch |" in table
    assert "| 128 | 4k | no | sdpa-cudnn |" in table
    # the first shape's two triton-onepass rows profiled
    assert (tmp_path / "host_prof.txt").read_text().count("profile of triton-onepass") == 2
    assert flash_gluon_bwd_plan.ENABLED and tool.ROLE_ENV not in os.environ


def test_host_tool_pick_plans_unless_unplanned_measured_faster():
    from gluon_bwd_helpers import tool

    pick = tool("gluon_bwd_host").pick

    def rows(planned, unplanned):
        return [dict(label="planned", head_dim=128, n=16384, causal=False, median_ms=planned),
                dict(label="unplanned", head_dim=128, n=16384, causal=False,
                     median_ms=unplanned),
                dict(label="sdpa-cudnn", head_dim=128, n=16384, causal=False, median_ms=1.0),
                dict(label="planned x", head_dim=64, n=4096, causal=False, error="x")]  # fmt: skip

    assert pick(rows(10.0, 11.0)) == "1" and pick(rows(10.05, 10.0)) == "1"
    assert pick(rows(10.2, 10.0)) == "0"
    assert pick([]) == "1"  # nothing measured: the default
