"""FLOP and minimal-HBM-byte models. Pure functions; units are in the names.

FLOPs follow the FlashAttention-3 convention: forward = 2·B·Hq·Sq·L̄·(D + Dv) where L̄ is
the mean number of keys each query attends (so causal with Sq != Sk and fully masked rows
are counted exactly), backward = 2.5× forward (five matmuls against two), fwd_bwd = 3.5×.

Bytes are the least any implementation must move through HBM: every input read once and
every output written once; K and V counted with the KV head count.

Decode (forward only) counts each sequence against its own context length L_b
(`Case.context_lengths()`): FLOPs 4·Hq·D·Σ_b pairs(Sq, L_b), bytes the valid K/V cache
(Σ_b L_b·Hkv·D, twice) plus q and o, no LSE. The cache's unused tail is not counted: a
kernel has no reason to read it.

Variants (issue 19): FLOPs count only the attended pairs, exactly, under causal and a
window (`variants.window_pairs`), per sequence; a packed (varlen) case counts each
document as its own Sq = Sk = L_b sequence. Bytes count the packed tokens T, no padding;
ALiBi slopes, masks and softcap add nothing (computed in the kernel, or too small).

fp8 (e4m3, forward only): q, k, v at 1 byte, o at 2 (bf16); the per-tensor scales add
nothing. FLOPs are counted as for any dtype.
"""

from __future__ import annotations

from fa_bench.case import Case, DType, Mode
from fa_bench.variants import window_pairs

BWD_FLOP_FACTOR = 2.5
LSE_ITEMSIZE = 4  # the log-sum-exp saved for backward is float32 in every fused kernel
OUT_ITEMSIZE_FP8 = 2  # an fp8 forward's output is bf16


def attended_pairs(seqlen_q: int, seqlen_k: int, causal: bool) -> int:
    """Number of (query, key) pairs that take part in attention, Sq·L̄."""
    if not causal:
        return seqlen_q * seqlen_k
    # Bottom-right causal: query i sees keys 0 .. i + (Sk - Sq), clipped to [0, Sk].
    offset = seqlen_k - seqlen_q
    first = max(0, -offset)  # earlier rows see no key at all
    rows = seqlen_q - first
    if rows <= 0:
        return 0
    # sum over i = first .. Sq-1 of (i + offset + 1): an arithmetic series
    lo = first + offset + 1
    hi = seqlen_q - 1 + offset + 1
    return rows * (lo + hi) // 2


def case_pairs(case: Case) -> int:
    """Attended (query, key) pairs of one head over the batch: per sequence, under the
    case's causal mask and window; a packed case's documents each against themselves."""
    left, right = case.window_left, case.window_right
    if case.varlen:
        return sum(window_pairs(n, n, case.causal, left, right) for n in case.sequence_lengths())
    return case.batch * window_pairs(case.seqlen_q, case.seqlen_k, case.causal, left, right)


def forward_flops(case: Case) -> int:
    d = case.head_dim
    return 2 * case.heads_q * case_pairs(case) * (d + d)


def decode_flops(case: Case) -> int:
    """2·D for QK^T plus 2·D for PV, per attended pair, each sequence against its own L_b."""
    pairs = sum(attended_pairs(case.seqlen_q, n, True) for n in case.context_lengths())
    return 4 * case.heads_q * case.head_dim * pairs


def decode_bytes(case: Case) -> int:
    """Read the valid K and V of every sequence and q; write o."""
    kv = sum(case.context_lengths()) * case.heads_kv * case.head_dim * 2 * case.dtype.itemsize
    return kv + 2 * _q_bytes(case)


def case_flops(case: Case) -> float:
    if case.mode is Mode.DECODE:
        return decode_flops(case)
    fwd = forward_flops(case)
    return {
        Mode.FWD: fwd,
        Mode.BWD: BWD_FLOP_FACTOR * fwd,
        Mode.FWD_BWD: (1 + BWD_FLOP_FACTOR) * fwd,
    }[case.mode]


def _key_tokens(case: Case) -> int:
    """Key tokens over the batch: the packed T of a varlen case (Sk = Sq per document)."""
    return case.total_tokens if case.varlen else case.batch * case.seqlen_k


def _q_bytes(case: Case) -> int:
    return case.heads_q * case.total_tokens * case.head_dim * case.dtype.itemsize


def _kv_bytes(case: Case) -> int:
    """One of K or V."""
    return case.heads_kv * _key_tokens(case) * case.head_dim * case.dtype.itemsize


def _o_bytes(case: Case) -> int:
    """The output: q's size, except an fp8 case's, whose output is bf16 (2 bytes)."""
    if case.dtype is DType.FP8_E4M3:
        return case.heads_q * case.total_tokens * case.head_dim * OUT_ITEMSIZE_FP8
    return _q_bytes(case)


def forward_bytes(case: Case) -> int:
    """Read Q, K, V; write O."""
    return _q_bytes(case) + _o_bytes(case) + 2 * _kv_bytes(case)


def backward_bytes(case: Case) -> int:
    """Read Q, K, V, O, dO and LSE; write dQ, dK, dV."""
    lse = case.heads_q * case.total_tokens * LSE_ITEMSIZE
    return 3 * _q_bytes(case) + 2 * _kv_bytes(case) + lse + _q_bytes(case) + 2 * _kv_bytes(case)


def case_bytes(case: Case) -> int:
    """fwd_bwd counts the two passes as separate kernels: O and LSE go through HBM between them."""
    if case.mode is Mode.DECODE:
        return decode_bytes(case)
    return {
        Mode.FWD: forward_bytes(case),
        Mode.BWD: backward_bytes(case),
        Mode.FWD_BWD: forward_bytes(case) + backward_bytes(case),
    }[case.mode]


def tflops(flops: float, latency_ms: float) -> float:
    return flops / (latency_ms * 1e-3) / 1e12


def gbps(nbytes: float, latency_ms: float) -> float:
    return nbytes / (latency_ms * 1e-3) / 1e9
