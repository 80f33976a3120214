"""Issue 19's variants (window, ALiBi, softcap, packed batches) in flex, FA4, flash-attn,
xFormers and our adapters' `unsupported`.

flex: its score_mod / mask_mod and block mask run *eagerly* on the CPU (compiled flex is
CUDA-only here) against a float64 reference of the issue's semantics written out below,
forward and gradients. The peers run against fake packages that compute the variant
semantics in their own layouts and spellings (FA4's None for an unbounded window side,
flash-attn's -1, xFormers' bias classes, (T, H, D) with cu_seqlens for packed batches), so
the adapters' keyword plumbing is what is checked. The `gpu` tests run the real flex and
FA4 on the H200.
"""

from __future__ import annotations

import itertools
import math
import sys

import pytest
import torch
import variant_peer_fakes

from fa_bench import registry
from fa_bench.case import Case, alibi_slopes
from fa_bench.kernels import fa4_impl, flash_attn_impl, reference_variants_flex, xformers_impl
from fa_bench.registry import Unsupported

registry.load()
CPU = torch.device("cpu")
# Eager flex says it materialises the scores: that is what the CPU tests want.
pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")


def case_of(impl: str = "flex", mode: str = "fwd", **over: object) -> Case:
    fields: dict = dict(impl=impl, mode=mode, dtype="fp32", batch=2, heads_q=4, heads_kv=2,
                        seqlen_q=24, seqlen_k=24, head_dim=16, causal=False)  # fmt: skip
    fields.update(over)
    return Case(**fields)


def packed(lengths: tuple[int, ...], **over: object) -> dict:
    spec = "list:" + ",".join(map(str, lengths))
    return dict(batch=len(lengths), seqlen_q=max(lengths), seqlen_k=max(lengths),
                varlen=spec, **over)  # fmt: skip


# The cases: every variant alone and in combination; rows a window leaves empty (left and
# right both bounded away from the diagonal), Sq != Sk, GQA, packed with documents of 1.
VARIANTS = {
    "window": dict(window_left=5, window_right=3),
    "window-left-causal": dict(window_left=6, causal=True),
    "window-empty-rows": dict(seqlen_q=20, seqlen_k=8, window_left=2, window_right=1),
    "window-sq-ne-sk-causal": dict(seqlen_q=9, seqlen_k=24, window_left=4, causal=True),
    "window-right-only": dict(window_right=2),
    "alibi": dict(alibi=True),
    "alibi-causal-sq-ne-sk": dict(alibi=True, causal=True, seqlen_q=7, seqlen_k=20),
    "softcap": dict(softcap=0.5),
    "softcap-window-causal": dict(softcap=1.5, window_left=4, causal=True),
    "all-three": dict(softcap=2.0, alibi=True, window_left=3, window_right=2),
    "packed": packed((5, 1, 17, 9)),
    "packed-causal": packed((1, 12, 3, 8), causal=True),
    "packed-all": packed((7, 1, 11, 4), causal=True, alibi=True, softcap=1.0, window_left=3),
    "packed-window-both": packed((6, 10, 1), window_left=2, window_right=1),
}


def reference(case: Case, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The issue's semantics in float64, one sequence (or document) at a time: softcap,
    then ALiBi, then the window / causal mask; a row with no visible key outputs 0."""
    q, k, v = (t.double() for t in (q, k, v))
    group = case.heads_q // case.heads_kv
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    if case.varlen:
        bounds = [0, *itertools.accumulate(case.sequence_lengths())]
        parts = [(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b]) for a, b in itertools.pairwise(bounds)]
        return torch.cat([_attend(case, *p) for p in parts], dim=2)
    return _attend(case, q, k, v)


def _attend(case: Case, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    sq, sk = q.shape[2], k.shape[2]
    s = (q @ k.transpose(-2, -1)) / math.sqrt(case.head_dim)
    if case.softcap:
        s = case.softcap * torch.tanh(s / case.softcap)
    i = torch.arange(sq, dtype=torch.float64)[:, None] + (sk - sq)
    j = torch.arange(sk, dtype=torch.float64)[None, :]
    if case.alibi:
        slopes = torch.tensor(alibi_slopes(case.heads_q), dtype=torch.float64)
        s = s - slopes[:, None, None] * (i - j).abs()
    visible = torch.ones(sq, sk, dtype=torch.bool)
    if case.window_left >= 0:
        visible &= j >= i - case.window_left
    right = 0 if case.causal else case.window_right
    if case.causal and case.window_right >= 0:
        right = min(right, case.window_right)
    if right >= 0:
        visible &= j <= i + right
    s = s.masked_fill(~visible, float("-inf"))
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    return p @ v


def inputs(case: Case, seed: int = 0, grad: bool = True) -> tuple[torch.Tensor, ...]:
    """q, k, v in the contract's layouts: (B, H, S, D), or (1, H, T, D) packed."""
    gen = torch.Generator().manual_seed(seed)
    batch, sq, sk = case.batch, case.seqlen_q, case.seqlen_k
    if case.varlen:
        batch, sq = 1, case.total_tokens
        sk = sq
    shapes = ((batch, case.heads_q, sq, case.head_dim), (batch, case.heads_kv, sk, case.head_dim))
    q = torch.randn(*shapes[0], generator=gen)
    k, v = (torch.randn(*shapes[1], generator=gen) for _ in range(2))
    return tuple(t.requires_grad_(grad) for t in (q, k, v))


def assert_matches(case: Case, fn, grads: bool = True, tol: float = 2e-5) -> None:
    """fn's output and gradients against the float64 reference's."""
    q, k, v = inputs(case, grad=grads)
    out = fn(q, k, v)
    ref_inputs = [t.detach().double().requires_grad_(True) for t in (q, k, v)]
    ref = reference(case, *ref_inputs)
    torch.testing.assert_close(out.double(), ref.detach(), atol=tol, rtol=tol)
    if not grads:
        return
    dout = torch.randn_like(ref)
    out.backward(dout.to(out.dtype))
    ref.backward(dout)
    for t, r in zip((q, k, v), ref_inputs, strict=True):
        torch.testing.assert_close(t.grad.double(), r.grad, atol=tol * 10, rtol=tol * 10)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_this_reference_is_the_projects(name: str) -> None:
    """The reference above agrees with run/variant_reference.py's (the accuracy check's),
    output and gradients, so passing it here means passing the benchmark's check."""
    from fa_bench.run.variant_reference import case_reference

    case = case_of(**VARIANTS[name])
    q, k, v = (t.detach().double().requires_grad_(True) for t in inputs(case))
    ours = reference(case, q, k, v)
    do = torch.randn_like(ours)
    ours.backward(do)
    project = case_reference(case, q.detach(), k.detach(), v.detach(), do)
    torch.testing.assert_close(ours.detach(), project.o, atol=1e-12, rtol=1e-12)
    for t, grad in zip((q, k, v), (project.dq, project.dk, project.dv), strict=True):
        torch.testing.assert_close(t.grad, grad, atol=1e-10, rtol=1e-10)


# ---------------------------------------------------------------------------------------
# flex, eagerly


def _eager_flex(case: Case):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    q, k, v = inputs(case, grad=False)
    return reference_variants_flex.flex_variant(
        case, q, k, v, flex=flex_attention, block_mask_fn=create_block_mask
    ).fn


@pytest.mark.parametrize("name", list(VARIANTS))
def test_flex_variant_matches_float64(name: str) -> None:
    """Forward only: flex has no backward on the CPU (its gradients: the gpu test)."""
    case = case_of(**VARIANTS[name])
    assert_matches(case, _eager_flex(case), grads=False)


def test_flex_rows_without_keys_are_zero() -> None:
    """Sq 20 > Sk 8 with a (2, 1) window: query i sees keys i - 12 - 2 .. i - 12 + 1, so
    rows 0..10 see none; flex gives them 0, as the reference does."""
    case = case_of(**VARIANTS["window-empty-rows"])
    ref = reference(case, *inputs(case, grad=False))
    assert (ref[:, :, :11] == 0).all() and (ref[:, :, 11:].abs() > 0).all()
    assert_matches(case, _eager_flex(case), grads=False)


def test_flex_block_mask_skips_blocks_outside_the_window() -> None:
    """The block mask is sparse: a 128-token window over 1024 keys leaves most blocks out,
    and a packed batch's other documents too (flex never visits them)."""
    from torch.nn.attention.flex_attention import create_block_mask

    def density(case: Case, length: int) -> float:
        mod = reference_variants_flex.mask_mod(case, CPU)
        mask = create_block_mask(mod, None, None, length, length, device="cpu")
        return 1.0 - mask.sparsity() / 100

    # 8 × 8 blocks of 128: causal visits 36, a 128-key window the diagonal and one left.
    causal = case_of(seqlen_q=1024, seqlen_k=1024, causal=True)
    assert density(causal, 1024) == 36 / 64
    windowed = case_of(seqlen_q=1024, seqlen_k=1024, window_left=128, causal=True)
    assert density(windowed, 1024) == 15 / 64
    docs = case_of(**packed((256, 256, 256, 256)))  # 4 diagonal tiles of 2 × 2 blocks
    assert density(docs, 1024) == 16 / 64


def test_flex_plain_case_has_no_mods() -> None:
    """No mask and no score_mod for a non-causal dense case: flex runs as before."""
    case = case_of()
    assert reference_variants_flex.mask_mod(case, CPU) is None
    assert reference_variants_flex.score_mod(case, CPU) is None
    assert reference_variants_flex.label(case_of(alibi=True, window_left=4, causal=True)) == (
        "score_mod (ALiBi), block mask (window + causal)"
    )


def test_registered_flex_dispatches_variants(monkeypatch: pytest.MonkeyPatch) -> None:
    """The registered `flex` builder hands variant cases to flex_variant (compiled flex
    itself is CUDA-only: the compiled functions are swapped for the eager ones)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    from fa_bench.kernels import reference

    monkeypatch.setattr(reference, "_compiled_flex", lambda: flex_attention)
    monkeypatch.setattr(reference, "_compiled_block_mask", lambda: create_block_mask)
    case = case_of(softcap=1.0, window_left=3, causal=True)
    prepared = registry.get("flex").builder(case, *inputs(case, grad=False))
    assert prepared.backend == "flex AUTO: score_mod (softcap), block mask (window + causal)"
    assert_matches(case, prepared.fn, grads=False)


def test_flex_falls_back_to_its_triton_kernel_then_unsupported() -> None:
    """NoValidChoices from AUTO: the general Triton kernel next; none compiling is
    unsupported with flex's words; any other error is raised (a real error)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    case = case_of(window_left=3, causal=True)
    tried: list[object] = []

    def refusing(times: int, message: str = "NoValidChoicesError: no config"):
        def warm_up(fn, q, k, v) -> None:
            tried.append(fn.__defaults__[0])
            if len(tried) <= times:
                raise RuntimeError(message)

        return warm_up

    def build(warm_up):
        tried.clear()
        return reference_variants_flex.flex_variant(
            case, *inputs(case, grad=False), flex=flex_attention,
            block_mask_fn=create_block_mask, warm_up=warm_up,
        )  # fmt: skip

    assert build(refusing(1)).backend.startswith("flex TRITON: ")
    assert tried == [None, {"BACKEND": "TRITON"}]
    with pytest.raises(Unsupported, match="found no kernel for this case: AUTO: NoValid"):
        build(refusing(3))
    with pytest.raises(RuntimeError, match="boom"):
        build(refusing(1, "boom"))


# ---------------------------------------------------------------------------------------
# Our kernel runs the variants (tests/test_flash_variants.py); the one-pass backward does
# not, so triton-onepass takes their forward only.


@pytest.mark.parametrize(
    ("over", "named"),
    [
        (dict(window_left=8, causal=True), "sliding window"),
        (dict(alibi=True), "ALiBi"),
        (dict(softcap=30.0), "softcap"),
        (packed((3, 5)), "packed varlen batches"),
        (dict(alibi=True, softcap=5.0), "ALiBi or softcap"),
    ],
)
def test_triton_takes_variants_and_onepass_their_forward_only(
    over: dict, named: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    for mode in ("fwd", "bwd", "fwd_bwd"):
        assert registry.get("triton").check(case_of("triton", mode, **over), CPU) is None
    onepass = registry.get("triton-onepass")
    assert onepass.check(case_of("triton-onepass", "fwd", **over), CPU) is None
    reason = onepass.check(case_of("triton-onepass", "bwd", **over), CPU)
    assert reason is not None and reason.startswith(f"triton-onepass times no {named} backward")


def test_triton_takes_plain_cases_as_before(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert registry.get("triton").check(case_of("triton", causal=True), CPU) is None


# ---------------------------------------------------------------------------------------
# The peers against fakes that compute the variants in their own layouts and spellings.


@pytest.fixture
def variant_fakes(monkeypatch: pytest.MonkeyPatch) -> None:
    """tests/variant_peer_fakes.py's modules in sys.modules (any real ones set aside)."""
    for name in [n for n in sys.modules if n.startswith(("flash_attn", "xformers"))]:
        monkeypatch.delitem(sys.modules, name)
    for name, module in variant_peer_fakes.variant_modules().items():
        monkeypatch.setitem(sys.modules, name, module)


PEER_CASES = {
    "fa4": ["window", "window-left-causal", "window-sq-ne-sk-causal", "window-right-only",
            "softcap", "softcap-window-causal", "packed", "packed-causal",
            "packed-window-both"],
    "flash-attn": ["window", "window-empty-rows", "window-sq-ne-sk-causal", "alibi",
                   "alibi-causal-sq-ne-sk", "softcap-window-causal", "all-three", "packed",
                   "packed-all"],
    "xformers": ["window", "window-left-causal", "window-empty-rows", "window-sq-ne-sk-causal",
                 "window-right-only", "packed", "packed-causal"],
}  # fmt: skip
BUILDERS = {"fa4": fa4_impl.build, "flash-attn": flash_attn_impl.build,
            "xformers": xformers_impl.build}  # fmt: skip


@pytest.mark.parametrize(
    ("impl", "name"), [(impl, name) for impl, names in PEER_CASES.items() for name in names]
)
def test_peer_variant_matches_float64(variant_fakes: None, impl: str, name: str) -> None:
    """The adapter's keywords (window spelling, softcap, ALiBi slopes, cu_seqlens and
    max_seqlen, (T, H, D) views) give the reference's output and gradients."""
    case = case_of(impl, mode="fwd_bwd", **VARIANTS[name])
    prepared = BUILDERS[impl](case, *inputs(case))
    assert_matches(case, prepared.fn, grads=True)
    if case.varlen and impl != "xformers":
        assert prepared.backend.endswith("flash_attn_varlen_func")


@pytest.mark.parametrize(
    ("impl", "over", "reason"),
    [
        ("fa4", dict(alibi=True), "takes no alibi_slopes: this flash-attn-4 has no ALiBi"),
        ("xformers", dict(softcap=5.0), "has no softcap"),
        ("xformers", dict(alibi=True), "ALiBi only as a dense bias tensor"),
        ("xformers", packed((4, 6), window_left=2), "a window over a packed batch"),
    ],
)
def test_peer_variant_unsupported_with_reason(
    variant_fakes: None, impl: str, over: dict, reason: str
) -> None:
    case = case_of(impl, **over)
    with pytest.raises(Unsupported, match=reason):
        BUILDERS[impl](case, *inputs(case))


def test_fa4_plain_case_calls_without_variant_keywords(variant_fakes: None, monkeypatch) -> None:
    """A plain case passes only `causal`, as before issue 19 (window_size and softcap
    keep FA4's defaults)."""
    seen: list[dict] = []

    def spy(q, k, v, **kwargs):
        seen.append(kwargs)
        return variant_peer_fakes.fa4_func(q, k, v, **kwargs)

    monkeypatch.setattr(sys.modules["flash_attn.cute"], "flash_attn_func", spy)
    case = case_of("fa4", causal=True)
    assert_matches(case, fa4_impl.build(case, *inputs(case)).fn, grads=False)
    assert seen and all(kw == {"causal": True} for kw in seen)


# ---------------------------------------------------------------------------------------
# GPU (`-m gpu`, the H200 session): compiled flex and the real peers, through run_case and
# its accuracy check (the float64 reference), forward and backward.

GPU_VARIANTS = {
    "window-causal": dict(window_left=256, causal=True),
    "window-both": dict(window_left=128, window_right=128),
    "window-sq-ne-sk": dict(seqlen_q=512, window_left=200, causal=True),
    "softcap": dict(softcap=50.0),
    "softcap-window": dict(softcap=50.0, window_left=256, causal=True),
    "alibi-causal": dict(alibi=True, causal=True),
    "packed": packed((1, 300, 1024, 77, 650)),
    "packed-causal-window": packed((1, 300, 1024, 77, 650), causal=True, window_left=128),
}
# What each peer cannot express (their reasons are checked on the CPU above).
GPU_REFUSED = {
    "fa4": {"alibi-causal"},
    "xformers": {"softcap", "softcap-window", "alibi-causal", "packed-causal-window"},
}


@pytest.mark.gpu
@pytest.mark.parametrize("impl", ["flex", "fa4", "flash-attn", "xformers"])
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_gpu_variants(impl: str, dtype: str) -> None:
    """head_dim 128 (each flex case compiles its own kernels: minutes for all of them)."""
    from fa_bench.case import Status
    from fa_bench.run.execute import ExecOptions, run_case
    from fa_bench.run.timing import TimingConfig

    why = registry.get(impl).unavailable_reason()
    if why is not None:
        pytest.skip(f"{impl}: {why}")
    quick = ExecOptions(timing=TimingConfig(min_samples=2, max_time_s=0.05, min_time_s=0.0,
                                            warmup_ms=0.0, flush_l2=False))  # fmt: skip
    device = torch.device("cuda", 0)
    for name, over in GPU_VARIANTS.items():
        over = dict(dict(batch=2, heads_q=8, heads_kv=2, seqlen_q=1024, seqlen_k=1024), **over)
        for mode in ("fwd", "bwd"):
            case = case_of(impl, mode=mode, dtype=dtype, head_dim=128, **over)
            record = run_case(case, device, quick)
            want = Status.UNSUPPORTED if name in GPU_REFUSED.get(impl, ()) else Status.OK
            assert record.status is want, (case.id, record.error, record.accuracy)
