"""The Gluon forward's planned launches: a launch is described once per (q, k, v, o, lse2
addresses, shapes, strides and dtypes, config, causal, scale, device) and replayed while
the tensors are the same; anything else is planned anew.

Why: a short forward spent ~200 µs of host per call on the H200 against cuDNN's ~20
(tools/gpu/host_cost.py, session 6), so below ~2k tokens the benchmark timed the host.
Half of it was triton's per-launch binding and specialisation of the JIT call, a quarter
the four TMA descriptors rebuilt every call. A plan, like the decode kernel's
(kernels/decode_plan.py), calls triton's compiled kernel directly with the arguments the
JIT launch bound (kernels/bound_launch.py), the descriptors made once.

A plan holds no tensor: its descriptors' bases and the lse2 argument are `_Ptr`s, the
address, shape, strides and dtype of the tensor they stand for, which is all a descriptor
encodes and all the launcher reads. So a plan is valid for any tensor with the same key:
a new tensor at a freed one's address (the caching allocator hands `empty_like` the same
block call after call) or a buffer refilled in place. The key is all a launch depends on
but the stream, which is read at each launch.

The first time a compiled kernel is bound, the bound launch is run once more into the same
output and kept only if it reproduces the JIT launch bit for bit (else, and in the
interpreter or off CUDA, every call goes through the JIT as before); the output is
restored if not. Plans are kept least recently used first, at most MAX_PLANS.
"""

from __future__ import annotations

import functools
import os
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from fa_bench.kernels import device_props
from fa_bench.kernels.bound_launch import recall, remember

if TYPE_CHECKING:
    import torch

# the config is a flash_gluon.GluonConfig (not imported: flash_gluon imports this module)
GluonConfig = Any

MAX_PLANS = 32
# False: every launch through triton's JIT with fresh descriptors, as before plans (the
# "before" of tools/gpu/host_cost.py's A/B)
ENABLED = True
# plan key -> the bound launch (a callable taking no argument)
_PLANS: OrderedDict[tuple, Any] = OrderedDict()
# compiled kernel -> whether its bound launch reproduced the JIT launch
_VERIFIED: dict[Any, bool] = {}
# why the last miss made no plan ("" when it made one), and the replays so far: for tests
# and tools (tools/gpu/host_cost.py)
last_reason = ""
hits = 0


class _Ptr:
    """A tensor's address and layout without the tensor: what triton's launcher reads of
    a pointer argument (data_ptr) and a descriptor of its base (data_ptr, dtype), and what
    `_descriptor` reads (shape, stride(), dtype)."""

    __slots__ = ("_ptr", "_stride", "dtype", "shape")

    def __init__(self, t: torch.Tensor) -> None:
        self._ptr, self.dtype = t.data_ptr(), t.dtype
        self.shape, self._stride = t.shape, t.stride()

    def data_ptr(self) -> int:
        return self._ptr

    def stride(self) -> tuple[int, ...]:
        return self._stride


def _sig(t: torch.Tensor) -> tuple:
    return (t.data_ptr(), t.shape, t.stride(), t.dtype)


def plan_key(cfg: GluonConfig, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             o: torch.Tensor, lse2: torch.Tensor, causal: bool,
             qk_scale: float) -> tuple:  # fmt: skip
    """Everything a launch depends on but the stream."""
    return (cfg, causal, qk_scale, q.device, _sig(q), _sig(k), _sig(v), _sig(o), _sig(lse2))


def launch(cfg: GluonConfig, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
           o: torch.Tensor, lse2: torch.Tensor, causal: bool, qk_scale: float) -> None:  # fmt: skip
    """One forward launch into o and lse2: the plan's if there is one, else through
    triton's JIT, then planned for the next call with the same key."""
    global last_reason, hits
    key = plan_key(cfg, q, k, v, o, lse2, causal, qk_scale) if ENABLED else None
    bound = None if key is None else recall(_PLANS, key)
    if bound is not None:
        hits += 1
        bound()
        return
    tensors = (q, k, v, o)
    sms = device_props.sm_count(q.device)
    fn, grid, args, kwargs = call(cfg, tensors, lse2, causal, qk_scale, sms)
    compiled = fn[grid](*args, **kwargs)
    if key is None:
        return
    bound, last_reason = _bind(cfg, fn, compiled, tensors, lse2, causal, qk_scale)
    if bound is not None:
        remember(_PLANS, key, bound, MAX_PLANS)


def clear() -> None:
    """Forget every plan and verification (tests; a process that frees its kernels)."""
    _PLANS.clear()
    _VERIFIED.clear()


def call(cfg: GluonConfig, tensors: tuple, lse2: Any, causal: bool, qk_scale: float,
         sms: int) -> tuple[Any, tuple, tuple, dict]:  # fmt: skip
    """The config's kernel launch for q, k, v, o (tensors or `_Ptr`s) and lse2: (jit
    function, grid, args, keywords)."""
    from fa_bench.kernels import flash_gluon_kernels, flash_gluon_persist, flash_gluon_ws

    q, k, v, o = tensors
    batch, heads_q, seq_q, head_dim = q.shape
    heads_kv, seq_k = k.shape[1], k.shape[2]
    q_desc, o_desc = _descriptor(q, cfg.block_m), _descriptor(o, cfg.block_m)
    k_desc, v_desc = _descriptor(k, cfg.block_n), _descriptor(v, cfg.block_n)
    args = (q_desc, k_desc, v_desc, o_desc, lse2, heads_q, heads_q // heads_kv, seq_q, seq_k,
            qk_scale)  # fmt: skip
    common = dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, HEAD_DIM=head_dim,
                  STAGES=cfg.stages, CAUSAL=causal)  # fmt: skip
    tiles = -(-seq_q // cfg.rows_per_cta)
    if cfg.variant == "pipelined":
        kernel = flash_gluon_kernels._fwd_pipelined
        kw = dict(NUM_WARPS=cfg.num_warps, num_warps=cfg.num_warps, SOFTMAX=cfg.softmax_code())
        return kernel, (tiles, batch * heads_q), args, {**common, **kw}
    ws = dict(NUM_WARPS=4, PINGPONG=cfg.pingpong, PRODUCER_REGS=cfg.producer_regs,
              CONSUMER_REGS=cfg.consumer_regs, num_warps=4, SOFTMAX=cfg.softmax_code())  # fmt: skip
    if cfg.persistent:
        grid = (min(sms, tiles * batch * heads_q),)
        kw = {**common, **ws, "Q_BUFFERS": cfg.q_buffers}
        return flash_gluon_persist._fwd_ws_persistent, grid, (*args, batch * heads_q), kw
    kw = {**common, **ws, "CONSUMERS": cfg.consumers}
    return flash_gluon_ws._fwd_ws, (tiles, batch * heads_q), args, kw


def _bind(cfg: GluonConfig, fn: Any, compiled: Any, tensors: tuple, lse2: torch.Tensor,
          causal: bool, qk_scale: float) -> tuple[Any, str]:  # fmt: skip
    """The bound launch of `compiled` for these tensors' key, or (None, why not)."""
    import torch

    from fa_bench.kernels.bound_launch import Bound, jit_values

    q = tensors[0]
    if os.environ.get("TRITON_INTERPRET") == "1" or q.device.type != "cuda":
        return None, "the interpreter and the CPU launch through triton's JIT"
    compiled = compiled.result() if hasattr(compiled, "result") else compiled
    if not hasattr(compiled, "run") or not hasattr(compiled, "function"):
        return None, f"no compiled kernel to bind for {getattr(fn, '__name__', fn)}"
    if _VERIFIED.get(compiled) is False:  # checked once already: not another try per call
        return None, "the bound launch did not reproduce the JIT launch"
    if compiled not in _VERIFIED and torch.cuda.is_current_stream_capturing():
        return None, "a CUDA graph is being captured: the check waits for a plain call"
    ptrs = tuple(_Ptr(t) for t in tensors)
    sms = device_props.sm_count(q.device)
    _, grid, args, kwargs = call(cfg, ptrs, _Ptr(lse2), causal, qk_scale, sms)
    values = jit_values(fn, args, kwargs)
    if values is None:
        return None, f"an argument of {getattr(fn, '__name__', fn)} not given"
    bound = Bound(compiled, grid, values, q.device.index or 0)
    if compiled not in _VERIFIED:
        _VERIFIED[compiled] = _reproduces(bound, tensors[3], lse2)
    if not _VERIFIED[compiled]:
        return None, "the bound launch did not reproduce the JIT launch"
    return bound, ""


def _reproduces(bound: Any, o: torch.Tensor, lse2: torch.Tensor) -> bool:
    """Whether the bound launch writes what the JIT launch just wrote into o and lse2
    (which are left holding the JIT launch's result either way)."""
    import torch

    want_o, want_lse = o.clone(), lse2.clone()
    o.fill_(float("nan"))  # so that a launch writing nothing cannot pass
    lse2.fill_(float("nan"))
    try:
        bound()
        # bit for bit (NaN included): the integers of the same width
        same = torch.equal(o.view(torch.int16), want_o.view(torch.int16)) and torch.equal(
            lse2.view(torch.int32), want_lse.view(torch.int32)
        )
    except Exception:  # another triton's internals: stay on the JIT path
        same = False
    if not same:
        o.copy_(want_o)
        lse2.copy_(want_lse)
    return same


def _descriptor(t: torch.Tensor, rows: int) -> Any:
    """A 4-D TMA descriptor over (B, H, S, D) with a [1, 1, rows, D] box: bounds per head."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    block = [1, 1, rows, t.shape[3]]
    layout = _shared_layout(rows, t.shape[3], t.dtype)
    return TensorDescriptor(t, list(t.shape), list(t.stride()), block, layout)


@functools.cache
def _shared_layout(rows: int, head_dim: int, dtype: torch.dtype) -> Any:
    """The box's shared-memory layout. Cached: every forward builds four descriptors, and
    building the layout was a third of their host time (the H200's cProfile,
    tools/gpu/host_cost.py), where a 1k forward's whole call is ~200 µs of host."""
    import torch
    from triton.experimental.gluon import language as gl

    gl_dtype = gl.bfloat16 if dtype == torch.bfloat16 else gl.float16
    return gl.NVMMASharedLayout.get_default_for([1, 1, rows, head_dim], gl_dtype)
