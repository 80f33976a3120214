"""Fake peer packages for CPU tests of our adapters: NOT the real kernels.

`fake_modules()` builds stand-ins for `flash_attn.cute` (flash-attn-4), `flash_attn`
(flash-attn 2) and `xformers.ops` with the calling conventions of the real packages: the
keywords they take, their (batch, seqlen, heads, head_dim) layout, FA4's `(out, lse)`
return value, xFormers' 5-D GQA form and its bottom-right causal bias class. Each computes
attention itself in plain torch *in its own layout* (einsum over "bshd"), so an adapter
that hands it tensors in the wrong layout, the wrong heads for GQA or the wrong causal flag
gets a wrong answer, which the benchmark's accuracy check reports.

Used two ways: tests/test_peers.py puts the modules in sys.modules in-process; as a
`--plugin` file (tests/plugins/fake_peers.py imports `install`) it does the same in the
worker and registers each real adapter's builder again as `<name>-fake` on the CPU, so
`fa-bench run` exercises our adapters end to end. What this cannot test: the real
kernels (their speed, their numerics, their own input checks): the `gpu` tests do that.
"""

from __future__ import annotations

import math
import sys
import types
from dataclasses import dataclass

import torch


def _check_layout(name: str, *tensors: torch.Tensor, dims: int = 4) -> None:
    for t in tensors:
        if t.dim() != dims or t.stride(-1) != 1:
            raise ValueError(f"{name}: want {dims}-D tensors with a contiguous last dim, got "
                             f"shape {tuple(t.shape)} stride {t.stride()}")  # fmt: skip


def attend_bshd(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float | None
) -> torch.Tensor:
    """Attention on (B, S, H, D) tensors, K/V heads shared by consecutive query heads,
    causal aligned bottom-right, rows without keys 0 (as flash-attn's kernels)."""
    if q.shape[2] % k.shape[2]:
        raise ValueError(f"heads {q.shape[2]} not a multiple of kv heads {k.shape[2]}")
    group = q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * (scale or 1.0 / math.sqrt(q.shape[-1]))
    if causal:
        sq, sk = q.shape[1], k.shape[1]
        s = s.masked_fill(torch.ones(sq, sk, dtype=torch.bool).triu(sk - sq + 1), float("-inf"))
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    # The real kernels allocate their output in (B, S, H, D).
    return torch.einsum("bhqk,bkhd->bqhd", p, v).contiguous()


def fa4_flash_attn_func(q, k, v, qv=None, gather_kv_indices=None, softmax_scale=None,
                        causal=False, window_size=(None, None), learnable_sink=None,
                        softcap=0.0, num_splits=1, pack_gqa=None, deterministic=False,
                        return_lse=False):  # fmt: skip
    """flash_attn.cute.flash_attn_func (flash-attn-4 4.0.0b36): returns (out, lse)."""
    _check_layout("flash_attn.cute.flash_attn_func", q, k, v)
    return attend_bshd(q, k, v, causal, softmax_scale), None


def fa2_flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                        window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                        deterministic=False, return_attn_probs=False):  # fmt: skip
    """flash_attn.flash_attn_func (flash-attn 2.x): returns out."""
    _check_layout("flash_attn.flash_attn_func", q, k, v)
    return attend_bshd(q, k, v, causal, softmax_scale)


class LowerTriangularFromBottomRightMask:
    """xformers.ops.fmha.attn_bias's bottom-right causal bias (a marker here)."""


@dataclass
class Inputs:  # xformers.ops.fmha.Inputs, as far as the adapter's backend label uses it
    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    attn_bias: object = None


class FakeCutlassOp:
    NAME = "fake-cutlassF"


def _dispatch_fw(inp: Inputs, needs_gradient: bool) -> type:
    return FakeCutlassOp


def memory_efficient_attention(query, key, value, attn_bias=None, p=0.0, scale=None, *,
                               op=None, output_dtype=None):  # fmt: skip
    """xformers.ops.memory_efficient_attention: (B, M, H, K), or (B, M, G, H, K) with K/V
    expanded over H for GQA; equal heads in q and k/v either way."""
    dims = query.dim()
    if dims not in (4, 5):
        raise ValueError(f"memory_efficient_attention: 4-D or 5-D inputs, got {dims}-D")
    _check_layout("xformers.ops.memory_efficient_attention", query, key, value, dims=dims)
    if key.shape[2:-1] != query.shape[2:-1]:
        raise ValueError(f"heads differ: query {tuple(query.shape)}, key {tuple(key.shape)}")
    if attn_bias is not None and not isinstance(attn_bias, LowerTriangularFromBottomRightMask):
        raise ValueError(f"unexpected attn_bias {attn_bias!r}")
    causal = attn_bias is not None
    if dims == 5:
        q4, k4, v4 = (t.flatten(2, 3) for t in (query, key, value))
        return attend_bshd(q4, k4, v4, causal, scale).unflatten(2, query.shape[2:4])
    return attend_bshd(query, key, value, causal, scale)


def _module(name: str, package: bool = False, **attrs: object) -> types.ModuleType:
    m = types.ModuleType(name)
    m.__file__ = __file__
    if package:
        m.__path__ = []  # a package, so its submodules can be imported by name
    for key, value in attrs.items():
        setattr(m, key, value)
    return m


def fake_modules(fa4: bool = True, fa2: bool = True, xformers: bool = True) -> dict:
    """The fake modules by import name; the caller puts them in sys.modules."""
    mods: dict[str, types.ModuleType] = {}
    if fa4 or fa2:
        extra = {"flash_attn_func": fa2_flash_attn_func} if fa2 else {}
        mods["flash_attn"] = _module("flash_attn", package=True, **extra)
    if fa4:
        mods["flash_attn.cute"] = _module("flash_attn.cute", flash_attn_func=fa4_flash_attn_func)
        mods["flash_attn"].cute = mods["flash_attn.cute"]  # type: ignore[attr-defined]
    if fa2:
        mods["flash_attn.flash_attn_interface"] = _module(
            "flash_attn.flash_attn_interface", flash_attn_func=fa2_flash_attn_func
        )
    if xformers:
        bias = _module(
            "xformers.ops.fmha.attn_bias",
            LowerTriangularFromBottomRightMask=LowerTriangularFromBottomRightMask,
        )
        fmha = _module("xformers.ops.fmha", package=True, attn_bias=bias, Inputs=Inputs,
                       _dispatch_fw=_dispatch_fw)  # fmt: skip
        ops = _module("xformers.ops", package=True, fmha=fmha,
                      memory_efficient_attention=memory_efficient_attention)  # fmt: skip
        mods.update({"xformers": _module("xformers", package=True, ops=ops),
                     "xformers.ops": ops, "xformers.ops.fmha": fmha,
                     "xformers.ops.fmha.attn_bias": bias})  # fmt: skip
    return mods


def install() -> None:
    """Put the fakes in sys.modules (a worker process's, via the plugin)."""
    sys.modules.update(fake_modules())
