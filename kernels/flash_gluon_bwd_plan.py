"""The Gluon backward's planned launches (issue 18, sessions 8 and 13): its three
launches (delta = rowsum(dO ∘ O) with the dQ workspace zeroed, the Gluon kernel, dQ's
cast) described once per key (every tensor's address, shape, strides and dtype; the
config, causal, the scale, the device) and replayed as bound launches of the compiled
kernels (kernels/bound_launch.py): the TMA descriptors made and encoded once, no binding,
no specialisation.

Why: `fa-bench run` times each call between CUDA events recorded around the call, and
when a call is the first of a batch (every call at 16k non-causal, where one call is
over half the 20 ms batch), the GPU waits for the host from the start event to the first
kernel that keeps it busy. On the H200 (session 8 call 0) the first call of each batch
took ~1 ms more than the rest for our backward and ~0.4 ms more for cuDNN's, which put
the 16k non-causal rows 7% below the kernel's do_bench (cuDNN's 2%). A short Gluon
forward's host was ~200 µs for four descriptors and one launch (tools/gpu/host_cost.py);
the backward builds twelve and makes three launches. So the first launch
(`launch_pre`, its own plan keyed by o, do, delta and the workspace) is queued as soon
as its tensors exist, and the GPU runs it while the host builds the other two
(`launch`, keyed by everything).

As kernels/flash_gluon_plan.py (the forward's): a plan holds no tensor (the descriptors'
bases and the pointer arguments are `_Ptr` stand-ins), so it serves any tensors with the
same key, such as the next call's gradients and workspaces at the freed ones' addresses.
The first bound replay of each compiled kernel (or kernel pair) is checked against the
JIT launch (delta, dK and dV bit for bit, the workspace all zeros after the first;
dQ, whose fp32 reduce-adds land in any order, within 1e-3 of its largest value), else
those kernels stay on the JIT path. Planned only where the lse2/delta rows are views
(seq_q a multiple of 4: else they are padded copies made after the preprocessing kernel
is queued, see flash_gluon_bwd_desc.tma_rows).
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fa_bench.kernels import device_props
from fa_bench.kernels.bound_launch import recall, remember
from fa_bench.kernels.bound_launch import signature as _sig
from fa_bench.kernels.flash_gluon_bwd_config import GluonBwdConfig
from fa_bench.kernels.flash_gluon_bwd_order import causal_head_group
from fa_bench.kernels.flash_gluon_bwd_varhost import (
    dq_scale,
    stand_in,
    variant_args,
    variant_bits,
    variant_key,
)

if TYPE_CHECKING:
    import torch

MAX_PLANS = 32
# False: every launch through triton's JIT with fresh descriptors (the "unplanned" side
# of tools/gpu/gluon_bwd_host.py's A/B)
ENABLED = True
# "0": the same from the environment (tools/gpu's scripts, a `fa-bench run` without plans)
PLAN_ENV = "FA_BENCH_GLUON_BWD_PLAN"
_LOG2E = 1.4426950408889634
# rows per program of the tl pre/postprocessing kernels (as flash_gluon_bwd's)
_ROWS = 64
_PLANS: OrderedDict[tuple, tuple] = OrderedDict()
# launch_pre's plans: the preprocessing kernel alone, by (o, do, delta, dq_ws)
_PRE_PLANS: OrderedDict[tuple, Any] = OrderedDict()
# the compiled (main, post) kernels, or the preprocessing kernel -> whether their bound
# launches reproduced the JIT's
_VERIFIED: dict[Any, bool] = {}
# why the last miss made no plan ("" when it made one), and the replays so far
last_reason = ""
last_pre_reason = ""
_NOT_REPRODUCED = "the bound launches did not reproduce the JIT launches"
hits = 0

# (q, k, v, o, do, dk, dv, dq, dq_ws): the tensors of one backward, in this order
NAMES = ("q", "k", "v", "o", "do", "dk", "dv", "dq", "dq_ws")


def plan_key(cfg: GluonBwdConfig, tensors: tuple, lse2: Any, delta: Any, causal: bool,
             scale: float, variant: Any = None) -> tuple:  # fmt: skip
    """Everything the three launches depend on but the stream."""
    return (cfg, causal, scale, tensors[0].device, *(_sig(t) for t in (*tensors, lse2, delta)),
            *variant_key(variant))  # fmt: skip


def plannable(tensors: tuple, lse2: Any) -> str:
    """Why these tensors are not planned ("" when they are)."""
    if not ENABLED or os.environ.get(PLAN_ENV, "").strip() == "0":
        return f"planned launches disabled (flash_gluon_bwd_plan.ENABLED, ${PLAN_ENV}=0)"
    if os.environ.get("TRITON_INTERPRET") == "1" or tensors[0].device.type != "cuda":
        return "the interpreter and the CPU launch through triton's JIT"
    if lse2.shape[-1] % 4 or not lse2.is_contiguous():
        return f"seq_q={lse2.shape[-1]}: the lse2/delta rows are padded copies (TMA strides)"
    return ""


def launch_pre(o: Any, do: Any, delta: Any, dq_ws: Any) -> None:
    """The backward's first launch, queued before the host builds the others so that the
    GPU runs it meanwhile: delta = rowsum(dO ∘ O) and dq_ws zeroed, one `tl` kernel;
    replayed from its own plan (key: the four tensors' addresses and layouts) where one
    matches, else through triton's JIT, then planned."""
    global last_pre_reason
    why = plannable((o,), delta)
    key = None if why else (_sig(o), _sig(do), _sig(delta), _sig(dq_ws))
    bound = None if key is None else recall(_PRE_PLANS, key)
    if bound is not None:
        bound()
        return
    fn, grid, args, kwargs = pre_call(o, do, delta, dq_ws)
    compiled = fn[grid](*args, **kwargs)
    if key is None:
        last_pre_reason = why
        return
    bound, last_pre_reason = _bind_pre(compiled, o, do, delta, dq_ws)
    if bound is not None:
        remember(_PRE_PLANS, key, bound, MAX_PLANS)


def launch(cfg: GluonBwdConfig, tensors: tuple, lse2: Any, delta: Any, causal: bool,
           scale: float, variant: Any = None) -> None:  # fmt: skip
    """The Gluon kernel and dQ's cast into dk, dv, dq (delta written and dq_ws zeroed by
    `launch_pre` first): the plan's if there is one, else through triton's JIT, then
    planned for the next call with the same key (`variant`: issue 19's window, softcap
    and ALiBi, flash_validate.Variant, or None)."""
    global last_reason, hits
    why = plannable(tensors, lse2)
    key = None if why else plan_key(cfg, tensors, lse2, delta, causal, scale, variant)
    bound = None if key is None else recall(_PLANS, key)
    if bound is not None:
        hits += 1
        for b in bound:
            b()
        return
    compiled = []
    for make in steps(cfg, tensors, lse2, delta, causal, scale, variant=variant):
        # one launch built at a time (as launch_pre's before them): for a seq_q that is
        # not a multiple of 4 the Gluon kernel's descriptors read padded copies of lse2
        # and delta (tma_rows), which must be made after delta's kernel is queued
        fn, grid, args, kwargs = make()
        compiled.append(fn[grid](*args, **kwargs))
    if key is None:
        last_reason = why
        return
    bound, last_reason = _bind(cfg, tuple(compiled), tensors, lse2, delta, causal, scale,
                               variant)  # fmt: skip
    if bound is not None:
        remember(_PLANS, key, bound, MAX_PLANS)


def clear() -> None:
    """Forget every plan and verification (tests)."""
    _PLANS.clear()
    _PRE_PLANS.clear()
    _VERIFIED.clear()


def calls(cfg: GluonBwdConfig, tensors: tuple, lse2: Any, delta: Any, causal: bool,
          scale: float, probe: int = 0, variant: Any = None) -> list[tuple]:  # fmt: skip
    """(jit function, grid, args, keywords) of the preprocessing kernel (`pre_call`), the
    Gluon kernel and dQ's cast, for tensors or their `_Ptr` stand-ins, built at once (the
    stand-ins, tools; a backward builds them one at a time, `launch_pre` then `steps`)."""
    _, _, _, o, do, _, _, _, dq_ws = tensors
    pre = pre_call(o, do, delta, dq_ws)
    later = steps(cfg, tensors, lse2, delta, causal, scale, probe, variant)
    return [pre, *(make() for make in later)]


def pre_call(o: Any, do: Any, delta: Any, dq_ws: Any) -> tuple:
    """The preprocessing kernel's launch: delta = rowsum(dO ∘ O) into the (B, H, S) delta
    and the (B, H, S, D) fp32 workspace zeroed, as flash_attention._preprocess launches
    it otherwise (head_dim 64/128: no padding)."""
    import importlib

    fa = importlib.import_module("fa_bench.kernels.flash_attention")
    batch, heads_q, seq_q, head_dim = o.shape
    rows = fa._PREPROCESS_ROWS
    return (fa._kernels().preprocess, (-(-seq_q // rows), batch * heads_q),
            (o, do, delta, *_strides(o), *_strides(do), heads_q, seq_q),
            dict(HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim, BLOCK_M=rows, DQ_WS=dq_ws))  # fmt: skip


def steps(cfg: GluonBwdConfig, tensors: tuple, lse2: Any, delta: Any, causal: bool,
          scale: float, probe: int = 0,
          variant: Any = None) -> list[Callable[[], tuple]]:  # fmt: skip
    """The Gluon kernel's and dQ's cast's launches, each built when called."""
    import importlib

    fa = importlib.import_module("fa_bench.kernels.flash_attention")
    kernels = fa._kernels()
    q, k, v, _, do, dk, dv, dq, dq_ws = tensors
    batch, heads_q, seq_q, head_dim = q.shape
    rows = -(-seq_q // _ROWS)
    post = (kernels.dq_post, (rows, batch * heads_q),
            (dq_ws, dq, *_strides(dq), heads_q, seq_q, dq_scale(variant, scale, _fp16(q))),
            dict(HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim, BLOCK_M=_ROWS,
                 DQ_PERM=cfg.dq_perm))  # fmt: skip
    main = (cfg, (q, k, v, do, dk, dv, dq_ws), lse2, delta, causal, scale, probe, variant)
    return [lambda: main_call(*main), lambda: post]


def _fp16(t: Any) -> bool:
    """Whether a tensor (or a plan's stand-in for one) holds float16."""
    import torch

    return t.dtype == torch.float16


def _strides(t: Any) -> tuple[int, int, int]:
    s = t.stride()
    return s[0], s[1], s[2]


def main_call(cfg: GluonBwdConfig, tensors: tuple, lse2: Any, delta: Any, causal: bool,
              scale: float, probe: int = 0, variant: Any = None) -> tuple:  # fmt: skip
    """The Gluon kernel's launch (jit function, grid, args, keywords) for (q, k, v, do,
    dk, dv, dq_ws) and the (B, H, S) lse2 and delta (tensors or stand-ins): descriptors,
    grid (group, key blocks, heads / group): the heads whose key blocks the grid
    interleaves (causal under `head_groups`: flash_gluon_bwd_order; `kb_major`: all of
    them; else 1, a head's key blocks together, heaviest first), and constexprs. `probe`
    2 skips the dQ reduce-adds (timing probes). `variant`: the window, softcap and ALiBi
    (flash_gluon_bwd_varhost; its slopes a tensor or a stand-in)."""
    from fa_bench.kernels import flash_gluon_bwd_kernels
    from fa_bench.kernels.flash_gluon_bwd_desc import _descriptor, _row_descriptor

    q, k, v, do, dk, dv, dq_ws = tensors
    batch, heads_q, seq_q, head_dim = q.shape
    heads_kv, seq_k = k.shape[1], k.shape[2]
    descs = [_descriptor(q, cfg.block_m)]
    descs += [_descriptor(t, cfg.keys) for t in (k, v)]
    descs += [_descriptor(do, cfg.block_m)]
    descs += [_descriptor(t, cfg.keys) for t in (dk, dv)]
    descs.append(_descriptor(dq_ws, cfg.block_m, cfg.dq_cols(head_dim)))
    descs += [_row_descriptor(lse2, cfg.block_m), _row_descriptor(delta, cfg.block_m)]
    blocks, heads = -(-seq_k // cfg.block_n), batch * heads_kv
    group = heads if cfg.kb_major else 1
    if causal and cfg.head_groups:
        # a key/value head's query heads: the fp32 dQ workspace, Q and dO (16-bit)
        head_bytes = heads_q // heads_kv * seq_q * head_dim * 8
        group = causal_head_group(seq_q, seq_k, cfg.block_m, cfg.block_n, heads, head_bytes,
                                  *_sms_l2())  # fmt: skip
    if heads % group:
        raise ValueError(f"a group of {group} heads does not divide the {heads} heads")
    # the hardware dispatches x fastest: the group's heads, then its key blocks, then the
    # next group (the kernel's mapping is program ids alone, which ptxas rematerialises:
    # session 15's runtime division kept them in registers, 40-48 more bytes spilled)
    grid = (group, blocks, heads // group)
    args = (*descs, heads_q, heads_kv, seq_q, seq_k, scale * _LOG2E, scale,
            *variant_args(variant, scale))  # fmt: skip
    kwargs = dict(BLOCK_M=cfg.block_m, KEYS=cfg.keys, HEAD_DIM=head_dim, STAGES=cfg.stages,
                  CAUSAL=causal, PRODUCER_REGS=cfg.producer_regs,
                  CONSUMER_REGS=cfg.consumer_regs, DQ_MODE=probe or cfg.dq_mode,
                  ROTATE=cfg.rotate, PINGPONG=cfg.pingpong,
                  OPS_SMEM=cfg.ops_smem, DQ_PERM=cfg.dq_perm,
                  VAR=variant_bits(variant, scale, _fp16(q)), num_warps=4)  # fmt: skip
    return flash_gluon_bwd_kernels._bwd_ws, grid, args, kwargs


def _sms_l2() -> tuple[int, int]:
    """The current CUDA device's SM count and L2 bytes ((0, 0) without one: the head-major
    order)."""
    return device_props.sm_count(), device_props.l2_bytes()


def _bind(cfg: GluonBwdConfig, compiled: tuple, tensors: tuple, lse2: Any, delta: Any,
          causal: bool, scale: float, variant: Any = None) -> tuple[tuple | None, str]:  # fmt: skip
    """The bound launches of the Gluon kernel and dQ's cast for these tensors' key, or
    (None, why not)."""
    from fa_bench.kernels.bound_launch import Bound, jit_values
    from fa_bench.kernels.flash_gluon_plan import _Ptr

    compiled = tuple(c.result() if hasattr(c, "result") else c for c in compiled)
    why = _unbindable(compiled, all(hasattr(c, "run") and hasattr(c, "function")
                                    for c in compiled))  # fmt: skip
    if why:
        return None, why
    ptrs = tuple(_Ptr(t) for t in tensors)
    later = steps(cfg, ptrs, _Ptr(lse2), _Ptr(delta), causal, scale,
                  variant=stand_in(variant, _Ptr))  # fmt: skip
    stand_ins = [make() for make in later]
    bound = []
    for (fn, grid, args, kwargs), c in zip(stand_ins, compiled, strict=True):
        values = jit_values(fn, args, kwargs)
        if values is None:
            return None, f"an argument of {getattr(fn, '__name__', fn)} not given"
        bound.append(Bound(c, grid, values, tensors[0].device.index or 0))
    if compiled not in _VERIFIED:
        _VERIFIED[compiled] = reproduces(tuple(bound), tensors)
    if not _VERIFIED[compiled]:
        return None, _NOT_REPRODUCED
    return tuple(bound), ""


def _unbindable(compiled: Any, runnable: bool) -> str:
    """Why these compiled kernels get no bound launch now ("" when they may): nothing
    compiled to bind, a check that failed before (not retried per call), or a CUDA graph
    being captured (the check's synchronising reads wait for a plain call)."""
    import torch

    if not runnable:
        return "no compiled kernel to bind"
    if _VERIFIED.get(compiled) is False:
        return _NOT_REPRODUCED
    if compiled not in _VERIFIED and torch.cuda.is_current_stream_capturing():
        return "a CUDA graph is being captured: the check waits for a plain call"
    return ""


def reproduces(bound: tuple, tensors: tuple) -> bool:
    """Whether the bound launches write what the JIT launches just wrote: dk, dv bit for
    bit, dq_ws and dq within 1e-3 of their largest value (the reduce-adds' order varies).
    The outputs are left holding the JIT launches' results either way (delta is
    launch_pre's, checked by `pre_reproduces`)."""
    _, _, _, _, _, dk, dv, dq, dq_ws = tensors
    outs = (dk, dv, dq, dq_ws)
    want = [t.clone() for t in outs]
    for t in (dk, dv, dq):
        t.fill_(float("nan"))  # so that a launch writing nothing cannot pass
    dq_ws.zero_()
    try:
        for b in bound:
            b()
        same = all(_bits(t).equal(_bits(w)) for t, w in zip(outs[:2], want[:2], strict=True))
        same = same and all(_close(t, w) for t, w in zip(outs[2:], want[2:], strict=True))
    except Exception:  # another triton's internals: stay on the JIT path
        same = False
    if not same:
        for t, w in zip(outs, want, strict=True):
            t.copy_(w)
    return bool(same)


def _bind_pre(compiled: Any, o: Any, do: Any, delta: Any, dq_ws: Any) -> tuple[Any, str]:
    """launch_pre's bound launch for these tensors' key, or (None, why not)."""
    from fa_bench.kernels.bound_launch import Bound, jit_values
    from fa_bench.kernels.flash_gluon_plan import _Ptr

    compiled = compiled.result() if hasattr(compiled, "result") else compiled
    why = _unbindable(compiled, hasattr(compiled, "run") and hasattr(compiled, "function"))
    if why:
        return None, why
    fn, grid, args, kwargs = pre_call(_Ptr(o), _Ptr(do), _Ptr(delta), _Ptr(dq_ws))
    values = jit_values(fn, args, kwargs)
    if values is None:
        return None, "an argument of the preprocessing kernel not given"
    bound = Bound(compiled, grid, values, o.device.index or 0)
    if compiled not in _VERIFIED:
        _VERIFIED[compiled] = pre_reproduces(bound, delta, dq_ws)
    if not _VERIFIED[compiled]:
        return None, _NOT_REPRODUCED
    return bound, ""


def pre_reproduces(bound: Any, delta: Any, dq_ws: Any) -> bool:
    """Whether the bound preprocessing launch writes the delta the JIT launch just wrote,
    bit for bit, and zeroes the whole workspace (both filled with NaN before it, so that
    a launch writing nothing cannot pass). Left holding the JIT launch's results."""
    want = delta.clone()
    delta.fill_(float("nan"))
    dq_ws.fill_(float("nan"))
    try:
        bound()
        same = _bits(delta).equal(_bits(want)) and not bool(dq_ws.ne(0).any())
    except Exception:  # another triton's internals: stay on the JIT path
        same = False
    if not same:
        delta.copy_(want)
        dq_ws.zero_()
    return bool(same)


def _bits(t: torch.Tensor) -> torch.Tensor:
    import torch

    return t.view({2: torch.int16, 4: torch.int32}[t.element_size()])


def _close(t: torch.Tensor, want: torch.Tensor) -> bool:
    """Within 1e-3 of want's largest magnitude, or one unit in the last place of the
    dtype's largest value if that is more, everywhere; NaN nowhere. The reduce-adds' order
    moves dQ's fp32 sums by far less than 1e-3, but the cast to bf16 can then round an
    element near the peak the other way: one bf16 unit there is 2^-7 of the peak (the
    first GPU run of 1e-3 alone, session 11 call 1, failed a correct d128 bf16 launch so,
    and left it on the unplanned path)."""
    import torch

    rel = max(1e-3, torch.finfo(t.dtype).eps) if t.dtype.is_floating_point else 1e-3
    t, want = t.float(), want.float()
    peak = float(want.abs().max()) if want.numel() else 0.0
    if not t.isfinite().all():
        return False
    return float((t - want).abs().max()) <= rel * peak if t.numel() else True
