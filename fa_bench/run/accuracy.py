"""The float64 reference attention and the accuracy check every implementation passes.

`reference_attention` is the specification: exact softmax attention with bottom-right causal
alignment and GQA, forward and analytic backward, chunked over query rows so that even a
128k-token case needs only O(chunk × Sk) memory. Called on float64 tensors it is the
reference; called on low-precision tensors it is "plain PyTorch attention in that dtype",
the baseline of flash-attention's own test rule:

    passed  ⇔  max|x − ref| ≤ 2 · max|baseline − ref| + atol

where atol = 2 · max|(r + 0.3 − 0.3) − r| with r the reference rounded to the case dtype
(the dtype's rounding error at the reference's magnitude, exactly as flash-attention's
tests compute `fwd_atol`/`dq_atol`), plus an fp32 accumulation allowance
2 · eps_fp32 · √n · max|ref| for the n-term reductions (n = max(Sk, group · Sq)).

Why the allowance: flash-attention's rule is made for fp16/bf16. In fp32 plain PyTorch is
within about one ulp of float64, and a fused kernel that merely reorders its sums over Sk
(forward, dQ) or Sq (dK, dV) lands at a few times that: measured on an H200 with torch
2.11, SDPA math, memory-efficient and FlexAttention in fp32 all failed the bare rule on dK/dV
at N=4096 with relative L2 errors near 1e-6. The allowance is the usual √n rounding bound of
an n-term fp32 sum; in fp16/bf16 it is ~100× below the rounding floor, so it changes
nothing there. A NaN or Inf anywhere in the tensor fails.
"""

from __future__ import annotations

import math

import torch

from fa_bench.case import Case, Mode
from fa_bench.run.variant_reference import RefResult, case_reference, variant_attention

# check_accuracy keeps one (chunk × Sk) float64 score block of the slice near this many
# elements (1 GiB), so the reference stays cheap at 128k tokens without tiny chunks at 1k.
_SCORE_BLOCK_ELEMENTS = 1 << 27


def reference_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool,
    scale: float | None = None,
    do: torch.Tensor | None = None,
    chunk_rows: int = 1024,
) -> RefResult:
    """Exact attention in q's dtype; with `do`, also the analytic dq, dk, dv.

    Layout (batch, heads, seqlen, head_dim); k and v may have fewer heads (GQA: q head h
    uses kv head h // group). Causal with Sq != Sk is bottom-right aligned: query i attends
    keys j <= i + (Sk - Sq). Rows with no key at all give o = 0, lse = -inf, zero grads.
    """
    return variant_attention(q, k, v, causal=causal, scale=scale, do=do, chunk_rows=chunk_rows)


def _floor(ref: torch.Tensor, dtype: torch.dtype, terms: int) -> float:
    r = ref.to(dtype)
    rounding = 2.0 * ((r + 0.3 - 0.3) - r).abs().max().item()
    eps = torch.finfo(torch.float32).eps
    accumulation = 2.0 * eps * math.sqrt(terms) * ref.abs().max().item()
    return rounding + accumulation


def _tensor_report(
    x: torch.Tensor,
    x_slice: torch.Tensor,
    ref: torch.Tensor,
    base: torch.Tensor,
    terms: int,
    extra_floor: float = 0.0,
) -> dict:
    nonfinite = int((~torch.isfinite(x)).sum().item())
    ref = ref.double()
    err = (x_slice.double() - ref).abs()
    ref_norm = ref.norm().item()
    base_err = (base.double() - ref).abs().max().item() if ref.numel() else 0.0
    floor = _floor(ref, x.dtype, terms) if ref.numel() else 0.0
    tolerance = 2.0 * base_err + floor + extra_floor
    if nonfinite:
        # inf rather than NaN so that "worst over tensors" still compares correctly.
        max_abs, rel_l2 = math.inf, math.inf
    else:
        max_abs = err.max().item() if err.numel() else 0.0
        diff_norm = (x_slice.double() - ref).norm().item()
        rel_l2 = diff_norm / ref_norm if ref_norm > 0 else (0.0 if diff_norm == 0 else math.inf)
    return {
        "max_abs_err": float(max_abs),
        "rel_l2_err": float(rel_l2),
        "baseline_max_abs_err": float(base_err),
        "tolerance": float(tolerance),
        "nonfinite": nonfinite,
        "passed": bool(nonfinite == 0 and max_abs <= tolerance),
    }


def check_accuracy(
    case: Case,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    o: torch.Tensor,
    do: torch.Tensor | None = None,
    dq: torch.Tensor | None = None,
    dk: torch.Tensor | None = None,
    dv: torch.Tensor | None = None,
) -> dict:
    """Compare an implementation's outputs with the float64 reference on a cheap slice.

    The slice is batch 0, kv head 0 and the q heads of its group: self-contained for dk/dv
    too (a packed case's batch 0 is all its documents). Errors are measured on the slice;
    NaN/Inf is counted over the whole tensor.
    Grads are checked when `do` and the grad are given. Values are plain Python types;
    a tensor with NaN/Inf reports max_abs_err = rel_l2_err = inf (written to JSON as null).
    """
    if case.mode is Mode.DECODE:
        if do is not None:
            raise ValueError("a decode case has no backward: no grads to check")
        return check_decode_accuracy(case, q, k, v, o)
    group = case.heads_q // case.heads_kv
    for name, t in (("q", q), ("o", o), ("do", do), ("dq", dq)):
        if t is not None and t.shape[1] != case.heads_q:
            raise ValueError(f"{name} has {t.shape[1]} heads, the case {case.heads_q}")
    if (dq is not None or dk is not None or dv is not None) and do is None:
        raise ValueError("checking grads needs the output grad `do`")

    def qs(t: torch.Tensor) -> torch.Tensor:
        return t[:1, :group].detach()

    def kvs(t: torch.Tensor) -> torch.Tensor:
        return t[:1, :1].detach()

    q_s, k_s, v_s = qs(q), kvs(k), kvs(v)
    do_s = None if do is None else qs(do)
    if case.is_variant:
        # Window, ALiBi, softcap; a packed case's slice is all its documents (batch 1).
        do64 = None if do_s is None else do_s.double()
        ref = case_reference(case, q_s.double(), k_s.double(), v_s.double(), do64, group)
        base = case_reference(case, q_s, k_s, v_s, do_s, group)
    else:
        chunk = max(1, min(1024, _SCORE_BLOCK_ELEMENTS // max(1, group * case.seqlen_k)))
        ref = reference_attention(
            q_s.double(),
            k_s.double(),
            v_s.double(),
            causal=case.causal,
            do=None if do_s is None else do_s.double(),
            chunk_rows=chunk,
        )
        base = reference_attention(q_s, k_s, v_s, causal=case.causal, do=do_s, chunk_rows=chunk)

    candidates = {
        "o": (o, qs, ref.o, base.o),
        "dq": (dq, qs, ref.dq, base.dq),
        "dk": (dk, kvs, ref.dk, base.dk),
        "dv": (dv, kvs, ref.dv, base.dv),
    }
    terms = max(case.seqlen_k, group * case.seqlen_q)
    tensors = {
        name: _tensor_report(x.detach(), take(x), r, b, terms)
        for name, (x, take, r, b) in candidates.items()
        if x is not None and r is not None and b is not None
    }
    heads = _heads(group)
    return {
        "max_abs_err": max(t["max_abs_err"] for t in tensors.values()),
        "rel_l2_err": max(t["rel_l2_err"] for t in tensors.values()),
        "passed": all(t["passed"] for t in tensors.values()),
        "tensors": tensors,
        "slice": f"{_batch_slice(case)}, kv head 0, {heads}",
    }


# One e4m3 step, relative: 3 mantissa bits. Twice the rounding error of one e4m3 value,
# as _floor's 2× of the case dtype's rounding.
E4M3_STEP = 2.0**-3


def check_fp8_accuracy(
    case: Case, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor
) -> dict:
    """check_accuracy's rule for an fp8 forward case (`DType.FP8_E4M3`).

    q, k, v are the DEQUANTISED inputs (x8 · descale, fp32; run/fp8_inputs.py): the case
    is the attention of those values. The reference is their float64 attention, the
    baseline plain PyTorch attention of them in bf16 (`reference_attention` on bf16
    tensors: matmul, softmax, matmul), and

        tolerance = 2 · max|baseline − ref| + the bf16 floor of o (as check_accuracy's)
                    + 2⁻³ · max|ref|

    The last term is one e4m3 step at the output's magnitude: an fp8 kernel rounds P to
    e4m3 for the PV matmul (a relative error up to 2⁻⁴ per element), which the bf16
    baseline does not. Same slice as check_accuracy (batch 0, kv head 0 and its q heads).
    """
    if case.mode is not Mode.FWD:
        raise ValueError(f"an fp8 case is forward only, got mode {case.mode.value}")
    group = case.heads_q // case.heads_kv
    if o.shape != q.shape:
        raise ValueError(f"o {tuple(o.shape)} differs from q {tuple(q.shape)}")
    q_s, k_s, v_s = q[:1, :group].detach(), k[:1, :1].detach(), v[:1, :1].detach()
    chunk = max(1, min(1024, _SCORE_BLOCK_ELEMENTS // max(1, group * case.seqlen_k)))
    ref = reference_attention(
        q_s.double(), k_s.double(), v_s.double(), causal=case.causal, chunk_rows=chunk
    ).o
    low = [t.to(torch.bfloat16) for t in (q_s, k_s, v_s)]
    base = reference_attention(*low, causal=case.causal, chunk_rows=chunk).o
    e4m3 = E4M3_STEP * ref.abs().max().item() if ref.numel() else 0.0
    terms = max(case.seqlen_k, group * case.seqlen_q)
    report = _tensor_report(o.detach(), o[:1, :group].detach(), ref, base, terms, e4m3)
    return _output_only(report, f"batch 0, kv head 0, {_heads(group)}; fp8 inputs dequantised")


def _batch_slice(case: Case) -> str:
    return f"all {case.batch} documents (packed)" if case.varlen else "batch 0"


def decode_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lengths: tuple[int, ...],
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """A decode case's attention, sequence by sequence, in `dtype` (default q's): q (B, Hq,
    Sq, D) against the dense cache k, v (B, Hkv, S_max, D) cut to each context length L_b,
    with bottom-right causal alignment (query t sees keys j < L_b - Sq + t + 1). Positions
    at or past L_b are never read: that is the specification the padding tests."""
    if len(lengths) != q.shape[0]:
        raise ValueError(f"{len(lengths)} context lengths for a batch of {q.shape[0]}")
    if any(not q.shape[2] <= length <= k.shape[2] for length in lengths):
        raise ValueError(f"context lengths {lengths} outside [Sq, S_max] = "
                         f"[{q.shape[2]}, {k.shape[2]}]")  # fmt: skip
    dtype = dtype or q.dtype
    # One (Hq · Sq × L_b) score block per sequence: Sq <= 16, so no chunking is needed
    # beyond the sequence loop. Each sequence is cut to L_b before it is converted, so a
    # float64 copy never holds the padding (a whole float64 cache can be tens of GB).
    outs = [
        reference_attention(
            *(t.to(dtype) for t in (q[b : b + 1], k[b : b + 1, :, :n], v[b : b + 1, :, :n])),
            causal=True,
            chunk_rows=q.shape[2],
        ).o
        for b, n in enumerate(lengths)
    ]
    return torch.cat(outs)


def check_decode_accuracy(
    case: Case, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor
) -> dict:
    """check_accuracy's rule for a decode case's output o (B, Hq, Sq, D).

    The slice is every sequence of the batch (kv head 0 and its group of q heads): the
    sequences differ in length, and a length mask that is wrong for some of them only
    shows there. The float64 reference and the baseline read each sequence's valid prefix
    only (`decode_reference`)."""
    group = case.heads_q // case.heads_kv
    if o.shape != q.shape:
        raise ValueError(f"o {tuple(o.shape)} differs from q {tuple(q.shape)}")
    lengths = case.context_lengths()
    q_s, k_s, v_s = q[:, :group].detach(), k[:, :1].detach(), v[:, :1].detach()
    ref = decode_reference(q_s, k_s, v_s, lengths, torch.float64)
    base = decode_reference(q_s, k_s, v_s, lengths)
    report = _tensor_report(o.detach(), o[:, :group].detach(), ref, base, max(lengths))
    return _output_only(report, f"all {case.batch} sequences, kv head 0, {_heads(group)}")


def _heads(group: int) -> str:
    return "q head 0" if group == 1 else f"q heads 0-{group - 1}"


def _output_only(report: dict, where: str) -> dict:
    """The accuracy dict of a forward-only check (fp8, decode): o's report and its slice."""
    return {
        "max_abs_err": report["max_abs_err"],
        "rel_l2_err": report["rel_l2_err"],
        "passed": report["passed"],
        "tensors": {"o": report},
        "slice": where,
    }
