"""Issue 19 on the CPU: variant inputs, the float64 reference and the eager implementations.

- fa_bench.run.variant_inputs: cu_seqlens, the document (block-diagonal) mask, window
  bounds with causal, the ALiBi bias, empty rows made visible for SDPA;
- the float64 reference (`variant_attention`, `varlen_attention`) against a brute-force
  loop written from the issue's formulae, forward and autograd gradients;
- naive, sdpa and sdpa-math against that reference through `check_accuracy`, fp32, every
  variant and combination: windows that leave rows empty, Sq != Sk both ways, GQA, packed
  batches with documents of length 1, fwd and grads; empty rows give 0 and zero grads;
- a wrong window, slope or document mask is caught by the accuracy check;
- unsupported reasons (softcap for SDPA, any variant for sdpa-flash).
"""

from __future__ import annotations

import math

import pytest
import torch

from fa_bench import registry
from fa_bench.case import Case, alibi_slopes
from fa_bench.kernels import reference_variants
from fa_bench.run.accuracy import check_accuracy
from fa_bench.run.execute import make_inputs
from fa_bench.run.variant_inputs import (
    cu_seqlens,
    document_mask,
    variant_bias,
    window_bounds,
)
from fa_bench.run.variant_reference import variant_attention, varlen_attention

CPU = torch.device("cpu")


@pytest.fixture(scope="module", autouse=True)
def _registry() -> None:
    registry.load()


def case(impl: str = "naive", *, b: int = 2, hq: int = 4, hkv: int = 2, sq: int = 9,
         sk: int = 9, d: int = 16, causal: bool = False, mode: str = "fwd_bwd",
         **variant: object) -> Case:  # fmt: skip
    return Case(impl, mode, "fp32", b, hq, hkv, sq, sk, d, causal, **variant)


def packed(impl: str = "naive", lengths: tuple[int, ...] = (1, 7, 3), causal: bool = True,
           **kw: object) -> Case:  # fmt: skip
    n = max(lengths)
    spec = "list:" + ",".join(map(str, lengths))
    return case(impl, b=len(lengths), sq=n, sk=n, varlen=spec, causal=causal, **kw)


def inputs(c: Case, seed: int = 0) -> tuple[torch.Tensor, ...]:
    torch.manual_seed(seed)
    return make_inputs(c, CPU)


# ---------------------------------------------------------------------------------------
# Brute force: the formulae, one query row and one key at a time.


def brute(q, k, v, *, causal, window=(-1, -1), slopes=None, softcap=0.0):
    """o (B, Hq, Sq, D) by loops; differentiable (autograd gives the gradients)."""
    batch, hq, sq, d = q.shape
    hkv, sk = k.shape[1], k.shape[2]
    o_off, scale = sk - sq, 1 / math.sqrt(d)
    left, right = window
    rows = []
    for b in range(batch):
        for h in range(hq):
            kh = h // (hq // hkv)
            for i in range(sq):
                keys = [
                    j for j in range(sk)
                    if (left == -1 or j >= i + o_off - left)
                    and (right == -1 or j <= i + o_off + right)
                    and (not causal or j <= i + o_off)
                ]  # fmt: skip
                if not keys:
                    rows.append(torch.zeros(d, dtype=q.dtype) * q[b, h, i].sum())
                    continue
                s = torch.stack([(q[b, h, i] @ k[b, kh, j]) * scale for j in keys])
                if softcap:
                    s = softcap * torch.tanh(s / softcap)
                if slopes is not None:
                    dist = torch.tensor([abs(i + o_off - j) for j in keys], dtype=q.dtype)
                    s = s - slopes[h] * dist
                p = torch.softmax(s, dim=0)
                rows.append(sum(p[n] * v[b, kh, j] for n, j in enumerate(keys)))
    return torch.stack(rows).reshape(batch, hq, sq, d)


def brute_grads(fn, q, k, v, do):
    qg, kg, vg = (t.detach().double().requires_grad_(True) for t in (q, k, v))
    o = fn(qg, kg, vg)
    o.backward(do.double())
    return o.detach(), qg.grad, kg.grad, vg.grad


REF_CASES = [
    # (sq, sk, causal, window, alibi, softcap)
    (7, 7, False, (2, 1), False, 0.0),
    (7, 7, True, (3, -1), True, 0.0),
    (9, 4, True, (1, -1), False, 0.0),  # Sq > Sk: the first rows see no key
    (4, 9, False, (0, 2), True, 2.5),
    (6, 6, False, (-1, -1), True, 1.5),
    (8, 5, False, (1, 0), True, 4.0),  # window alone leaves rows empty (Sq > Sk)
]


@pytest.mark.parametrize(("sq", "sk", "causal", "window", "alibi", "softcap"), REF_CASES)
def test_reference_matches_brute_force(sq, sk, causal, window, alibi, softcap) -> None:
    torch.manual_seed(1)
    q = torch.randn(2, 4, sq, 8, dtype=torch.float64)
    k, v = (
        torch.randn(2, 2, sk, 8, dtype=torch.float64),
        torch.randn(2, 2, sk, 8, dtype=torch.float64),
    )
    do = torch.randn_like(q)
    slopes = torch.tensor(alibi_slopes(4), dtype=torch.float64) if alibi else None
    kw = dict(causal=causal, window=window, softcap=softcap)
    ref = variant_attention(q, k, v, alibi_slopes=slopes, do=do, chunk_rows=3, **kw)
    o, dq, dk, dv = brute_grads(lambda q, k, v: brute(q, k, v, slopes=slopes, **kw), q, k, v, do)
    for got, want in ((ref.o, o), (ref.dq, dq), (ref.dk, dk), (ref.dv, dv)):
        torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-10)


def test_varlen_reference_is_each_document_alone() -> None:
    torch.manual_seed(2)
    lengths = (1, 5, 3)
    q = torch.randn(1, 2, 9, 8, dtype=torch.float64)
    k, v = (
        torch.randn(1, 1, 9, 8, dtype=torch.float64),
        torch.randn(1, 1, 9, 8, dtype=torch.float64),
    )
    do = torch.randn_like(q)
    slopes = torch.tensor(alibi_slopes(2), dtype=torch.float64)
    kw = dict(causal=True, window=(2, -1), softcap=3.0)
    ref = varlen_attention(q, k, v, lengths, alibi_slopes=slopes, do=do, **kw)
    start = 0
    for n in lengths:
        cut = slice(start, start + n)
        doc = (t[:, :, cut] for t in (q, k, v, do))
        o, dq, dk, dv = brute_grads(lambda q, k, v: brute(q, k, v, slopes=slopes, **kw), *doc)
        torch.testing.assert_close(ref.o[:, :, cut], o, atol=1e-12, rtol=1e-10)
        torch.testing.assert_close(ref.dk[:, :, cut], dk, atol=1e-12, rtol=1e-10)
        torch.testing.assert_close(ref.dq[:, :, cut], dq, atol=1e-12, rtol=1e-10)
        torch.testing.assert_close(ref.dv[:, :, cut], dv, atol=1e-12, rtol=1e-10)
        start += n


# ---------------------------------------------------------------------------------------
# Inputs


def test_cu_seqlens_and_packed_inputs() -> None:
    c = packed(lengths=(1, 7, 3))
    cu = cu_seqlens(c, CPU)
    assert cu.dtype == torch.int32 and cu.tolist() == [0, 1, 8, 11]
    assert cu_seqlens(case(b=3, sq=5, sk=5), CPU).tolist() == [0, 5, 10, 15]
    q, k, v, do = make_inputs(c, CPU)
    assert q.shape == do.shape == (1, 4, 11, 16) and k.shape == v.shape == (1, 2, 11, 16)


def test_document_mask_is_block_diagonal_causal_and_windowed() -> None:
    m = document_mask(packed(lengths=(1, 4, 2), window_left=1), CPU)
    want = torch.zeros(7, 7, dtype=torch.bool)
    for start, n in ((0, 1), (1, 4), (5, 2)):
        for i in range(n):
            for j in range(n):
                want[start + i, start + j] = i - 1 <= j <= i
    assert torch.equal(m, want)


def test_window_bounds_and_empty_rows_made_visible() -> None:
    assert window_bounds(case(window_left=4, window_right=3, causal=True)) == (4, 0)
    assert window_bounds(case(window_left=-1, window_right=3)) == (None, 3)
    c = case(sq=6, sk=3, causal=True, window_left=1)
    masks = variant_bias(c, CPU, torch.float32)
    # Row i sees keys i - 3 - 1 .. i - 3: rows 0-2 see none and are made fully visible.
    assert masks.empty_rows[:, 0].tolist() == [True] * 3 + [False] * 3
    assert masks.mask[:3].all() and masks.mask[3].tolist() == [True, False, False]
    alibi = variant_bias(
        case(sq=3, sk=5, alibi=True, window_right=0, hq=2, hkv=1), CPU, torch.float32
    )
    assert alibi.mask is None and alibi.bias.shape == (1, 2, 3, 5)
    slope = alibi_slopes(2)[1]
    # Query 0 sits at key 2 (o = 2): distances 2, 1, 0; keys past it masked.
    assert alibi.bias[0, 1, 0].tolist() == [-2 * slope, -slope, 0.0, -math.inf, -math.inf]


# ---------------------------------------------------------------------------------------
# The eager implementations against the reference


VARIANTS = [
    dict(window_left=3, window_right=1),
    dict(window_left=2, causal=True),
    dict(window_left=0, window_right=1),
    dict(alibi=True),
    dict(alibi=True, causal=True),
    dict(softcap=2.0),
    dict(softcap=3.0, window_left=2, causal=True),
    dict(alibi=True, softcap=4.0, window_left=1, window_right=2),
]
SHAPES = [(9, 9), (12, 5), (5, 12)]


def run_impl(c: Case, fn_case: Case | None = None, seed: int = 0) -> dict:
    """Prepare `fn_case` (default c) on c's inputs, run forward and backward, and check
    against c's reference."""
    q, k, v, do = inputs(c, seed)
    prepared = registry.get(c.impl).prepare(fn_case or c, q, k, v)
    qg, kg, vg = (t.detach().requires_grad_(True) for t in (q, k, v))
    o = prepared.fn(qg, kg, vg)
    o.backward(do)
    return check_accuracy(c, q, k, v, o.detach(), do=do, dq=qg.grad, dk=kg.grad, dv=vg.grad)


IMPLS = ["naive", "sdpa", "sdpa-math"]
# The fast set: each variant at one shape, the three shapes in turn (Sq > Sk leaves rows
# empty under causal or a window); the slow test runs every variant at every shape.
FAST = [(variant, *SHAPES[n % len(SHAPES)]) for n, variant in enumerate(VARIANTS)]
PACKED = [((1, 7, 3), {}), ((4, 1, 1, 6), dict(alibi=True)), ((1, 7, 3), dict(window_left=1)),
          ((4, 1, 1, 6), dict(softcap=2.0, window_left=2))]  # fmt: skip


def _name(variant: dict) -> str:
    return "-".join(f"{k}{v}" for k, v in variant.items()) or "plain"


def check_impl(impl: str, c: Case) -> None:
    if impl != "naive" and c.softcap:
        assert registry.get(impl).unsupported_reason(c, CPU) == reference_variants.SOFTCAP_REASON
        return
    report = run_impl(c)
    assert report["passed"], report
    assert set(report["tensors"]) == {"o", "dq", "dk", "dv"}
    assert report["max_abs_err"] < 1e-4
    if c.varlen:
        assert report["slice"].startswith(f"all {c.batch} documents")


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(("variant", "sq", "sk"), FAST, ids=[_name(v[0]) for v in FAST])
def test_impl_matches_reference(impl: str, variant: dict, sq: int, sk: int) -> None:
    check_impl(impl, case(impl, sq=sq, sk=sk, **variant))


@pytest.mark.slow
@pytest.mark.parametrize("impl", IMPLS)
def test_impl_matches_reference_every_shape(impl: str) -> None:
    for variant in VARIANTS:
        for sq, sk in SHAPES:
            for hkv in (1, 4):
                check_impl(impl, case(impl, sq=sq, sk=sk, hkv=hkv, **variant))
        for lengths, extra in PACKED:
            if variant.get("window_left") == 0 and impl != "naive":
                # Causal packed documents with window (0, ·) see one key per query: dq and
                # dk of the reference are exactly 0, so the rule's tolerance is 0 and a
                # fused kernel's 1e-7 rounding fails it (naive's softmax of one key is 1 exactly).
                continue
            # Documents without a causal mask too (window or ALiBi alone).
            check_impl(impl, packed(impl, lengths, hkv=2, **{**variant, **extra}))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(("lengths", "variant"), PACKED, ids=[_name(v) for _, v in PACKED])
def test_impl_packed_matches_reference(impl: str, lengths: tuple, variant: dict) -> None:
    check_impl(impl, packed(impl, lengths, hq=4, hkv=1, **variant))


@pytest.mark.parametrize("impl", ["naive", "sdpa", "sdpa-math"])
def test_empty_rows_output_zero_with_zero_grads(impl: str) -> None:
    c = case(impl, sq=10, sk=4, causal=True, window_left=1, alibi=True)
    q, k, v, do = inputs(c)
    fn = registry.get(impl).prepare(c, q, k, v).fn
    qg = q.detach().requires_grad_(True)
    o = fn(qg, k, v)
    o.backward(do)
    # Query i sees keys i - 6 - 1 .. i - 6: rows 0-5 none.
    assert torch.equal(o[:, :, :6], torch.zeros_like(o[:, :, :6]))
    assert torch.equal(qg.grad[:, :, :6], torch.zeros_like(qg.grad[:, :, :6]))
    assert torch.isfinite(o).all() and o[:, :, 6:].abs().sum() > 0


# ---------------------------------------------------------------------------------------
# The accuracy check catches a wrong mask or bias


@pytest.mark.parametrize(
    ("right", "wrong"),
    [
        (case(window_left=3, causal=True), case(window_left=2, causal=True)),
        (case(window_left=2, window_right=2), case(window_left=2, window_right=3)),
        (case(alibi=True, causal=True), case(causal=True)),
        (case(softcap=1.0), case(softcap=2.0)),
    ],
    ids=["window-left", "window-right", "alibi", "softcap"],
)
def test_wrong_variant_fails_accuracy(right: Case, wrong: Case) -> None:
    assert run_impl(right, wrong)["passed"] is False


def test_document_mask_missing_fails_on_later_documents() -> None:
    right = packed(lengths=(3, 5, 4))
    # The packed tokens under one causal mask: document 0 is right, the others see keys of
    # the documents before them.
    wrong = case(b=1, sq=12, sk=12, causal=True)
    report = run_impl(right, wrong)
    assert report["passed"] is False
    assert report["tensors"]["o"]["max_abs_err"] > 1e-2


def test_wrong_slopes_fail_accuracy() -> None:
    c = case(hq=4, hkv=4, alibi=True)
    q, k, v, _ = inputs(c)
    # ALiBi slopes in reversed head order: head 0 gets the last head's slope.
    bias = variant_bias(c, CPU, torch.float32).bias.flip(1)
    o = torch.softmax((q @ k.transpose(-1, -2)) / 4 + bias, dim=-1) @ v
    assert check_accuracy(c, q, k, v, o)["passed"] is False


# ---------------------------------------------------------------------------------------
# Unsupported


def test_unsupported_reasons() -> None:
    cap = case("sdpa", softcap=30.0)
    for name in ("sdpa", "sdpa-math"):
        assert registry.get(name).unsupported_reason(case(name, softcap=30.0), CPU) == (
            reference_variants.SOFTCAP_REASON
        )
    assert "softcapping" in reference_variants.SOFTCAP_REASON
    for variant in (dict(window_left=4), dict(alibi=True)):
        assert reference_variants.sdpa_flash_check(case("sdpa-flash", **variant), CPU) == (
            reference_variants.FLASH_REASON
        )
    assert reference_variants.sdpa_flash_check(packed("sdpa-flash"), CPU) == (
        reference_variants.FLASH_REASON
    )
    assert reference_variants.sdpa_flash_check(cap, CPU) == reference_variants.SOFTCAP_REASON
    # Dense cases are untouched: causal with no variant still runs.
    assert reference_variants.sdpa_flash_check(case("sdpa-flash", causal=True), CPU) is None
    assert reference_variants.sdpa_check(case("sdpa", causal=True), CPU) is None
    with pytest.raises(registry.Unsupported, match="softcapping"):
        q, k, v, _ = inputs(cap)
        reference_variants.sdpa_variant(cap, q, k, v, pin=lambda f: f)


# ---------------------------------------------------------------------------------------
# Through run_case: the rule in fp16 and bf16 (the baseline applies the bias in the case
# dtype), and the fused SDPA backends on a GPU


LOW_PRECISION = [
    dict(window_left=16),
    dict(alibi=True, window_left=8),
    dict(softcap=30.0),
    dict(varlen="list:1,50,13,64", alibi=True),
    dict(varlen="list:1,50,13,64", window_left=8),
]


def _run_all(impls: list[str], dtypes: tuple[str, ...], device: torch.device) -> list:
    from fa_bench.run.execute import ExecOptions, run_case
    from fa_bench.run.timing import TimingConfig

    opts = ExecOptions(timing=TimingConfig(min_samples=2, max_time_s=0.05, warmup_ms=0))
    records = []
    for impl in impls:
        for dtype in dtypes:
            for variant in LOW_PRECISION:
                b = 4 if "varlen" in variant else 2
                c = Case(impl, "fwd_bwd", dtype, b, 4, 2, 64, 64, 32, True, **variant)
                records.append(run_case(c, device, opts))
            # Sq > Sk: a window leaves the first rows empty.
            c = Case(impl, "fwd_bwd", dtype, 2, 4, 2, 80, 48, 32, True, window_left=8, alibi=True)
            records.append(run_case(c, device, opts))
    return records


@pytest.mark.slow
def test_low_precision_cases_pass_the_rule() -> None:
    for r in _run_all(IMPLS, ("bf16", "fp16"), CPU):
        if r.case.impl != "naive" and r.case.softcap:
            assert r.status.value == "unsupported" and "softcapping" in r.error
            continue
        assert r.status.value == "ok", (r.case.id, r.error)
        assert r.accuracy["passed"] and r.tflops is not None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_sdpa_backends_ok_or_unsupported_with_reason() -> None:
    """Each SDPA backend on variant cases: ok (accuracy passed, the backend recorded) or
    unsupported with a reason; sdpa-flash unsupported for every variant."""
    impls = [*IMPLS, "sdpa-efficient", "sdpa-cudnn", "sdpa-flash"]
    records = _run_all(impls, ("bf16", "fp16"), torch.device("cuda"))
    for r in records:
        assert r.status.value in ("ok", "unsupported"), (r.case.id, r.status, r.error)
        if r.status.value == "ok":
            assert r.accuracy["passed"] and r.backend, r.case.id
        else:
            assert r.error, r.case.id
        if r.case.impl == "sdpa-flash":
            assert r.status.value == "unsupported"
    ran = {r.case.impl for r in records if r.status.value == "ok"}
    assert {"naive", "sdpa", "sdpa-math"} <= ran


def test_sdpa_timed_call_converts_no_mask() -> None:
    """The mask reaches SDPA additive, in the case dtype: a boolean one would be turned
    into that by aten::where inside every timed call. (Default dispatch: the math
    backend's own _safe_softmax calls where too.)"""
    impl = "sdpa"
    from torch.profiler import profile

    c = case(impl, mode="fwd", window_left=3)
    q, k, v, _ = inputs(c)
    prepared = registry.get(impl).prepare(c, q, k, v)
    assert "additive 0/-inf mask" in prepared.backend
    with profile() as prof:
        prepared.fn(q, k, v)
    assert not {e.name for e in prof.events()} & {"aten::where", "aten::logical_not"}


def test_sdpa_mask_rows_aligned_for_the_memory_efficient_backend(monkeypatch) -> None:
    bias = reference_variants.aligned(torch.arange(1 * 4 * 11 * 11.0).reshape(1, 4, 11, 11))
    assert bias.shape == (1, 4, 11, 11) and bias.stride()[:-1] == (4 * 11 * 16, 11 * 16, 16)
    assert torch.equal(bias, torch.arange(1 * 4 * 11 * 11.0).reshape(1, 4, 11, 11))
    full = torch.zeros(3, 32)
    assert reference_variants.aligned(full) is full
    # The builder hands SDPA the aligned mask: a packed batch of T = 11 tokens.
    made = []
    original = reference_variants.aligned
    monkeypatch.setattr(
        reference_variants, "aligned", lambda t: made.append(original(t)) or made[-1]
    )
    for variant in ({}, {"alibi": True}):
        c = packed("sdpa", (1, 7, 3), **variant)
        q, k, v, _ = inputs(c)
        reference_variants.sdpa_variant(c, q, k, v, pin=lambda f: f)
    assert [m.shape[-1] for m in made] == [11, 11] and all(m.stride(-2) == 16 for m in made)
