"""The argument checks of our kernel's variants (issue 19): flash_attention's window,
ALiBi slopes and softcap, flash_attention_varlen's packed tensors, cumulative lengths and
max_seqlen; each a ValueError naming the argument and the value. (The kernels themselves:
tests/test_flash_variants.py.)
"""

from __future__ import annotations

import math
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

pytest.importorskip("triton")

from fa_bench.kernels import flash_attention, flash_attention_varlen

# CPU tensors: the interpreter (on a GPU machine they would fail the device check first)
pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1", reason="needs TRITON_INTERPRET=1 (CPU runs)"
)


def make(b, hq, hk, sq, sk, d):
    g = torch.Generator().manual_seed(0)
    return tuple(torch.randn((b, h, s, d), generator=g) for h, s in ((hq, sq), (hk, sk), (hk, sk)))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(window=(-2, 0)), r"window values must be -1 .* window=\(-2, 0\)"),
        (dict(window=(4,)), r"window must be a pair of ints .* \(4,\)"),
        (dict(window=(1.5, 0)), r"window must be a pair of ints .* \(1.5, 0\)"),
        (dict(window=(True, 0)), r"window must be a pair of ints"),
        (dict(softcap=-1.0), r"softcap must be 0 \(off\) or finite and > 0, got -1.0"),
        (dict(softcap=math.inf), r"softcap .* got inf"),
        (dict(softcap=math.nan), r"softcap .* got nan"),
        (dict(softcap="50"), r"softcap must be a number .* '50'"),
        (dict(alibi_slopes=torch.ones(3)), r"alibi_slopes must have shape \(2,\) or \(1, 2\), got \(3,\)"),  # noqa: E501
        (dict(alibi_slopes=torch.ones(2, dtype=torch.float64)), r"alibi_slopes must be float32, got torch.float64"),  # noqa: E501
        (dict(alibi_slopes=torch.ones(2, device="meta")), r"alibi_slopes must be on cpu .* got meta"),  # noqa: E501
        (dict(alibi_slopes=[0.5, 0.25]), r"alibi_slopes must be a torch.Tensor or None, got list"),
    ],
)  # fmt: skip
def test_bad_variant_arguments(kwargs, match):
    q, k, v = make(1, 2, 2, 8, 8, 16)
    with pytest.raises(ValueError, match=match):
        flash_attention(q, k, v, **kwargs)


def _packed(tq=10, tk=10):
    return torch.randn(tq, 2, 16), torch.randn(tk, 2, 16), torch.randn(tk, 2, 16)


@pytest.mark.parametrize(
    ("cu_q", "cu_k", "max_q", "match"),
    [
        (torch.tensor([0, 4, 10]), None, 6, r"cu_seqlens_q must be int32, got torch.int64"),
        ([0, 4, 10], None, 6, r"cu_seqlens_q must be an int32 torch.Tensor, got list"),
        (torch.tensor([1, 4, 10], dtype=torch.int32), None, 6, r"must start at 0, got cu_seqlens_q\[0\] = 1"),  # noqa: E501
        (torch.tensor([0, 6, 4, 10], dtype=torch.int32), None, 6, r"must not decrease, got 6 then 4 at index 1"),  # noqa: E501
        (torch.tensor([0, 4, 9], dtype=torch.int32), None, 6, r"cu_seqlens_q ends at 9 but the packed tensor has 10 tokens"),  # noqa: E501
        (torch.tensor([[0, 4, 10]], dtype=torch.int32), None, 6, r"cu_seqlens_q must be 1-D"),
        (torch.tensor([0, 4, 10], dtype=torch.int32), None, 5, r"max_seqlen_q \(5\) is below the longest sequence \(6\)"),  # noqa: E501
        (torch.tensor([0, 4, 10], dtype=torch.int32), None, 0, r"max_seqlen_q must be a positive int, got 0"),  # noqa: E501
        (torch.tensor([0, 10], dtype=torch.int32), None, 10, r"same number of sequences"),
    ],
)  # fmt: skip
def test_bad_cu_seqlens(cu_q, cu_k, max_q, match):
    q, k, v = _packed()
    cu_k = torch.tensor([0, 4, 10], dtype=torch.int32) if cu_k is None else cu_k
    with pytest.raises(ValueError, match=match):
        flash_attention_varlen(q, k, v, cu_q, cu_k, max_q, 6)


def test_varlen_wants_3d_tensors_and_checks_slopes_per_sequence():
    q, k, v = _packed()
    cu = torch.tensor([0, 4, 10], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"q must be 3-D \(total_tokens, heads, head_dim\)"):
        flash_attention_varlen(q[None], k, v, cu, cu, 6, 6)
    with pytest.raises(ValueError, match=r"alibi_slopes must have shape \(2,\) or \(2, 2\)"):
        flash_attention_varlen(q, k, v, cu, cu, 6, 6, alibi_slopes=torch.ones(3, 2))
