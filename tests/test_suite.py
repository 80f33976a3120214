"""Suite files: the built-in grids, validation messages, overrides, groups and de-duplication."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

import fa_bench.suite.expand as suite_mod
from fa_bench.case import PREFILL_MODES, Case, DType, Mode
from fa_bench.suite.expand import Overrides, SuiteError, builtin_suites, load_suite, load_suites

GPU_IMPLS = ["naive", "sdpa", "sdpa-flash", "sdpa-efficient", "sdpa-cudnn", "flex", "triton"]
KNOWN = (*GPU_IMPLS, "sdpa-math", "fa4")
BUILTINS = ["decode", "gqa", "head-dims", "long-context", "smoke", "standard", "variants"]

# A minimal valid suite body; tests drop or change single lines of it.
AXES = """\
impls = "sdpa"
modes = "fwd"
dtypes = "fp16"
batch = 1
heads_q = 2
seqlens = 64
head_dims = 32
causal = false
"""


def write(tmp_path: Path, body: str, header: bool = True) -> Path:
    path = tmp_path / "x.toml"
    text = 'name = "x"\ndescription = "test suite"\n' + body if header else body
    path.write_text(text)
    return path


def without(line_start: str, body: str = AXES) -> str:
    return "".join(line for line in body.splitlines(True) if not line.startswith(line_start))


def load_error(path: Path, **kwargs: object) -> str:
    with pytest.raises(SuiteError) as info:
        load_suite(str(path), **kwargs)
    message = str(info.value)
    assert message.startswith(f"{path}: "), message
    return message


# ---------------------------------------------------------------------------- built-ins


def test_builtin_suites_are_listed_with_descriptions() -> None:
    suites = builtin_suites()
    assert list(suites) == BUILTINS
    assert all(len(d) > 20 for d in suites.values())


@pytest.mark.parametrize("name", BUILTINS)
def test_builtin_suite_loads(name: str) -> None:
    suite = load_suite(name, known_impls=KNOWN)
    assert suite.name == name
    assert suite.source == f"builtin:{name}"
    assert suite.description == builtin_suites()[name]
    assert len({c.id for c in suite.cases}) == len(suite.cases)


def test_standard_is_the_flash_attention_grid() -> None:
    cases = load_suite("standard", known_impls=KNOWN).cases
    assert len(cases) == 7 * 96
    assert Counter(c.impl for c in cases) == dict.fromkeys(GPU_IMPLS, 96)
    assert all(c.batch * c.seqlen_q == 16384 for c in cases)
    assert all(c.heads_q * c.head_dim == 2048 for c in cases)
    assert all(c.heads_kv == c.heads_q and c.seqlen_q == c.seqlen_k for c in cases)
    assert {c.seqlen_q for c in cases} == {512, 1024, 2048, 4096, 8192, 16384}
    assert {c.head_dim for c in cases} == {64, 128}
    assert {c.mode for c in cases} == {Mode.FWD, Mode.BWD}
    assert {c.dtype for c in cases} == {DType.FP16, DType.BF16}
    assert {c.causal for c in cases} == {False, True}


def test_long_context_shape() -> None:
    cases = load_suite("long-context", known_impls=KNOWN).cases
    assert len(cases) == 4 * 8 * 2 * 2
    assert {c.seqlen_q for c in cases} == {2**p for p in range(10, 18)}
    assert {(c.batch, c.heads_q, c.heads_kv, c.head_dim) for c in cases} == {(1, 16, 16, 128)}
    assert "naive" not in {c.impl for c in cases}


def test_head_dims_shape() -> None:
    cases = load_suite("head-dims", known_impls=KNOWN).cases
    assert len(cases) == 5 * 6 * 3 * 2 * 2
    assert {c.head_dim for c in cases} == {32, 64, 96, 128, 192, 256}
    assert all(c.batch * c.seqlen_q == 16384 and c.heads_q == 16 for c in cases)


def test_gqa_shape() -> None:
    cases = load_suite("gqa", known_impls=KNOWN).cases
    assert len(cases) == 5 * 4 * 3 * 2 * 2
    assert {c.heads_kv for c in cases} == {32, 8, 4, 1}
    assert all(c.heads_q == 32 and c.batch * c.seqlen_q == 16384 for c in cases)


def test_smoke_stays_small_and_cpu_only() -> None:
    cases = load_suite("smoke", known_impls=["naive", "sdpa", "sdpa-math"]).cases
    assert len(cases) <= 42
    assert {c.dtype for c in cases} == {DType.FP32}
    # Every prefill mode; decode (a cache, per-sequence lengths) has its own suite.
    assert {c.mode for c in cases} == set(PREFILL_MODES)
    assert max(c.seqlen_k for c in cases) <= 128
    gqa = [c for c in cases if c.heads_kv != c.heads_q]
    assert len(gqa) == 3 * 2
    assert {(c.heads_q, c.heads_kv, c.seqlen_q, c.seqlen_k, c.causal) for c in gqa} == {
        (4, 1, 17, 100, True)
    }


# ---------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (AXES + "seqlen = 64\n", ["unknown key 'seqlen'", "valid keys:", "seqlens", "tokens"]),
        (without("batch") + "batch = true\n", ["key 'batch'", "got true"]),
        (without("causal") + "causal = 1\n", ["key 'causal'", "got 1"]),
        (without("head_dims") + 'head_dims = "64"\n', ["key 'head_dims'", "'64'"]),
        (without("seqlens") + "seqlens = [64.0]\n", ["key 'seqlens'", "64.0"]),
        (without("impls") + "impls = [1]\n", ["key 'impls'", "got 1"]),
        (without("batch") + "batch = 0\n", ["key 'batch': 0 is not a positive integer"]),
        (without("heads_q") + "heads_q = [2, -4]\n", ["key 'heads_q': -4 is not"]),
        (AXES + "tokens = 1024\n", ["keys 'batch' and 'tokens' are mutually exclusive"]),
        (AXES + "hidden = 64\n", ["keys 'heads_q' and 'hidden' are mutually exclusive"]),
        (AXES + "seqlens_q = 64\n", ["keys 'seqlens' and 'seqlens_q' are mutually exclusive"]),
        (without("impls"), ["missing key 'impls'"]),
        (without("causal"), ["missing key 'causal'"]),
        (without("batch"), ["missing key 'batch' (or 'tokens')"]),
        (without("heads_q"), ["missing key 'heads_q' (or 'hidden')"]),
        (without("seqlens"), ["missing key 'seqlens' (or 'seqlens_q' and 'seqlens_k')"]),
        (without("seqlens") + "seqlens_q = 64\n", ["key 'seqlens_q' needs 'seqlens_k'"]),
        (
            without("modes") + 'modes = ["fwd", "fwdd"]\n',
            ["'fwdd' is not one of fwd, bwd, fwd_bwd"],
        ),
        (without("impls") + "impls = []\n", ["key 'impls': empty list"]),
        (AXES + "heads_kv = 4\n", ["heads_q 2 is not a multiple of heads_kv 4"]),
        (
            without("heads_q") + "hidden = 100\n",
            ["hidden 100 is not divisible by head_dim 32"],
        ),
        (AXES + "group = 3\n", ["key 'group': expected [[group]] tables"]),
        (AXES + "group = []\n", ["key 'group': no groups"]),
        (AXES + "[[group]]\ndescription = 'no'\n", ["group 1: unknown key 'description'"]),
        (AXES + "[[group]]\nname = 5\n", ["group 1: key 'name'"]),
    ],
)
def test_invalid_suite_names_file_and_key(tmp_path: Path, body: str, expected: list[str]) -> None:
    message = load_error(write(tmp_path, body))
    for part in expected:
        assert part in message


def test_bad_dtype_message_format(tmp_path: Path) -> None:
    path = write(tmp_path, without("dtypes") + 'dtypes = "fp8"\n')
    valid = "fp32, fp16, bf16, fp8_e4m3"
    assert load_error(path) == f"{path}: key 'dtypes': 'fp8' is not one of {valid}"


def test_unknown_impl_lists_known_ones(tmp_path: Path) -> None:
    path = write(tmp_path, without("impls") + 'impls = ["sdpa", "flash3"]\n')
    message = load_error(path, known_impls=["sdpa", "naive"])
    assert "key 'impls': 'flash3' is not one of naive, sdpa" in message
    assert len(load_suite(str(path)).cases) == 2  # without a registry any name goes


@pytest.mark.parametrize("key", ["name", "description"])
def test_name_and_description_required(tmp_path: Path, key: str) -> None:
    text = 'name = "x"\ndescription = "d"\n'
    body = without(key, text) + AXES
    assert f"missing key '{key}'" in load_error(write(tmp_path, body, header=False))


def test_toml_syntax_error_names_line(tmp_path: Path) -> None:
    message = load_error(write(tmp_path, without("batch") + "batch = = 1\n"))
    assert "invalid TOML" in message
    assert "line 10" in message


def test_gqa_divisibility_names_group(tmp_path: Path) -> None:
    body = AXES + '[[group]]\nname = "ok"\n[[group]]\nname = "bad"\nheads_q = 6\nheads_kv = 4\n'
    message = load_error(write(tmp_path, body))
    assert "group 2 'bad': heads_q 6 is not a multiple of heads_kv 4" in message


def test_missing_key_in_group_names_group(tmp_path: Path) -> None:
    body = without("impls") + '[[group]]\nname = "g"\nmodes = "bwd"\n'
    message = load_error(write(tmp_path, body))
    assert "group 1 'g': missing key 'impls' (set it at the top level or in the group)" in message


def test_case_errors_become_suite_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(**kwargs: object) -> Case:
        raise ValueError("head_dim must be a positive integer")

    monkeypatch.setattr(suite_mod, "Case", broken)
    assert "head_dim must be a positive integer" in load_error(write(tmp_path, AXES))


def test_unknown_suite_name_lists_builtins() -> None:
    with pytest.raises(SuiteError, match="unknown suite 'smok'") as info:
        load_suite("smok")
    assert ", ".join(BUILTINS) in str(info.value)


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.toml"
    with pytest.raises(SuiteError, match="cannot read suite file") as info:
        load_suite(str(path))
    assert str(path) in str(info.value)


# ---------------------------------------------------------------------------- grids


def test_tokens_give_batch(tmp_path: Path) -> None:
    body = without("batch", without("seqlens")) + "tokens = 1000\nseqlens = [100, 300, 2000]\n"
    cases = load_suite(str(write(tmp_path, body))).cases
    assert [(c.batch, c.seqlen_q) for c in cases] == [(10, 100), (3, 300), (1, 2000)]


def test_seqlens_q_k_product(tmp_path: Path) -> None:
    body = without("seqlens") + "seqlens_q = [1, 17]\nseqlens_k = [100, 123]\n"
    cases = load_suite(str(write(tmp_path, body))).cases
    assert [(c.seqlen_q, c.seqlen_k) for c in cases] == [(1, 100), (1, 123), (17, 100), (17, 123)]


def test_hidden_gives_heads(tmp_path: Path) -> None:
    body = without("heads_q", without("head_dims")) + "hidden = 256\nhead_dims = [32, 64]\n"
    cases = load_suite(str(write(tmp_path, body))).cases
    assert [(c.head_dim, c.heads_q, c.heads_kv) for c in cases] == [(32, 8, 8), (64, 4, 4)]


def test_order_is_impl_mode_dtype_headdim_causal_seqlen(tmp_path: Path) -> None:
    body = (
        'impls = ["b", "a"]\nmodes = ["bwd", "fwd"]\ndtypes = "bf16"\nbatch = 1\nheads_q = 2\n'
        "head_dims = [64, 32]\ncausal = [true, false]\nseqlens = [128, 64]\n"
    )
    cases = load_suite(str(write(tmp_path, body))).cases
    keys = [(c.impl, c.mode.value, c.head_dim, c.causal, c.seqlen_q) for c in cases]
    assert keys[:5] == [
        ("b", "bwd", 64, True, 128),
        ("b", "bwd", 64, True, 64),
        ("b", "bwd", 64, False, 128),
        ("b", "bwd", 64, False, 64),
        ("b", "bwd", 32, True, 128),
    ]
    assert keys[-1] == ("a", "fwd", 32, False, 64)
    assert len(cases) == 32


def test_groups_inherit_override_and_union(tmp_path: Path) -> None:
    body = AXES + (
        '[[group]]\nname = "base"\n'
        '[[group]]\nname = "long"\ntokens = 1024\nseqlens = [256, 512]\nmodes = ["fwd", "bwd"]\n'
        '[[group]]\nname = "ragged"\nseqlens_q = 17\nseqlens_k = 100\ncausal = true\n'
    )
    cases = load_suite(str(write(tmp_path, body))).cases
    shapes = [(c.mode.value, c.batch, c.seqlen_q, c.seqlen_k, c.causal) for c in cases]
    assert shapes == [
        ("fwd", 1, 64, 64, False),
        ("fwd", 4, 256, 256, False),
        ("fwd", 2, 512, 512, False),
        ("bwd", 4, 256, 256, False),
        ("bwd", 2, 512, 512, False),
        ("fwd", 1, 17, 100, True),
    ]


def test_duplicate_cases_within_a_suite_are_dropped(tmp_path: Path) -> None:
    body = without("seqlens") + "seqlens = [64, 64]\n[[group]]\n[[group]]\ncausal = [false, true]\n"
    cases = load_suite(str(write(tmp_path, body))).cases
    assert [c.causal for c in cases] == [False, True]


def test_load_suites_dedups_across_suites_in_order(tmp_path: Path) -> None:
    body = (
        'impls = ["sdpa", "flex"]\nmodes = "fwd"\ndtypes = "fp32"\nbatch = 1\nheads_q = 2\n'
        "head_dims = 32\ncausal = false\nseqlens = [64, 256]\n"
    )
    path = write(tmp_path, body)
    smoke, extra = load_suites(["smoke", str(path)])
    assert smoke.cases == load_suite("smoke").cases
    assert [(c.impl, c.seqlen_q) for c in extra.cases] == [
        ("sdpa", 256),
        ("flex", 64),
        ("flex", 256),
    ]
    again = load_suites(["smoke", "smoke"])
    assert again[1].cases == ()


# ---------------------------------------------------------------------------- overrides


def test_overrides_replace_axes() -> None:
    ov = Overrides(impls=("sdpa",), modes=(Mode.FWD,), dtypes=("bf16",), head_dims=(64,))
    cases = load_suite("smoke", ov, known_impls=KNOWN).cases
    assert {(c.impl, c.mode, c.dtype, c.head_dim) for c in cases} == {
        ("sdpa", Mode.FWD, DType.BF16, 64)
    }
    assert len(cases) == 2 * 2 + 1


def test_seqlen_override_pairs_q_and_k() -> None:
    cases = load_suite("smoke", Overrides(seqlens=(32, 48))).cases
    assert {(c.seqlen_q, c.seqlen_k) for c in cases} == {(32, 32), (48, 48)}


def test_batch_and_heads_override_tokens_and_hidden() -> None:
    cases = load_suite("standard", Overrides(batch=(2,), heads=(8,))).cases
    assert {(c.batch, c.heads_q, c.heads_kv) for c in cases} == {(2, 8, 8)}
    assert len(cases) == 7 * 96


def test_causal_override() -> None:
    cases = load_suite("standard", Overrides(causal=True)).cases
    assert {c.causal for c in cases} == {True}
    assert len(cases) == 7 * 48


@pytest.mark.parametrize(
    ("heads", "kv_heads", "expected"),
    [
        ((64,), None, {32, 8, 4, 1}),  # every suite heads_kv divides 64: kept
        ((16,), None, {16}),  # 32 does not divide 16: plain MHA
        ((16,), (2,), {2}),
        (None, (2,), {2}),
    ],
)
def test_heads_override_rule(
    heads: tuple[int, ...] | None, kv_heads: tuple[int, ...] | None, expected: set[int]
) -> None:
    cases = load_suite("gqa", Overrides(heads=heads, kv_heads=kv_heads)).cases
    assert {c.heads_kv for c in cases} == expected


def test_kv_heads_override_that_does_not_divide_names_flag() -> None:
    with pytest.raises(
        SuiteError, match=r"heads_q 32 is not a multiple of heads_kv 3 \(after --kv-heads\)"
    ):
        load_suite("gqa", Overrides(kv_heads=(3,)))


def test_head_dim_override_that_breaks_hidden_names_flag() -> None:
    with pytest.raises(
        SuiteError, match=r"hidden 2048 is not divisible by head_dim 96 \(after --head-dim\)"
    ):
        load_suite("standard", Overrides(head_dims=(96,)))


@pytest.mark.parametrize(
    ("ov", "expected"),
    [
        (Overrides(modes=("fwdd",)), "--mode: 'fwdd' is not one of fwd, bwd, fwd_bwd"),
        (Overrides(dtypes=("fp8",)), "--dtype: 'fp8' is not one of fp32, fp16, bf16"),
        (Overrides(impls=("flash3",)), "--impl: 'flash3' is not one of"),
        (Overrides(seqlens=(0,)), "--seqlen: 0 is not a positive integer"),
        (Overrides(head_dims=(-64,)), "--head-dim: -64 is not a positive integer"),
        (Overrides(batch=(True,)), "--batch: True is not a positive integer"),
        (Overrides(heads=(0,)), "--heads: 0 is not a positive integer"),
        (Overrides(kv_heads=(0,)), "--kv-heads: 0 is not a positive integer"),
    ],
)
def test_invalid_overrides_name_the_flag(ov: Overrides, expected: str) -> None:
    with pytest.raises(SuiteError) as info:
        load_suite("smoke", ov, known_impls=KNOWN)
    assert str(info.value).startswith(expected)
    if ov.impls:
        assert ", ".join(sorted(KNOWN)) in str(info.value)


def test_empty_override_keeps_the_suite_axis() -> None:
    assert load_suite("smoke", Overrides(modes=())).cases == load_suite("smoke").cases
