"""The packed (varlen) dK/dV kernel's clamped loads (flash_kernels_bwd CLAMP,
flash_validate.PACKED_CLAMP): its streamed Q/dO rows and held K/V rows load without a
row mask, from row indices clamped into the packed tensor, so a block that runs past its
sequence reads the next sequence's rows, which must add nothing (their lse2 loads as
+inf), and a block that runs past the tensor's end reads its last row, never beyond.

CPU: the Triton interpreter in fp32, against the float64 reference under the accuracy
rule (fa_bench.run.accuracy), bit for bit against the masked loads (CLAMP 1) or itself
(CLAMP 2, the default: a sequence's whole row blocks in a loop with no mask, its tail
block in the diagonal's masked loop, another summation order). The tensors sit
in buffers whose rows past the packed tokens are NaN, so a load past the tensor's end
poisons the gradients. GPU runs: tests/test_flash_varlen_clamp_gpu.py.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

pytest.importorskip("triton")

from fa_bench.kernels import flash_attention_varlen, flash_validate
from fa_bench.kernels.flash_config import FlashConfig
from fa_bench.kernels.flash_validate import Varlen, backward_grids, make_variant
from fa_bench.run.accuracy import _tensor_report
from fa_bench.run.variant_reference import variant_attention

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
interpreter = pytest.mark.skipif(not INTERPRETED, reason="needs TRITON_INTERPRET=1 (CPU runs)")
# dK/dV holds 32 keys and streams 16 query rows: lengths 16, 32 and 64 are whole blocks
SMALL = FlashConfig(block_m=32, block_n=16, bwd_block_m=16, bwd_block_n=32)
PAD = 40  # NaN rows past the packed tokens: more than one block of either kind


def _cu(lengths: list[int]) -> torch.Tensor:
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=torch.int32)


def _nan_padded(t: torch.Tensor) -> torch.Tensor:
    """`t`'s values in the first rows of a buffer whose PAD further rows are NaN."""
    buf = torch.full((t.shape[0] + PAD, *t.shape[1:]), float("nan"), dtype=t.dtype)
    buf[: t.shape[0]] = t
    return buf[: t.shape[0]]


def _grads(len_q, len_k, hq, hk, d, kw, seed=0):
    """Ours (o, dq, dk, dv) on NaN-padded packed fp32 tensors, and the inputs."""
    g = torch.Generator().manual_seed(seed)
    q = _nan_padded(torch.randn((sum(len_q), hq, d), generator=g)).requires_grad_()
    k = _nan_padded(torch.randn((sum(len_k), hk, d), generator=g)).requires_grad_()
    v = _nan_padded(torch.randn((sum(len_k), hk, d), generator=g)).requires_grad_()
    cq, ck = _cu(len_q), _cu(len_k)
    o = flash_attention_varlen(q, k, v, cq, ck, max(len_q), max(len_k), config=SMALL, **kw)
    do = _nan_padded(torch.randn(o.shape, generator=g))
    return (q, k, v, do, cq, ck), (o, *torch.autograd.grad(o, (q, k, v), do))


def _reference_rule(inputs, ours, kw) -> None:
    """Each sequence's float64 reference and fp32 baseline, packed back, under the rule."""
    q, k, v, do, cq, ck = inputs
    slopes = kw.get("alibi_slopes")
    parts: dict = {torch.float64: [], torch.float32: []}
    for b in range(cq.numel() - 1):
        rows, keys = slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])
        one = [t[cut].detach().transpose(0, 1).unsqueeze(0) for t, cut in
               ((q, rows), (k, keys), (v, keys), (do, rows))]  # fmt: skip
        one_kw = dict(kw, alibi_slopes=None if slopes is None else slopes[b])
        for dtype, out in parts.items():
            r = variant_attention(*(t.to(dtype) for t in one[:3]), do=one[3].to(dtype), **one_kw)
            out.append([r.o, r.dq, r.dk, r.dv])
    terms = int(max((cq[1:] - cq[:-1]).max(), (ck[1:] - ck[:-1]).max()))
    for i, name in enumerate(("o", "dq", "dk", "dv")):
        ref, base = (torch.cat([p[i][0].transpose(0, 1) for p in parts[t]]) for t in parts)
        report = _tensor_report(ours[i], ours[i], ref, base, terms)
        assert report["passed"], (name, report)


def _clamped_within_rule(monkeypatch, len_q, len_k, kw, hq=4, hk=2, d=16, clamps=(2,)):
    """Each CLAMP mode within the rule: 1 (clamped loads) and 3 (and the whole row blocks
    unmasked, the tail block in a third loop) bit for bit the masked loads (0); 2 (the
    tail block in the diagonal's loop, summed before the whole blocks: another order) bit
    for bit itself on a second run."""
    runs = {}
    for clamp in (*clamps, 0):
        monkeypatch.setattr(flash_validate, "PACKED_CLAMP", clamp)
        inputs, runs[clamp] = _grads(len_q, len_k, hq, hk, d, kw)
    for clamp in clamps:
        for name, t in zip(("o", "dq", "dk", "dv"), runs[clamp], strict=True):
            assert torch.isfinite(t).all(), f"{name}: a load read past the tensor's end"
        _reference_rule(inputs, runs[clamp], kw)
        if clamp == 2:
            monkeypatch.setattr(flash_validate, "PACKED_CLAMP", 2)
            same = _grads(len_q, len_k, hq, hk, d, kw)[1]
        else:
            same = runs[0]
        for name, a, b in zip(("o", "dq", "dk", "dv"), runs[clamp], same, strict=True):
            assert torch.equal(a, b), (clamp, name)


def test_packed_launches_clamp_and_dense_ones_do_not(monkeypatch):
    cu = _cu([40, 7, 90])
    q = torch.empty((1, 8, 137, 16))
    packed = make_variant(
        q, causal=True, window=(-1, -1), alibi_slopes=None, softcap=0.0, batch=3,
        seq_q=90, seq_k=90, varlen=Varlen(cu, cu, 90, 90),
    )  # fmt: skip
    assert backward_grids(packed, True, 1, 8, 2, 137, 137, 32)[0]["CLAMP"] == 2
    assert "CLAMP" not in backward_grids(None, True, 1, 8, 2, 137, 137, 32)[0]
    monkeypatch.setattr(flash_validate, "PACKED_SCHEDULE", False)  # the first grid too
    assert backward_grids(packed, True, 1, 8, 2, 137, 137, 32)[0]["CLAMP"] == 2
    # the masked loop 2 stages deep by default (the H200's fastest), None: the launch's
    assert backward_grids(packed, True, 1, 8, 2, 137, 137, 32)[0]["DIAG_STAGES"] == 2
    assert "DIAG_STAGES" not in backward_grids(None, True, 1, 8, 2, 137, 137, 32)[0]
    monkeypatch.setattr(flash_validate, "PACKED_DIAG_STAGES", None)
    assert "DIAG_STAGES" not in backward_grids(packed, True, 1, 8, 2, 137, 137, 32)[0]
    monkeypatch.setattr(flash_validate, "PACKED_DIAG_STAGES", 1)
    monkeypatch.setattr(flash_validate, "PACKED_CLAMP", 0)
    extra = backward_grids(packed, True, 1, 8, 2, 137, 137, 32)[0]
    assert "CLAMP" not in extra and "DIAG_STAGES" not in extra


@interpreter
def test_clamped_loads_fast(monkeypatch):
    # length 1, whole blocks (16, 32), ragged (50: whole row blocks between the diagonal and
    # the tail), the last sequence ragged, its block past the tensor end
    lengths = [1, 32, 50, 16, 5]
    _clamped_within_rule(monkeypatch, lengths, lengths, dict(causal=True))


@interpreter
@pytest.mark.slow
@pytest.mark.parametrize(
    "kw",
    [
        dict(causal=False),
        dict(causal=True, window=(20, -1), softcap=5.0),
        dict(causal=True, window=(9, -1), alibi=True, softcap=3.0),
        dict(causal=False, window=(9, 3), alibi=True),
    ],
)
def test_clamped_loads_variants(monkeypatch, kw):
    # Sq != Sk per sequence, length 1, whole blocks (32, 64), ragged, the last sequence
    # exactly at the tensor's end and ragged (its blocks run past it)
    len_q, len_k = [1, 64, 37, 32, 50, 7], [3, 64, 29, 32, 61, 11]
    kw = dict(kw)
    if kw.pop("alibi", False):
        base = torch.tensor([0.5, 0.25, 0.125, 0.0625])
        kw["alibi_slopes"] = torch.stack([base * (1 + 0.5 * b) for b in range(len(len_q))])
    _clamped_within_rule(monkeypatch, len_q, len_k, kw, clamps=(1, 2, 3))


@interpreter
@pytest.mark.slow
def test_clamped_loads_mha_whole_blocks(monkeypatch):
    # no GQA, every sequence a whole number of both blocks: the clamp's no-op case
    lengths = [32, 64, 32]
    _clamped_within_rule(monkeypatch, lengths, lengths, dict(causal=True), 2, 2)
