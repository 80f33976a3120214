"""Decode cases (issue 20): the case model's fields, context lengths, ids and checks; the
FLOP and byte models; the TOML axes, the CLI flags and the built-in `decode` suite; and
that every case and results file from before decode stays as it was."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

import fa_bench.cli as cli
from fa_bench import models, registry
from fa_bench.case import PREFILL_MODES, Case, Mode
from fa_bench.commands.lists import ListFlagError, float_items, page_size_items
from fa_bench.results.record import CaseRecord
from fa_bench.run.limits import tensor_bytes
from fa_bench.suite.expand import Overrides, SuiteError, load_suite

KNOWN = ("naive", "sdpa", "sdpa-math", "flex", "triton", "fa4")

# Every built-in suite's ids before decode existed (computed at commit e79d041): the
# count and the first 16 hex digits of sha256 over the ids joined by newlines.
IDS_BEFORE_DECODE = {
    "gqa": (240, "18bde27d56bd927c"),
    "head-dims": (360, "f3d575f40a42d979"),
    "long-context": (128, "1e732ead375528e0"),
    "smoke": (42, "71f0d816781fc74c"),
    "standard": (672, "0f27762c9db4438b"),
}


def decode(
    batch: int = 8, sq: int = 1, sk: int = 32768, page: int = 0, spread: float = 1.0, **kw: object
) -> Case:
    fields: dict = dict(impl="triton", mode="decode", dtype="bf16", batch=batch, heads_q=32,
                        heads_kv=8, seqlen_q=sq, seqlen_k=sk, head_dim=128, causal=True,
                        page_size=page, ctx_spread=spread)  # fmt: skip
    fields.update(kw)
    return Case(**fields)


# ------------------------------------------------------------------------- what stays


@pytest.mark.parametrize("name", sorted(IDS_BEFORE_DECODE))
def test_ids_of_every_builtin_suite_are_unchanged(name: str) -> None:
    ids = [c.id for c in load_suite(name).cases]
    digest = hashlib.sha256("\n".join(ids).encode()).hexdigest()[:16]
    assert (len(ids), digest) == IDS_BEFORE_DECODE[name]


def test_a_prefill_case_keeps_its_dict_and_takes_an_old_one() -> None:
    case = Case("naive", "fwd", "fp32", 1, 2, 2, 16, 16, 16, True)
    old = {"impl": "naive", "mode": "fwd", "dtype": "fp32", "batch": 1, "heads_q": 2,
           "heads_kv": 2, "seqlen_q": 16, "seqlen_k": 16, "head_dim": 16,
           "causal": True}  # fmt: skip
    assert case.to_dict() == old  # no new keys: results files stay byte for byte
    assert Case.from_dict(old) == case and case.page_size == 0 and case.ctx_spread == 1.0


def _record(case_dict: dict) -> dict:
    return {"id": Case.from_dict(case_dict).id, **case_dict, "device": "cpu", "status": "ok",
            "error": None, "latency_ms": None, "tflops": None, "gbps_model": None,
            "peak_mem_bytes": None, "accuracy": None, "telemetry": None}  # fmt: skip


def test_a_record_written_before_decode_still_loads() -> None:
    old = Case("sdpa", "bwd", "fp16", 2, 4, 2, 8, 32, 16, False).to_dict()
    record = CaseRecord.from_json(_record(old), "old.json[0]")
    assert record.case.mode is Mode.BWD and record.case.page_size == 0
    assert "page_size" not in record.to_json() and not record.extra


def test_a_decode_record_round_trips() -> None:
    case = decode(batch=3, sk=100, page=16, spread=0.5)
    d = json.loads(json.dumps(_record(case.to_dict())))
    assert d["page_size"] == 16 and d["ctx_spread"] == 0.5
    back = CaseRecord.from_json(d, "new.json[0]")
    assert back.case == case and back.to_json()["ctx_spread"] == 0.5 and not back.extra


def test_builtin_implementations_claim_decode_only_by_opting_in() -> None:
    impls = registry.load()
    assert frozenset(PREFILL_MODES) <= impls["sdpa-flash"].modes
    assert Mode.DECODE not in impls["sdpa-flash"].modes  # never opted in
    assert not Mode.DECODE.backward and Mode.BWD.backward and not Mode.FWD.backward


# ------------------------------------------------------------------------- the case


def test_ids_and_labels_of_decode_cases() -> None:
    case = decode(page=64, spread=0.25)
    assert case.id == "triton/decode/bf16/b8-hq32-hkv8-sq1-sk32768-d128/page64-spread0.25"
    assert decode().id == "triton/decode/bf16/b8-hq32-hkv8-sq1-sk32768-d128/contig"
    assert decode(spread=1).id == decode().id and isinstance(decode(spread=1).ctx_spread, float)
    assert "page=64 spread=0.25" in case.label and "Sq=1,ctx=32768" in case.label
    assert Case.from_dict(case.to_dict()) == case


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        (dict(mode="fwd", page_size=16), "page_size applies to decode only"),
        (dict(mode="bwd", ctx_spread=0.5), "ctx_spread applies to decode only"),
        (dict(causal=False), "causal must be true for decode"),
        (dict(seqlen_q=17), "seqlen_q"),
        (dict(seqlen_q=8, seqlen_k=4), "seqlen_k"),
        (dict(page_size=24), "page_size must be 0"),
        (dict(page_size=8), "page_size must be 0"),
        (dict(page_size=272), "page_size must be 0"),
        (dict(page_size=True), "page_size must be an integer"),
        (dict(ctx_spread=0.0), "ctx_spread must be in"),
        (dict(ctx_spread=1.5), "ctx_spread must be in"),
        (dict(ctx_spread=math.nan), "ctx_spread must be in"),
        (dict(ctx_spread="0.5"), "ctx_spread must be a number"),
    ],
)
def test_invalid_decode_fields_name_the_field(fields: dict, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        decode(**fields)


def test_context_lengths_by_hand() -> None:
    # 100 down to 25 in 4 steps of 18.75, rounded: 100, 81, 62, 44, 25; shuffled by seed.
    lengths = decode(batch=5, sk=100, spread=0.25).context_lengths()
    assert sorted(lengths, reverse=True) == [100, 81, 62, 44, 25]
    # The fixed permutation (random.Random(0x5EED + 5).shuffle): pinned, as every machine
    # and every later run must build the same batch.
    assert lengths == (44, 81, 25, 62, 100)
    assert decode(batch=4, sk=64).context_lengths() == (64,) * 4
    assert decode(batch=1, sk=64, spread=0.25).context_lengths() == (64,)
    # ceil(0.1 * 30) is 3 (not 4 from 3.0000000000000004); Sq bounds it from below.
    assert min(decode(batch=2, sk=30, spread=0.1).context_lengths()) == 3
    assert min(decode(batch=2, sq=4, sk=30, spread=0.1).context_lengths()) == 4
    assert Case("sdpa", "fwd", "fp32", 3, 2, 2, 5, 7, 8, False).context_lengths() == (7, 7, 7)


@pytest.mark.parametrize("batch", [2, 3, 8, 64, 256])
@pytest.mark.parametrize("spread", [0.25, 0.5, 0.999])
def test_context_lengths_stay_in_bounds(batch: int, spread: float) -> None:
    case = decode(batch=batch, sq=4, sk=1000, spread=spread)
    lengths = case.context_lengths()
    assert len(lengths) == batch and lengths == case.context_lengths()
    assert max(lengths) == 1000 and min(lengths) == max(4, math.ceil(spread * 1000))
    steps = [a - b for a, b in zip(sorted(lengths), sorted(lengths)[1:], strict=False)]
    assert max(steps) - min(steps) <= 1  # evenly spaced, up to rounding


def test_the_longest_sequence_is_not_always_first() -> None:
    firsts = {decode(batch=b, sk=1000, spread=0.5).context_lengths()[0] for b in range(2, 12)}
    assert firsts != {1000}


# ------------------------------------------------------------------------- the models


def test_decode_flops_and_bytes_by_hand() -> None:
    case = decode(batch=3, sq=2, sk=10, spread=0.5, heads_q=4, heads_kv=2, head_dim=8,
                  dtype="fp16")  # fmt: skip
    assert sorted(case.context_lengths()) == [5, 7, 10]  # 10 down to ceil(5), step 2.5
    # Sq 2, bottom-right: a sequence of L sees L - 1 and L keys: 19 + 13 + 9 pairs.
    assert models.case_flops(case) == 4 * 4 * 8 * 41 == 5248
    kv = (5 + 7 + 10) * 2 * 8 * 2 * 2  # lengths x Hkv x D x (K, V) x fp16
    q = 3 * 4 * 2 * 8 * 2
    assert models.case_bytes(case) == kv + 2 * q == 2176
    # Paging moves no more bytes in the model: only the valid lengths are read.
    assert models.case_bytes(decode(batch=3, sq=2, sk=10, spread=0.5, heads_q=4, heads_kv=2,
                                    head_dim=8, dtype="fp16", page=16)) == 2176  # fmt: skip


def test_the_size_guard_counts_the_pages_and_no_grads() -> None:
    contig = decode(batch=2, sk=40, heads_q=2, heads_kv=1, head_dim=4, dtype="fp32")
    q, kv = 2 * 2 * 1 * 4, 2 * 1 * 40 * 4
    assert tensor_bytes(contig) == (2 * q + 2 * kv) * 4
    paged = decode(batch=2, sk=40, heads_q=2, heads_kv=1, head_dim=4, dtype="fp32", page=16)
    assert tensor_bytes(paged) == (2 * q + 2 * kv + 2 * (3 + 3) * 16 * 4) * 4


# ------------------------------------------------------------------------- suites


def write(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "d.toml"
    path.write_text('name = "d"\ndescription = "decode test"\n' + body)
    return path


BODY = """\
impls = "sdpa"
modes = "decode"
dtypes = "fp32"
batch = [1, 3]
heads_q = 4
heads_kv = 2
seqlens_q = [1, 4]
seqlens_k = 64
head_dims = 16
causal = true
"""


def test_toml_decode_axes_expand(tmp_path: Path) -> None:
    body = BODY + 'page_sizes = ["none", 16]\nctx_spreads = [1, 0.5]\n'
    cases = load_suite(write(tmp_path, body), known_impls=KNOWN).cases
    assert len(cases) == 2 * 2 * 2 * 2  # batch, Sq, pages, spreads
    assert {(c.page_size, c.ctx_spread) for c in cases} == {(0, 1.0), (0, 0.5), (16, 1.0),
                                                              (16, 0.5)}  # fmt: skip
    assert cases[1].id == "sdpa/decode/fp32/b1-hq4-hkv2-sq1-sk64-d16/contig-spread0.5"
    # Absent axes: contiguous, equal lengths.
    plain = load_suite(write(tmp_path, BODY), known_impls=KNOWN).cases
    assert {(c.page_size, c.ctx_spread) for c in plain} == {(0, 1.0)} and len(plain) == 4


def test_decode_axes_apply_to_decode_cases_only(tmp_path: Path) -> None:
    body = BODY.replace('modes = "decode"', 'modes = ["fwd", "decode"]') + "page_sizes = 32\n"
    cases = load_suite(write(tmp_path, body), known_impls=KNOWN).cases
    assert {c.page_size for c in cases if c.mode is Mode.FWD} == {0}
    assert {c.page_size for c in cases if c.mode is Mode.DECODE} == {32}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (("causal = true", "causal = [true, false]"), "key 'causal': decode cases are causal"),
        (("seqlens_q = [1, 4]", "seqlens_q = 17"), "key 'seqlens_q': 17 new tokens"),
        (("seqlens_k = 64", "seqlens_k = 2"), "key 'seqlens_k': a context of 2 is shorter"),
        (("causal = true", "causal = true\npage_sizes = 24"), "key 'page_sizes': 24 is invalid"),
        (("causal = true", 'causal = true\npage_sizes = "contig"'), "key 'page_sizes'"),
        (("causal = true", "causal = true\nctx_spreads = 0"), "key 'ctx_spreads': 0 is invalid"),
        (("causal = true", "causal = true\nctx_spreads = 1.5"), "key 'ctx_spreads'"),
        (("causal = true", "causal = true\nctx_spreads = true"), "key 'ctx_spreads'"),
        (('modes = "decode"', 'modes = "fwd"\npage_sizes = 16'), "key 'page_sizes' applies to"),
        (('modes = "decode"', 'modes = "fwd"\nctx_spreads = 0.5'), "key 'ctx_spreads' applies"),
    ],
)
def test_toml_decode_errors_name_the_file_and_key(
    tmp_path: Path, change: tuple[str, str], message: str
) -> None:
    path = write(tmp_path, BODY.replace(*change))
    with pytest.raises(SuiteError, match=message) as info:
        load_suite(path, known_impls=KNOWN)
    assert str(path) in str(info.value)


def test_overrides_replace_the_decode_axes(tmp_path: Path) -> None:
    path = write(tmp_path, BODY)
    ov = Overrides(page_sizes=(0, 256), ctx_spreads=(0.25,), seqlens_k=(300,), seqlens_q=(2,))
    cases = load_suite(path, ov, known_impls=KNOWN).cases
    assert {(c.page_size, c.ctx_spread, c.seqlen_q, c.seqlen_k) for c in cases} == {
        (0, 0.25, 2, 300), (256, 0.25, 2, 300)}  # fmt: skip
    # One of the two lengths alone keeps the suite's other one, or its `seqlens`.
    only_k = load_suite(path, Overrides(seqlens_k=(80,)), known_impls=KNOWN).cases
    assert {(c.seqlen_q, c.seqlen_k) for c in only_k} == {(1, 80), (4, 80)}
    single = write(tmp_path, BODY.replace("seqlens_q = [1, 4]\nseqlens_k = 64", "seqlens = 4"))
    only_q = load_suite(single, Overrides(seqlens_q=(1,)), known_impls=KNOWN).cases
    assert {(c.seqlen_q, c.seqlen_k) for c in only_q} == {(1, 4)}


@pytest.mark.parametrize(
    ("ov", "message"),
    [
        (Overrides(page_sizes=(48, 20)), "--page-size: 20 is invalid"),
        (Overrides(ctx_spreads=(2.0,)), r"--ctx-spread: 2.0 is invalid"),
        (Overrides(seqlens=(64,), seqlens_q=(1,)), "--seqlen and --seqlen-q are mutually"),
        (Overrides(seqlens_q=(32,)), r"key 'seqlens_q': 32 new tokens.*\(after --seqlen-q\)"),
    ],
)
def test_override_errors_name_the_flag(tmp_path: Path, ov: Overrides, message: str) -> None:
    with pytest.raises(SuiteError, match=message):
        load_suite(write(tmp_path, BODY), ov, known_impls=KNOWN)


def test_a_decode_axis_without_the_decode_mode_is_refused() -> None:
    with pytest.raises(SuiteError, match="builtin:smoke: --page-size applies to decode"):
        load_suite("smoke", Overrides(page_sizes=(16,)), known_impls=KNOWN)
    with pytest.raises(SuiteError, match=r"'page_sizes' applies .* decode mode \(after --mode\)"):
        load_suite("decode", Overrides(modes=("fwd",)), known_impls=KNOWN)


def test_list_flag_parsers() -> None:
    assert page_size_items("--page-size", ["none,16", "0", "NONE"]) == (0, 16, 0, 0)
    assert float_items("--ctx-spread", ["1,0.25", ".5"]) == (1.0, 0.25, 0.5)
    for bad in ("nan", "inf", "x", "0,,1"):
        with pytest.raises(ListFlagError, match="--ctx-spread"):
            float_items("--ctx-spread", [bad])
    with pytest.raises(ListFlagError, match="--page-size: 'sixteen' is not an integer"):
        page_size_items("--page-size", ["sixteen"])


def test_run_passes_the_decode_flags_to_the_suite(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = []
    monkeypatch.setattr(cli, "run_command", lambda req, **kw: seen.append(req) or 0)
    args = ["run", "-s", "decode", "--seqlen-q", "1,2", "--seqlen-k", "96", "--page-size",
            "none", "--page-size", "32", "--ctx-spread", "0.5"]  # fmt: skip
    result = CliRunner().invoke(cli.app, args)
    assert result.exit_code == 0, result.output
    req = seen[0]
    assert (req.seqlens_q, req.seqlens_k, req.page_sizes, req.ctx_spreads) == (
        (1, 2), (96,), (0, 32), (0.5,))  # fmt: skip
    assert req.selects_cases
    cases = load_suite("decode", Overrides.from_flags(req), known_impls=KNOWN).cases
    assert {c.page_size for c in cases} == {0, 32} and {c.seqlen_k for c in cases} == {96}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--page-size", "24"], "--page-size: 24 is invalid"),
        (["--ctx-spread", "zero"], "--ctx-spread: 'zero' is not a number"),
        (["--seqlen-q", "x"], "--seqlen-q: 'x' is not an integer"),
    ],
)
def test_bad_decode_flags_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    result = CliRunner().invoke(
        cli.app, ["run", "-s", "decode", "--device", "cpu", "--out", str(tmp_path / "o"), *args]
    )
    assert result.exit_code == 2, result.output
    assert message in result.output


# ------------------------------------------------------------------------- the built-in suite


# The built-in suite's design and its CPU sizes: tests/test_decode_suite.py.
