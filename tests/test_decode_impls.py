"""Decode cases' inputs, reference and implementations (issue 20 item 3), on the CPU.

- fa_bench.run.decode_inputs: the padding past each context length, `paged_cache`
  (gathering the pages gives back every sequence's valid prefix; shuffled, deterministic);
- the float64 decode reference and the accuracy rule: a missing length mask fails by
  orders of magnitude, on any sequence of the batch;
- naive, sdpa, sdpa-math, flex (eager: compiled flex is CUDA-only here), triton (the
  interpreter) and fa4's decode adapter (a stand-in of flash_attn_varlen_func written
  here) against that reference, fp32, contiguous and paged, equal and ragged lengths,
  Sq 1 and > 1, GQA groups 1 and 4;
- unsupported reasons.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from fa_bench import registry
from fa_bench.case import Case, Status
from fa_bench.kernels import fa4_impl, reference_decode
from fa_bench.registry import Unsupported
from fa_bench.run.accuracy import check_accuracy, decode_reference
from fa_bench.run.decode_inputs import (
    PAD_VALUE,
    UNUSED_PAGE,
    fill_padding,
    gather_pages,
    page_counts,
    paged_cache,
)
from fa_bench.run.execute import ExecOptions, make_inputs, run_case
from fa_bench.run.timing import TimingConfig

CPU = torch.device("cpu")
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


@pytest.fixture(scope="module", autouse=True)
def _registry() -> None:
    registry.load()


def decode_case(impl: str = "naive", *, b: int = 3, hq: int = 4, hkv: int = 2, sq: int = 1,
                sk: int = 70, d: int = 16, page: int = 0, spread: float = 1.0,
                dtype: str = "fp32") -> Case:  # fmt: skip
    return Case(impl, "decode", dtype, b, hq, hkv, sq, sk, d, True, page_size=page,
                ctx_spread=spread)  # fmt: skip


def inputs(case: Case, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    torch.manual_seed(seed)
    q, k, v, _ = make_inputs(case, CPU)
    return q, k, v


# ---------------------------------------------------------------------------------------
# Inputs


def test_padding_fills_only_past_each_length() -> None:
    case = decode_case(spread=0.3)
    lengths = case.context_lengths()
    assert min(lengths) < case.seqlen_k  # the test needs padding
    q, k, v = inputs(case)
    for b, n in enumerate(lengths):
        assert (v[b, :, n:] == PAD_VALUE).all()
        assert (v[b, :, :n].abs() < 10).all()  # N(0, 1) draws, untouched
        if n < case.seqlen_k:
            assert k[b, :, n:].abs().max() > 20  # PAD_KEY_SCALE · N(0, 1)
    # Seeded as the rest of the inputs: the same case gives the same tensors.
    q2, k2, v2 = inputs(case)
    assert torch.equal(k, k2) and torch.equal(v, v2) and torch.equal(q, q2)


def test_padding_refuses_a_prefill_case() -> None:
    case = Case("naive", "fwd", "fp32", 1, 2, 2, 4, 4, 16, True)
    t = torch.zeros(1, 2, 4, 16)
    with pytest.raises(ValueError, match="not a decode case"):
        fill_padding(case, t, t)


# page 16 divides 64 and not 70; page 32 leaves S_max=70 mid-page (slots past S_max);
# spread 0.02 puts a length at Sq (1), spread 0.25 ragged lengths around page boundaries.
@pytest.mark.parametrize(
    ("sk", "page", "spread", "b"),
    [(64, 16, 1.0, 2), (70, 16, 0.3, 3), (70, 32, 0.25, 5), (64, 16, 0.02, 4), (48, 48, 1.0, 1)],
)
def test_paged_cache_gathers_back_the_valid_prefix(sk: int, page: int, spread: float,
                                                   b: int) -> None:  # fmt: skip
    case = decode_case(b=b, sk=sk, page=page, spread=spread)
    _, k, v = inputs(case)
    k_pages, v_pages, table = paged_cache(case, k, v)
    counts = page_counts(case)
    assert counts == tuple(math.ceil(n / page) for n in case.context_lengths())
    assert k_pages.shape == (sum(counts), page, case.heads_kv, case.head_dim)
    assert table.dtype == torch.int32 and table.shape == (b, math.ceil(sk / page))
    used = torch.cat([table[i, :n] for i, n in enumerate(counts)])
    assert sorted(used.tolist()) == list(range(sum(counts)))  # every page once
    for i, n in enumerate(counts):
        assert (table[i, n:] == UNUSED_PAGE).all()
    dense_k, dense_v = gather_pages(k_pages, table), gather_pages(v_pages, table)
    for i, n in enumerate(case.context_lengths()):
        assert torch.equal(dense_k[i, :, :n], k[i, :, :n])
        assert torch.equal(dense_v[i, :, :n], v[i, :, :n])
    # Deterministic from the case alone.
    again = paged_cache(case, k, v)
    assert all(torch.equal(x, y) for x, y in zip((k_pages, v_pages, table), again, strict=True))


def test_paged_cache_shuffles_the_pages() -> None:
    case = decode_case(b=4, sk=128, page=16)
    _, k, v = inputs(case)
    _, _, table = paged_cache(case, k, v)
    in_order = torch.arange(table.numel(), dtype=torch.int32).reshape(table.shape)
    assert not torch.equal(table, in_order)
    # Some sequence's pages are out of order, not merely interleaved.
    assert any((row[1:] < row[:-1]).any() for row in table)


def test_paged_cache_pads_slots_past_the_cache_with_padding() -> None:
    case = decode_case(b=1, sk=70, page=32)  # 3 pages: 26 slots past S_max
    _, k, v = inputs(case)
    _, v_pages, table = paged_cache(case, k, v)
    dense = gather_pages(v_pages, table)
    assert (dense[0, :, 70:] == PAD_VALUE).all()


def test_paged_cache_refuses_a_contiguous_case() -> None:
    case = decode_case()
    _, k, v = inputs(case)
    with pytest.raises(ValueError, match="contiguous cache"):
        paged_cache(case, k, v)


# ---------------------------------------------------------------------------------------
# The reference and the accuracy rule


def test_decode_reference_ignores_the_padding_and_attends_bottom_right() -> None:
    case = decode_case(b=2, hq=2, hkv=2, sq=2, sk=8, spread=0.25)  # lengths 8 and 2
    q, k, v = inputs(case)
    ref = decode_reference(q, k, v, case.context_lengths(), torch.float64)
    k2, v2 = k.clone(), v.clone()
    for b, n in enumerate(case.context_lengths()):
        k2[b, :, n:], v2[b, :, n:] = -7.0, 3.0
    assert torch.equal(ref, decode_reference(q, k2, v2, case.context_lengths(), torch.float64))
    # Length 2, Sq 2: the first new token sees key 0 alone, so its output is v[key 0].
    short = case.context_lengths().index(2)
    assert torch.allclose(ref[short, :, 0], v[short, :, 0].double())


def _unmasked(case: Case):
    """Attention over the whole dense cache, bottom-right causal against S_max: what an
    implementation that forgets the lengths computes."""
    from fa_bench.run.accuracy import reference_attention

    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return reference_attention(q, k, v, causal=True).o

    return fn


def test_a_missing_length_mask_fails_the_accuracy_check() -> None:
    case = decode_case(b=4, spread=0.5)
    q, k, v = inputs(case)
    acc = check_accuracy(case, q, k, v, _unmasked(case)(q, k, v))
    assert not acc["passed"] and acc["max_abs_err"] > 100
    assert acc["slice"].startswith("all 4 sequences")


def test_a_mask_wrong_on_one_short_sequence_is_caught() -> None:
    case = decode_case(b=4, spread=0.5)
    lengths = case.context_lengths()
    q, k, v = inputs(case)
    good = decode_reference(q, k, v, lengths)
    wrong = good.clone()
    short = lengths.index(min(lengths))
    assert short != 0  # batch 0 alone (the prefill slice) would not see it
    wrong[short] = _unmasked(case)(q, k, v)[short]
    assert check_accuracy(case, q, k, v, good)["passed"]
    assert not check_accuracy(case, q, k, v, wrong)["passed"]


def test_an_off_by_one_causal_boundary_is_caught() -> None:
    """Query t seeing one valid key too many (j <= L_b - Sq + t + 1, within L_b): no
    padding involved, only the causal diagonal of speculative decoding."""
    case = decode_case(b=2, hq=2, hkv=2, sq=4, sk=40, spread=0.5)
    q, k, v = inputs(case)
    out = torch.empty_like(q)
    for b, n in enumerate(case.context_lengths()):
        s = (q[b] @ k[b, :, :n].transpose(-2, -1)) / math.sqrt(case.head_dim)
        last = torch.clamp(n - case.seqlen_q + torch.arange(case.seqlen_q) + 1, max=n - 1)
        s = s.masked_fill(torch.arange(n)[None, :] > last[:, None], float("-inf"))
        out[b] = torch.softmax(s, dim=-1) @ v[b, :, :n]
    acc = check_accuracy(case, q, k, v, out)
    assert not acc["passed"] and acc["max_abs_err"] > 1e-3


def test_decode_accuracy_refuses_grads() -> None:
    case = decode_case()
    q, k, v = inputs(case)
    with pytest.raises(ValueError, match="no backward"):
        check_accuracy(case, q, k, v, q, do=q)


# ---------------------------------------------------------------------------------------
# Implementations against the reference

SHAPES = [
    dict(sq=1, spread=1.0, page=0),
    dict(sq=3, spread=0.3, page=0, hq=8, hkv=2),
    dict(sq=1, spread=0.3, page=16),
    dict(sq=4, spread=0.25, page=32, hq=2, hkv=2),
]
# The slower implementations (eager flex, the interpreter) run two of them in the fast
# tier (ragged GQA 4 contiguous, ragged paged with Sq > 1), all four under `slow`.
SOME_SHAPES = [
    pytest.param(s, marks=() if i in (1, 3) else pytest.mark.slow) for i, s in enumerate(SHAPES)
]


def _passes(case: Case, prepared_fn) -> dict:
    q, k, v = inputs(case, seed=1)
    acc = check_accuracy(case, q, k, v, prepared_fn(case, q, k, v)(q, k, v))
    assert acc["passed"], acc
    return acc


@pytest.mark.parametrize("impl", ["naive", "sdpa", "sdpa-math"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "-".join(f"{k}{v}" for k, v in s.items()))
def test_reference_impls_match(impl: str, shape: dict) -> None:
    def prepare(case, q, k, v):
        return registry.get(impl).prepare(case, q, k, v).fn

    _passes(decode_case(impl, **shape), prepare)


def test_backend_labels_say_what_was_built_outside_the_timed_span() -> None:
    paged = decode_case("sdpa", page=16, spread=0.3)
    q, k, v = inputs(paged)
    label = registry.get("sdpa-math").prepare(paged, q, k, v).backend or ""
    assert label.startswith("MATH") and "outside the timed span" in label and "pages" in label
    naive = registry.get("naive").prepare(paged, q, k, v).backend or ""
    assert "gathered in the timed call" in naive


@pytest.mark.parametrize(
    "shape", SOME_SHAPES, ids=lambda s: "-".join(f"{k}{v}" for k, v in s.items())
)
def test_flex_decode_matches_in_eager_mode(shape: dict) -> None:
    """The mask_mods (lengths; PagedAttention's physical-to-logical map for pages) in eager
    flex: registered `flex` compiles and runs on CUDA only."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    def prepare(case, q, k, v):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "called without torch.compile"
            return reference_decode.flex_decode(
                case, q, k, v, flex=flex_attention, block_mask_fn=create_block_mask
            ).fn

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        _passes(decode_case("flex", **shape), prepare)


def test_flex_paged_without_paged_attention_is_unsupported(monkeypatch) -> None:
    monkeypatch.setattr(reference_decode, "_paged_attention_class", lambda: None)
    case = decode_case("flex", page=16)
    q, k, v = inputs(case)
    with pytest.raises(Unsupported, match="PagedAttention"):
        reference_decode.flex_decode(case, q, k, v, flex=None, block_mask_fn=lambda *a, **k: 0)


@pytest.mark.skipif(not INTERPRETED, reason="needs TRITON_INTERPRET=1 (CPU runs)")
@pytest.mark.parametrize(
    "shape", SOME_SHAPES, ids=lambda s: "-".join(f"{k}{v}" for k, v in s.items())
)
def test_triton_decode_matches_in_the_interpreter(shape: dict) -> None:
    def prepare(case, q, k, v):
        prepared = registry.get("triton").prepare(case, q, k, v)
        assert (prepared.backend or "").startswith("triton-decode: ")
        return prepared.fn

    _passes(decode_case("triton", **shape), prepare)


@pytest.mark.skipif(not INTERPRETED, reason="needs TRITON_INTERPRET=1 (CPU runs)")
def test_triton_decode_with_more_splits_than_blocks() -> None:
    def prepare(case, q, k, v):
        return registry.get("triton").prepare(case, q, k, v, {"num_splits": 9}).fn

    _passes(decode_case("triton", b=2, hq=2, hkv=1, sk=40, page=16, spread=0.5), prepare)


# ---------------------------------------------------------------------------------------
# fa4's decode adapter, against a stand-in of flash_attn_varlen_func


def fake_varlen(q, k, v, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None,
                max_seqlen_k=None, seqused_q=None, seqused_k=None, page_table=None,
                softmax_scale=None, causal=False, return_lse=False):  # fmt: skip
    """flash_attn_varlen_func's decode conventions in plain torch: q (B, Sq, H, D); k, v
    (B, S, Hkv, D) or pages (P, page, Hkv, D) with page_table; seqused_k; (out, lse)."""
    assert causal and seqused_k is not None and seqused_k.dtype == torch.int32
    if page_table is not None:
        assert page_table.dtype == torch.int32
        k = k[page_table.long()].flatten(1, 2)
        v = v[page_table.long()].flatten(1, 2)
    lengths = tuple(int(n) for n in seqused_k)
    o = decode_reference(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), lengths)
    return o.transpose(1, 2), None


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "-".join(f"{k}{v}" for k, v in s.items()))
def test_fa4_decode_adapter_hands_fa4_its_layout(shape: dict) -> None:
    def prepare(case, q, k, v):
        return fa4_impl._decode(case, fake_varlen, q, k, v)[0]

    _passes(decode_case("fa4", **shape), prepare)


def test_fa4_without_paged_keywords_is_unsupported() -> None:
    def old_varlen(q, k, v, cu_seqlens_q=None, cu_seqlens_k=None, causal=False):
        raise AssertionError("not called")

    case = decode_case("fa4", page=16)
    q, k, v = inputs(case)
    with pytest.raises(Unsupported, match="seqused_k, page_table"):
        fa4_impl._decode(case, old_varlen, q, k, v)


# ---------------------------------------------------------------------------------------
# Registration and unsupported reasons


def test_which_impls_claim_decode() -> None:
    case = decode_case("x")
    for name in ("naive", "sdpa", "sdpa-math", "sdpa-efficient", "sdpa-cudnn", "triton", "fa4",
                 "flex"):  # fmt: skip
        reason = registry.get(name).unsupported_reason(case, torch.device("cuda", 0))
        assert reason is None or "decode mode" not in reason, (name, reason)
    for name in ("triton-onepass", "sdpa-flash", "flash-attn", "xformers"):
        reason = registry.get(name).unsupported_reason(case, torch.device("cuda", 0))
        assert reason == f"{name} has no decode mode"


def test_triton_decode_reasons(monkeypatch) -> None:
    triton = registry.get("triton")
    cuda = torch.device("cuda", 0)
    assert "head_dim a multiple of 8" in triton.unsupported_reason(decode_case(d=20), cuda)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert "bf16" in triton.unsupported_reason(decode_case(dtype="bf16"), CPU)
    assert triton.unsupported_reason(decode_case(), CPU) is None
    monkeypatch.delenv("TRITON_INTERPRET")
    assert "TRITON_INTERPRET" in triton.unsupported_reason(decode_case(), CPU)


def test_flex_and_fa4_decode_are_unsupported_on_the_cpu() -> None:
    for name in ("flex", "fa4"):
        record = run_case(decode_case(name), CPU, ExecOptions(timing=_QUICK))
        assert record.status is Status.UNSUPPORTED and "cpu" in (record.error or "")


# ---------------------------------------------------------------------------------------
# End to end

_QUICK = TimingConfig(min_samples=3, max_time_s=0.2, warmup_ms=1.0)


def test_run_case_times_a_paged_ragged_decode_case() -> None:
    record = run_case(decode_case("naive", page=16, spread=0.3, sq=2), CPU,
                      ExecOptions(timing=_QUICK))  # fmt: skip
    assert record.status is Status.OK, record.error
    assert record.accuracy is not None and record.accuracy["passed"]
    assert record.accuracy["slice"].startswith("all 3 sequences")
    assert record.gbps_model is not None and record.gbps_model > 0
    assert "gathered in the timed call" in (record.backend or "")


@pytest.mark.slow
def test_the_decode_suite_runs_on_the_cpu(tmp_path: Path) -> None:
    """`fa-bench run -s decode --device cpu` at CPU sizes (docs/suites.md's recipe, with
    all four layouts: page 64 and 256 too, 256 longer than the cache): every case ok or
    unsupported, and every implementation that runs on the CPU runs."""
    out = tmp_path / "out"
    args = ["run", "-s", "decode", "--device", "cpu", "--dtype", "fp32", "--heads", "4",
            "--kv-heads", "2", "--head-dim", "32", "--batch", "3", "--seqlen-k", "80",
            "--max-time", "0.05", "--min-samples", "3", "--out", str(out)]  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-c", "from fa_bench.cli import main; main()", *args],
        capture_output=True, text=True, timeout=850,
        env={**os.environ, "TRITON_INTERPRET": "1"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    cases = json.loads((out / "results.json").read_text())["cases"]
    assert cases and all(c["mode"] == "decode" for c in cases)
    bad = [(c["id"], c["status"], c.get("error")) for c in cases
           if c["status"] not in ("ok", "unsupported")]  # fmt: skip
    assert not bad
    ok = {c["impl"] for c in cases if c["status"] == "ok"}
    assert {"naive", "sdpa", "triton"} <= ok
    assert {c["page_size"] for c in cases if c["status"] == "ok"} == {0, 16, 64, 256}


# ---------------------------------------------------------------------------------------
# GPU (`-m gpu`, the H200 session): every decode implementation in bf16 and fp16 through
# run_case (its accuracy check included): compiled flex, our kernel, fa4 where installed.

GPU_DECODE = [
    dict(b=2, hq=32, hkv=8, sq=1, sk=4096, d=128, page=0),
    dict(b=4, hq=32, hkv=8, sq=4, sk=3000, d=128, page=16, spread=0.25),
    dict(b=3, hq=64, hkv=8, sq=1, sk=8192, d=128, page=64, spread=0.25),
    dict(b=1, hq=8, hkv=8, sq=2, sk=1000, d=64, page=256),
]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize(
    "shape", GPU_DECODE, ids=lambda s: "-".join(f"{k}{v}" for k, v in s.items())
)
@pytest.mark.parametrize(
    "impl", ["naive", "sdpa", "sdpa-math", "sdpa-efficient", "sdpa-cudnn", "flex", "triton", "fa4"]
)
def test_gpu_decode_impls(impl: str, shape: dict, dtype: str) -> None:
    entry = registry.get(impl)
    if entry.unavailable_reason():
        pytest.skip(entry.unavailable_reason())
    case = decode_case(impl, dtype=dtype, **shape)
    record = run_case(case, torch.device("cuda"), ExecOptions(timing=_QUICK))
    if record.status is Status.UNSUPPORTED and impl in (
        "sdpa",
        "sdpa-efficient",
        "sdpa-cudnn",
        "fa4",
    ):
        pytest.skip(f"unsupported (as reported): {record.error}")
    assert record.status is Status.OK, (record.error, record.accuracy)
    assert record.backend
