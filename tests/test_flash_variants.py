"""Our Triton kernel's variants (issue 19): sliding windows, ALiBi, softcap, packed
varlen batches, forward and gradients, against the float64 reference
(fa_bench.run.variant_reference) under the accuracy rule (fa_bench.run.accuracy); the
argument checks; the skipped blocks.

CPU tests run the kernels in the Triton interpreter in fp32 (and fp16): bf16 dots are
wrong there. The `slow` tier runs the grid of every combination; `-m gpu` tests live in
tests/test_flash_variants_gpu.py.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

pytest.importorskip("triton")

from fa_bench.kernels import flash_attention, flash_attention_varlen
from fa_bench.kernels.flash_config import FlashConfig
from fa_bench.run.accuracy import _tensor_report
from fa_bench.run.variant_reference import variant_attention

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
cpu_only = pytest.mark.skipif(not INTERPRETED, reason="needs TRITON_INTERPRET=1 (CPU runs)")
pytestmark = cpu_only

# Several blocks per sequence in both kernels' tilings, and a fast interpreter.
SMALL = FlashConfig(block_m=32, block_n=16, bwd_block_m=16, bwd_block_n=32)
NAMES = ("o", "dq", "dk", "dv")


def make(b, hq, hk, sq, sk, d, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)

    def one(h, s):
        return torch.randn((b, h, s, d), generator=g).to(dtype).requires_grad_()

    return one(hq, sq), one(hk, sk), one(hk, sk)


def slopes_for(heads: int, batch: int | None = None) -> torch.Tensor:
    """Steep ALiBi slopes (0.5, 0.25, ...) per head; with `batch`, a (batch, heads) table
    whose rows differ (per-sequence slopes, as flash-attn allows)."""
    base = torch.tensor([0.5 ** (h + 1) for h in range(heads)], dtype=torch.float32)
    if batch is None:
        return base
    return torch.stack([base * (1 + 0.5 * b) for b in range(batch)])


def reference(q, k, v, do, dtype, slopes, **kw):
    """variant_attention on (B, H, S, D) in `dtype`, per batch row (per-batch slopes)."""
    outs = []
    for b in range(q.shape[0]):
        s = None if slopes is None else (slopes[b] if slopes.dim() == 2 else slopes)
        one = [t[b : b + 1].detach().to(dtype) for t in (q, k, v, do)]
        outs.append(variant_attention(*one[:3], do=one[3], alibi_slopes=s, **kw))
    return [torch.cat([getattr(r, n) for r in outs]) for n in (*NAMES, "lse")]


def assert_rule(ours, ref, base, terms: int) -> None:
    """The project's accuracy rule (fa_bench.run.accuracy) on every tensor."""
    for name, x, r, b in zip(NAMES, ours, ref, base, strict=False):
        report = _tensor_report(x, x, r, b, terms)
        assert report["passed"], (name, report)


def run_variant(q, k, v, *, causal, window=(-1, -1), slopes=None, softcap=0.0, config=SMALL):
    """Ours (o, dq, dk, dv, lse) and the float64 reference and the same-dtype baseline."""
    kw = dict(causal=causal, window=window, softcap=softcap)
    o, lse = flash_attention(
        q, k, v, alibi_slopes=slopes, config=config, return_lse=True, **kw
    )  # fmt: skip
    do = torch.randn(o.shape, generator=torch.Generator().manual_seed(1)).to(o.dtype)
    grads = torch.autograd.grad(o, (q, k, v), do)
    ref = reference(q, k, v, do, torch.float64, slopes, **kw)
    base = reference(q, k, v, do, q.dtype, slopes, **kw)
    return (o, *grads, lse), ref, base


def check(q, k, v, grads: bool = True, **kw) -> tuple:
    ours, ref, base = run_variant(q, k, v, **kw)
    n = 4 if grads else 1
    assert_rule(ours[:n], ref[:n], base[:n], max(k.shape[2], q.shape[2]))
    lse, ref_lse = ours[4], ref[4]
    assert torch.equal(torch.isinf(lse), torch.isinf(ref_lse))
    finite = torch.isfinite(ref_lse)
    torch.testing.assert_close(lse[finite].double(), ref_lse[finite], atol=1e-5, rtol=1e-5)
    return ours, ref


# (B, Hq, Hkv, Sq, Sk, D): tails in both axes, Sq != Sk both ways, GQA, head_dim not a
# power of two.
SHAPES = [(1, 2, 2, 70, 70, 16), (2, 4, 2, 45, 83, 24), (1, 3, 1, 90, 50, 40)]
# (0, 0) leaves each row one key: its exact dq is 0 and so is the rule's fp32 tolerance,
# which a kernel with delta = rowsum(dO·O) misses by rounding (docs/kernel.md, Accuracy):
# the grid takes (1, 0), test_rows_without_keys_... checks (0, 0)'s forward.
WINDOWS = [(-1, -1), (20, -1), (7, 3), (-1, 5), (1, 0)]

FAST = [
    # a causal sliding window at Sq != Sk with GQA
    dict(shape=SHAPES[1], causal=True, window=(20, -1)),
    # a two-sided window, non-causal, Sq > Sk, head_dim 40
    dict(shape=SHAPES[2], causal=False, window=(7, 3)),
    # ALiBi (per-head slopes) alone, non-causal
    dict(shape=SHAPES[0], causal=False, alibi=True),
    # softcap alone, causal
    dict(shape=SHAPES[0], causal=True, softcap=2.0),
    # everything at once, per-batch slopes
    dict(shape=SHAPES[1], causal=True, window=(9, -1), alibi="batch", softcap=3.0),
]


def _slopes(alibi: object, batch: int, heads: int) -> torch.Tensor | None:
    if not alibi:
        return None
    return slopes_for(heads, batch if alibi == "batch" else None)


@pytest.mark.slow
@pytest.mark.parametrize("spec", FAST, ids=lambda s: str(sorted(s.items())))
def test_variant_forward_and_grads(spec):
    b, hq, hk, sq, sk, d = spec["shape"]
    q, k, v = make(b, hq, hk, sq, sk, d)
    check(
        q, k, v, causal=spec["causal"], window=spec.get("window", (-1, -1)),
        slopes=_slopes(spec.get("alibi"), b, hq), softcap=spec.get("softcap", 0.0),
    )  # fmt: skip


def test_every_variant_at_once_fast():
    """The fast tier's one forward-and-gradients check: a causal window, per-batch ALiBi
    slopes and a softcap, GQA, Sq != Sk, head_dim 24, tails."""
    q, k, v = make(2, 2, 1, 40, 57, 24, seed=5)
    check(q, k, v, causal=True, window=(9, -1), slopes=slopes_for(2, 2), softcap=3.0)


@pytest.mark.slow
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("alibi", [False, "batch"])
@pytest.mark.parametrize("softcap", [0.0, 2.5])
def test_variant_grid(shape, causal, window, alibi, softcap):
    """Every combination of window, ALiBi and softcap, causal and not, on each shape."""
    b, hq, hk, sq, sk, d = shape
    q, k, v = make(b, hq, hk, sq, sk, d, seed=sq + sk)
    check(q, k, v, causal=causal, window=window, slopes=_slopes(alibi, b, hq), softcap=softcap)


@pytest.mark.slow
def test_fp16_softcap_50_window_alibi():
    """fp16 (its dots work in the interpreter) with a realistic softcap of 50."""
    q, k, v = make(1, 2, 1, 64, 96, 32, dtype=torch.float16, seed=3)
    check(q, k, v, causal=True, window=(24, -1), slopes=slopes_for(2), softcap=50.0)


def test_rows_without_keys_output_zero_and_have_zero_grads():
    """Sq > Sk with a causal window: the first Sq - Sk rows see no key: output 0, lse
    -inf, no NaN anywhere, zero dq. A window (0, 0) leaves the other rows one key each."""
    q, k, v = make(1, 2, 2, 60, 25, 16)
    (o, dq, dk, dv, lse), _ = check(q, k, v, causal=True, window=(4, -1), slopes=slopes_for(2))
    empty = slice(0, 60 - 25)
    assert torch.all(o[:, :, empty] == 0) and torch.all(dq[:, :, empty] == 0)
    assert torch.all(torch.isneginf(lse[:, :, empty]))
    assert all(torch.isfinite(t).all() for t in (o, dq, dk, dv))
    # each row sees exactly its diagonal key: o = v there (forward only, see WINDOWS)
    (o, *_), _ = check(q, k, v, grads=False, causal=False, window=(0, 0), softcap=1.5)
    torch.testing.assert_close(o[:, :, 35:], v[:, :, :25].detach(), atol=1e-6, rtol=0)


def test_window_skips_the_blocks_no_row_sees():
    """One query block (32 rows) at the end of 128 keys with a left window of 16: keys
    [0, 80) are outside every row's window. They hold NaN: a kernel that loaded their
    blocks (forward or dQ) would spread it (0 · NaN), ours skips them."""
    q, k, v = make(1, 2, 2, 32, 128, 16)
    with torch.no_grad():
        k[:, :, :80] = float("nan")
        v[:, :, :80] = float("nan")
    o = flash_attention(q, k, v, causal=True, window=(16, -1), config=SMALL)
    dq, dk, dv = torch.autograd.grad(o, (q, k, v), torch.ones_like(o))
    assert torch.isfinite(o).all() and torch.isfinite(dq).all()
    assert torch.isfinite(dk[:, :, 80:]).all() and torch.isfinite(dv[:, :, 80:]).all()
    # and the same without the window reads them
    assert torch.isnan(flash_attention(q.detach(), k.detach(), v.detach(), config=SMALL)).any()


def test_windows_wider_than_the_sequences_are_the_unbounded_ones():
    """A bound past every index (even past int32) gives what -1 (unbounded) gives."""
    q, k, v = make(1, 2, 2, 40, 30, 16)
    for huge in (70, 2**40):
        a = flash_attention(q, k, v, window=(huge, huge), config=SMALL)
        dense = flash_attention(q, k, v, window=(-1, -1), config=SMALL)
        assert torch.allclose(a, dense, atol=1e-6, rtol=0)
        b = flash_attention(q, k, v, causal=True, window=(huge, -1), config=SMALL)
        c = flash_attention(q, k, v, causal=True, window=(-1, 3), config=SMALL)
        assert torch.allclose(b, c, atol=1e-6, rtol=0)


def test_dense_arguments_give_the_dense_result():
    """window=(-1, -1), no slopes, softcap 0 is the dense kernel, bit for bit."""
    q, k, v = make(1, 2, 2, 40, 40, 16)
    a = flash_attention(q, k, v, causal=True, config=SMALL)
    b = flash_attention(q, k, v, causal=True, config=SMALL, window=(-1, -1), softcap=0)
    assert torch.equal(a, b)


def test_variant_backward_is_deterministic():
    q, k, v = make(1, 2, 1, 40, 40, 16)
    kw = dict(causal=True, window=(10, -1), alibi_slopes=slopes_for(2), softcap=2.0)
    runs = []
    for _ in range(2):
        o = flash_attention(q, k, v, config=SMALL, **kw)
        runs.append(torch.autograd.grad(o, (q, k, v), torch.ones_like(o)))
    assert all(torch.equal(a, b) for a, b in zip(*runs, strict=True))


def test_softcap_tanh_is_the_fast_one_for_16_bit_inputs_only():
    """SOFTCAP 2 (tanh.approx.f32 on a GPU) for fp16/bf16, 1 (libdevice) for fp32, 0 off."""
    from fa_bench.kernels.flash_validate import make_variant

    def flag(dtype, softcap):
        q = torch.zeros((1, 2, 4, 16), dtype=dtype)
        kw = dict(causal=False, window=(-1, -1), alibi_slopes=None, batch=1, seq_q=4, seq_k=4)
        variant = make_variant(q, softcap=softcap, **kw)
        return None if variant is None else variant.kernel_args()["SOFTCAP"]

    assert flag(torch.bfloat16, 50.0) == 2 and flag(torch.float16, 50.0) == 2
    assert flag(torch.float32, 50.0) == 1
    assert flag(torch.bfloat16, 0.0) is None  # no variant at all: the dense launch


def test_one_pass_backward_refuses_variants_but_runs_their_forward():
    q, k, v = make(1, 2, 2, 20, 20, 16)
    o = flash_attention(q, k, v, window=(4, 0), config=SMALL, deterministic=False)
    ref = flash_attention(q, k, v, window=(4, 0), config=SMALL)
    assert torch.equal(o, ref)
    with pytest.raises(ValueError, match=r"deterministic=False.*window"):
        o.sum().backward()


# ---------------------------------------------------------------------------------------
# Packed varlen batches
# ---------------------------------------------------------------------------------------


def cumulative(lengths: list[int]) -> torch.Tensor:
    return torch.tensor([0, *itertools_accumulate(lengths)], dtype=torch.int32)


def itertools_accumulate(lengths: list[int]) -> list[int]:
    total, out = 0, []
    for n in lengths:
        total += n
        out.append(total)
    return out


def check_varlen(len_q, len_k, hq, hk, d, *, causal, window=(-1, -1), alibi=False, softcap=0.0):
    """Ours on a packed batch against each sequence's own float64 reference (and its
    same-dtype baseline) under the accuracy rule; (H, T) lse."""
    g = torch.Generator().manual_seed(len(len_q) + sum(len_k))
    tq, tk = sum(len_q), sum(len_k)
    q, k, v = (
        torch.randn((t, h, d), generator=g).requires_grad_()
        for t, h in ((tq, hq), (tk, hk), (tk, hk))
    )
    cq, ck = cumulative(len_q), cumulative(len_k)
    slopes = slopes_for(hq, len(len_q)) if alibi else None
    kw = dict(causal=causal, window=window, softcap=softcap)
    o, lse = flash_attention_varlen(
        q, k, v, cq, ck, max(len_q), max(len_k), alibi_slopes=slopes, config=SMALL,
        return_lse=True, **kw,
    )  # fmt: skip
    assert o.shape == q.shape and lse.shape == (hq, tq)
    do = torch.randn(o.shape, generator=g)
    grads = torch.autograd.grad(o, (q, k, v), do)
    # each sequence's reference, packed back into (T, H, D) (lse (H, T)): the rule then
    # holds on the whole batch, as the runner checks a packed case
    refs = {torch.float64: [], torch.float32: []}
    for b in range(len(len_q)):
        rows, keys = slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])

        def seq(t, cut):  # (T, H, D) -> (1, H, S, D)
            return t[cut].transpose(0, 1).unsqueeze(0)

        one = (seq(q, rows), seq(k, keys), seq(v, keys), seq(do, rows))
        s_b = None if slopes is None else slopes[b : b + 1]
        for dtype, out in refs.items():
            out.append(reference(*one, dtype, s_b, **kw))

    def packed(parts, i):  # (1, H, S, D) pieces -> (T, H, D); lse (1, H, S) -> (H, T)
        if i == 4:
            return torch.cat([p[i][0] for p in parts], dim=1)
        return torch.cat([p[i][0].transpose(0, 1) for p in parts])

    ref = [packed(refs[torch.float64], i) for i in range(5)]
    base = [packed(refs[torch.float32], i) for i in range(5)]
    assert_rule((o, *grads), ref[:4], base[:4], max(*len_q, *len_k))
    assert torch.equal(torch.isinf(lse), torch.isinf(ref[4]))
    finite = torch.isfinite(ref[4])
    torch.testing.assert_close(lse[finite].double(), ref[4][finite], atol=1e-5, rtol=1e-5)


def test_varlen_causal_with_length_one_sequences():
    check_varlen([5, 37, 1, 1], [5, 37, 1, 1], 2, 1, 16, causal=True)


def test_varlen_empty_sequences_are_skipped():
    """Zero-length sequences (flash-attn allows them): the others' results are the dense
    kernel's on each sequence, and the gradients stay finite."""
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn((12, 2, 16), generator=g).requires_grad_() for _ in range(3))
    cu = torch.tensor([0, 0, 5, 5, 12], dtype=torch.int32)
    o = flash_attention_varlen(q, k, v, cu, cu, 7, 7, causal=True, config=SMALL)
    o.sum().backward()
    for a, b in ((0, 5), (5, 12)):
        one = [t[a:b].detach().transpose(0, 1)[None] for t in (q, k, v)]
        dense = flash_attention(*one, causal=True, config=SMALL)[0].transpose(0, 1)
        assert torch.equal(o[a:b], dense)
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


def test_varlen_sq_ne_sk_gqa_window_alibi_softcap():
    """Per-sequence Sq != Sk (bottom-right per sequence), GQA 2:1, per-sequence slopes."""
    check_varlen(
        [5, 20, 1], [9, 3, 35], 2, 1, 24, causal=True, window=(6, -1), alibi=True, softcap=2.0
    )


@pytest.mark.slow
def test_varlen_longer_mixed_sequences():
    check_varlen(
        [5, 40, 1, 33], [9, 20, 3, 50], 4, 2, 24, causal=True, window=(6, -1), alibi=True,
        softcap=2.0,
    )  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("window", [(-1, -1), (8, 3), (1, 0)])
@pytest.mark.parametrize("causal", [False, True])
def test_varlen_grid(window, causal):
    check_varlen([17, 64, 1, 30], [17, 64, 2, 9], 2, 1, 40, causal=causal, window=window,
                 alibi=True, softcap=0.0 if causal else 3.0)  # fmt: skip


def test_varlen_accepts_strided_packed_views():
    """(T, H, D) views of a (T, 3, H, D) qkv buffer (flash-attn's packed qkv): no copy."""
    lengths = [7, 20]
    qkv = torch.randn(27, 3, 2, 16)
    q, k, v = qkv.unbind(1)
    cu = cumulative(lengths)
    o = flash_attention_varlen(q, k, v, cu, cu, 20, 20, causal=True, config=SMALL)
    dense = flash_attention(
        q[7:].transpose(0, 1)[None], k[7:].transpose(0, 1)[None], v[7:].transpose(0, 1)[None],
        causal=True, config=SMALL,
    )  # fmt: skip
    torch.testing.assert_close(o[7:], dense[0].transpose(0, 1), atol=1e-6, rtol=1e-6)
