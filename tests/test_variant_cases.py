"""Issue 19's case model: windows, ALiBi, softcap and packed (varlen) batches as Case
fields, their ids, validation and lengths, the FLOP and byte models' attended pairs and
packed tokens, the TOML axes and run's flags, and the built-in `variants` suite."""

from __future__ import annotations

import hashlib
import json
import math
import random
from pathlib import Path

import pytest
from typer.testing import CliRunner

import fa_bench.cli as cli
from fa_bench import models
from fa_bench.case import Case, alibi_slopes
from fa_bench.commands.lists import ListFlagError
from fa_bench.commands.variant_options import variant_axes, window_items
from fa_bench.compare.match import CaseFilter
from fa_bench.results.record import CaseRecord
from fa_bench.run.limits import tensor_bytes
from fa_bench.suite.expand import Overrides, SuiteError, load_suite
from fa_bench.variants import varlen_lengths, window_pairs

KNOWN = ("naive", "sdpa", "sdpa-math", "sdpa-efficient", "sdpa-cudnn", "flex", "triton", "fa4")

# Every built-in suite's cases before issue 19 (computed from commit 12bce7b's tree): the
# count and sha256[:16] of the ids, and of each case's dict, FLOPs, bytes and the size
# guard's tensor bytes (one line per case). `decode` was redesigned in session 5 (a
# covering design, a subset of its old cases): tests/test_decode_suite.py checks that the
# old file still expands to these digests, (6400, "9934ca529ddd641a", "48f44320ed1a2c78"),
# and that every case of the new one is one of them, unchanged.
BEFORE_VARIANTS = {
    "gqa": (240, "18bde27d56bd927c", "ed9f12bd0a13f97d"),
    "head-dims": (360, "f3d575f40a42d979", "0e5185185f516dcf"),
    "long-context": (128, "1e732ead375528e0", "94a979a641a08daa"),
    "smoke": (42, "71f0d816781fc74c", "1bbbf31c8b1c670b"),
    "standard": (672, "0f27762c9db4438b", "2f70b915f949b3bf"),
}


def case(**kw: object) -> Case:
    fields: dict = dict(impl="triton", mode="fwd", dtype="bf16", batch=4, heads_q=32, heads_kv=8,
                        seqlen_q=8192, seqlen_k=8192, head_dim=128, causal=True)  # fmt: skip
    fields.update(kw)
    return Case(**fields)


def _digest(lines: list[str]) -> str:
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]


# ------------------------------------------------------------------------- what stays


@pytest.mark.parametrize("name", sorted(BEFORE_VARIANTS))
def test_every_builtin_suite_keeps_its_ids_dicts_and_models(name: str) -> None:
    cases = load_suite(name).cases
    ids = [c.id for c in cases]
    rows = [
        json.dumps(c.to_dict(), sort_keys=True)
        + f" {models.case_flops(c)} {models.case_bytes(c)} {tensor_bytes(c)}"
        for c in cases
    ]
    assert (len(ids), _digest(ids), _digest(rows)) == BEFORE_VARIANTS[name]
    assert not any(c.is_variant for c in cases)


def _record(case_dict: dict) -> dict:
    return {"id": Case.from_dict(case_dict).id, **case_dict, "device": "cpu", "status": "ok",
            "error": None, "latency_ms": None, "tflops": None, "gbps_model": None,
            "peak_mem_bytes": None, "accuracy": None, "telemetry": None}  # fmt: skip


def test_an_old_record_loads_and_a_variant_record_round_trips() -> None:
    old = {"impl": "sdpa", "mode": "bwd", "dtype": "fp16", "batch": 2, "heads_q": 4,
           "heads_kv": 2, "seqlen_q": 8, "seqlen_k": 32, "head_dim": 16,
           "causal": False}  # fmt: skip
    record = CaseRecord.from_json(_record(old), "old.json[0]")
    assert not record.case.is_variant and record.case.window_left == -1
    assert "window_left" not in record.to_json() and not record.extra
    new = case(batch=3, seqlen_q=7, seqlen_k=7, window_left=2, window_right=0, alibi=True,
               softcap=30, varlen="list:3,5,7")  # fmt: skip
    d = json.loads(json.dumps(_record(new.to_dict())))
    assert {k: d[k] for k in ("window_left", "window_right", "alibi", "softcap", "varlen")} == {
        "window_left": 2, "window_right": 0, "alibi": True, "softcap": 30.0,
        "varlen": "list:3,5,7"}  # fmt: skip
    back = CaseRecord.from_json(d, "new.json[0]")
    assert back.case == new and not back.extra
    for key, bad in (("alibi", 1), ("softcap", "x"), ("varlen", 3), ("window_left", 1.5)):
        with pytest.raises(ValueError, match=key):
            CaseRecord.from_json({**d, key: bad}, "bad.json[0]")


# ------------------------------------------------------------------------- the case


def test_variant_ids_labels_and_dicts() -> None:
    base = "triton/fwd/bf16/b4-hq32-hkv8-sq8192-sk8192-d128/causal"
    assert case().id == base and case().to_dict() == Case.from_dict(case().to_dict()).to_dict()
    assert case(window_left=4096).id == base + "/win4096.inf"
    assert case(window_left=4096, window_right=0).id == base + "/win4096.0"
    assert case(window_right=7, causal=False).id.endswith("/full/wininf.7")
    assert case(alibi=True, softcap=50).id == base + "/alibi-cap50"
    assert case(softcap=2.5).id == base + "/cap2.5"
    packed = case(batch=3, seqlen_q=7, seqlen_k=7, varlen="list: 3, 7, 5")
    sha = hashlib.sha1(b"3,7,5").hexdigest()[:8]
    assert packed.id.endswith(f"/causal/var-l3.{sha}") and packed.varlen == "list:3,7,5"
    lengths = varlen_lengths("uniform:512-4096", 4)
    uni = case(seqlen_q=max(lengths), seqlen_k=max(lengths), varlen="Uniform:512-4096")
    assert uni.id.endswith("/causal/var-u512.4096") and uni.varlen == "uniform:512-4096"
    every = case(batch=3, seqlen_q=7, seqlen_k=7, window_left=2, window_right=0, alibi=True,
                 softcap=30, varlen="list:3,7,5")  # fmt: skip
    assert every.id.endswith(f"/causal/win2.0-alibi-cap30-var-l3.{sha}")
    assert every.label.endswith(" causal window=2,0 alibi softcap=30 varlen=list:3,7,5 T=15")
    assert set(every.to_dict()) - set(case().to_dict()) == {
        "window_left", "window_right", "alibi", "softcap", "varlen"}  # fmt: skip
    assert set(case(alibi=True).to_dict()) - set(case().to_dict()) == {"alibi"}


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"window_left": -2}, "window_left"),
        ({"window_right": 1.5}, "window_right"),
        ({"window_left": True}, "window_left"),
        ({"alibi": 1}, "alibi"),
        ({"softcap": -1}, "softcap"),
        ({"softcap": math.inf}, "softcap"),
        ({"softcap": math.nan}, "softcap"),
        ({"varlen": "uniform:5"}, "varlen"),
        ({"varlen": "poisson:1-5"}, "varlen"),
        ({"varlen": "uniform:0-5"}, "varlen"),
        ({"varlen": "uniform:9-5"}, "LO"),
        ({"varlen": "list:1,x"}, "varlen"),
        ({"varlen": "list:8,8"}, "batch is 4"),
        ({"varlen": "list:8,8,8,8"}, "seqlen_q and seqlen_k must both be the longest"),
        ({"mode": "decode", "seqlen_q": 1, "alibi": True}, "decode"),
    ],
)
def test_invalid_variants_name_the_field(fields: dict, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        case(**fields)


def test_sequence_lengths_are_fixed_by_the_case() -> None:
    assert (
        case(batch=3).sequence_lengths() == (8192,) * 3 and case(batch=3).total_tokens == 3 * 8192
    )
    # The contract's seeded draw, pinned, so every machine runs the same documents.
    rng = random.Random(0xD0C + 5)
    assert varlen_lengths("uniform:1-100", 5) == tuple(rng.randint(1, 100) for _ in range(5))
    assert varlen_lengths("uniform:1-100", 5) == (71, 93, 50, 75, 41)
    assert varlen_lengths("uniform:1-100", 5) == varlen_lengths("uniform: 1-100", 5)
    assert varlen_lengths("uniform:1-100", 6)[:5] != (71, 93, 50, 75, 41)  # seeded per batch
    drawn = varlen_lengths("uniform:512-4096", 64)
    assert min(drawn) >= 512 and max(drawn) <= 4096 and len(set(drawn)) > 32
    c = case(batch=64, seqlen_q=max(drawn), seqlen_k=max(drawn), varlen="uniform:512-4096")
    assert c.sequence_lengths() == drawn and c.total_tokens == sum(drawn)
    one = case(batch=3, seqlen_q=4, seqlen_k=4, varlen="list:1,4,1")
    assert one.sequence_lengths() == (1, 4, 1) and one.total_tokens == 6


def test_alibi_slopes_follow_the_paper_and_bloom() -> None:
    assert alibi_slopes(8) == [2.0**-i for i in range(1, 9)]
    assert alibi_slopes(1) == [2.0**-8]
    # 12 heads: the 8 of the power below, then every other slope of 16 heads.
    sixteen = [2.0 ** (-i / 2) for i in range(1, 17)]
    assert alibi_slopes(12) == pytest.approx([2.0**-i for i in range(1, 9)] + sixteen[0::2][:4])
    with pytest.raises(ValueError, match="heads"):
        alibi_slopes(0)


# ------------------------------------------------------------------------- the models


def _brute(sq: int, sk: int, causal: bool, left: int, right: int) -> int:
    o, right = sk - sq, 0 if causal else right
    return sum(
        (left == -1 or j >= i + o - left) and (right == -1 or j <= i + o + right)
        for i in range(sq)
        for j in range(sk)
    )


def test_window_pairs_match_brute_force() -> None:
    """Every small shape: Sq < Sk and Sq > Sk, windows that leave rows empty (a right
    window with Sq > Sk), causal with a left window, zero-width windows."""
    for sq in range(1, 8):
        for sk in range(1, 8):
            for causal in (False, True):
                for left in range(-1, 9):
                    for right in range(-1, 9):
                        got = window_pairs(sq, sk, causal, left, right)
                        assert got == _brute(sq, sk, causal, left, right), (
                            sq,
                            sk,
                            causal,
                            left,
                            right,
                        )
    assert window_pairs(6, 3, False, 0, 0) == 3  # rows 0-2 see no key
    assert window_pairs(8192, 8192, True) == models.attended_pairs(8192, 8192, True)


def test_window_pairs_at_h200_sizes_by_hand() -> None:
    n, w = 32768, 4096
    # Causal with a left window of w: rows 0..w-1 see i+1 keys, the rest w+1.
    assert window_pairs(n, n, True, w, -1) == w * (w + 1) // 2 + (n - w) * (w + 1)
    # About a quarter of the causal pairs, as the issue says.
    assert 0.2 < window_pairs(n, n, True, w, -1) / window_pairs(n, n, True) < 0.25


def test_flops_and_bytes_by_hand() -> None:
    d, h, hkv = 64, 4, 2
    dense = case(batch=2, heads_q=h, heads_kv=hkv, seqlen_q=10, seqlen_k=10, head_dim=d)
    win = case(batch=2, heads_q=h, heads_kv=hkv, seqlen_q=10, seqlen_k=10, head_dim=d,
               window_left=3)  # fmt: skip
    # Causal, left 3: rows 0-2 see 1, 2, 3 keys, rows 3-9 four each = 34 pairs per sequence.
    assert models.forward_flops(win) == 4 * h * d * 2 * 34
    assert models.forward_flops(dense) == 4 * h * d * 2 * 55
    # ALiBi and softcap add no FLOPs and no bytes; the window adds no bytes.
    capped = case(batch=2, heads_q=h, heads_kv=hkv, seqlen_q=10, seqlen_k=10, head_dim=d,
                  alibi=True, softcap=50)  # fmt: skip
    assert models.case_flops(capped) == models.case_flops(dense)
    assert models.case_bytes(win) == models.case_bytes(capped) == models.case_bytes(dense)
    # Packed: documents 3, 7, 5 (T = 15), each its own causal sequence; no padding to 7.
    packed = case(mode="bwd", batch=3, heads_q=h, heads_kv=hkv, seqlen_q=7, seqlen_k=7,
                  head_dim=d, varlen="list:3,7,5")  # fmt: skip
    pairs = 6 + 28 + 15
    assert models.case_flops(packed) == 2.5 * 4 * h * d * pairs
    t, item = 15, 2
    q, kv, lse = h * t * d * item, hkv * t * d * item, h * t * 4
    assert models.forward_bytes(packed) == 2 * q + 2 * kv
    assert models.case_bytes(packed) == 3 * q + 2 * kv + lse + q + 2 * kv
    assert tensor_bytes(packed) == 2 * (2 * h * t * d + 2 * hkv * t * d) * item
    # A window inside packed documents counts per document.
    both = case(batch=3, heads_q=h, heads_kv=hkv, seqlen_q=7, seqlen_k=7, head_dim=d,
                varlen="list:3,7,5", window_left=1)  # fmt: skip
    assert models.forward_flops(both) == 4 * h * d * (5 + 13 + 9)


# ------------------------------------------------------------------------- suites


def write(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "v.toml"
    path.write_text('name = "v"\ndescription = "variant test"\n' + body)
    return path


BODY = """\
impls = "naive"
modes = ["fwd", "bwd"]
dtypes = "fp32"
batch = 2
heads_q = 4
heads_kv = 2
seqlens = [16, 32]
head_dims = 16
causal = true
"""


def test_toml_variant_axes_expand(tmp_path: Path) -> None:
    body = BODY + (
        "windows = [[8, 0], [-1, -1]]\nalibi = [false, true]\nsoftcaps = [0, 50]\n"
        'varlens = ["", "list:3,12"]\n'
    )
    cases = load_suite(write(tmp_path, body), known_impls=KNOWN).cases
    dense = [c for c in cases if not c.varlen]
    packed = [c for c in cases if c.varlen]
    assert len(dense) == 2 * 2 * 2 * 2 * 2  # modes, seqlens, windows, alibi, softcaps
    assert len(packed) == 2 * 2 * 2 * 2  # one per variant: the seqlens give way
    # A list spec's batch is its count, whatever the suite's batch.
    assert {(c.batch, c.seqlen_q, c.seqlen_k) for c in packed} == {(2, 12, 12)}
    three = load_suite(write(tmp_path, BODY + 'varlens = "list:3,12,5"\n'), known_impls=KNOWN)
    assert {(c.batch, c.seqlen_q, c.total_tokens) for c in three.cases} == {(3, 12, 20)}
    assert {c.softcap for c in cases} == {0.0, 50.0} and {c.alibi for c in cases} == {0, 1}
    assert {(c.window_left, c.window_right) for c in cases} == {(8, 0), (-1, -1)}
    # No variant axis: the cases of before.
    plain = load_suite(write(tmp_path, BODY), known_impls=KNOWN).cases
    assert len(plain) == 4 and not any(c.is_variant for c in plain)


def test_tokens_size_a_packed_batch(tmp_path: Path) -> None:
    body = BODY.replace("batch = 2", "tokens = 4096") + 'varlens = ["uniform:100-300"]\n'
    (c, *_) = load_suite(write(tmp_path, body), known_impls=KNOWN).cases
    assert c.batch == round(4096 / 200) and c.seqlen_q == max(c.sequence_lengths())


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("windows = [4096, 0]", r"key 'windows': 4096 is not a window"),
        ("windows = [[4096]]", "key 'windows'"),
        ("windows = [[-2, 0]]", r"key 'windows': \[-2, 0\]: left must be -1"),
        ('windows = [["a", 0]]', "key 'windows'"),
        ("alibi = 1", "key 'alibi': expected true, false"),
        ("softcaps = [-1]", "key 'softcaps': softcap must be 0"),
        ("softcaps = [inf]", "key 'softcaps'"),
        ('softcaps = ["50"]', "key 'softcaps'"),
        ('varlens = ["uniform:5-1"]', r"key 'varlens': varlen 'uniform:5-1': LO"),
        ('varlens = ["gauss:1-2"]', "key 'varlens'.*does not parse"),
        ('modes = "decode"\nwindows = [[8, 0]]', "key 'windows' applies to fwd, bwd"),
    ],
)
def test_toml_variant_errors_name_the_file_and_key(
    tmp_path: Path, extra: str, message: str
) -> None:
    body = BODY.replace('modes = ["fwd", "bwd"]\n', "") if "modes" in extra else BODY
    body = body.replace("seqlens = [16, 32]", "seqlens = 16") if "decode" in extra else body
    path = write(tmp_path, body + extra + "\n")
    with pytest.raises(SuiteError, match=message) as info:
        load_suite(path, known_impls=KNOWN)
    assert str(path) in str(info.value)


def test_overrides_replace_the_variant_axes(tmp_path: Path) -> None:
    path = write(tmp_path, BODY + "windows = [[8, 0]]\nsoftcaps = 50\n")
    ov = Overrides(windows=((4, 4), (-1, -1)), alibi=True, softcaps=(0.0,), varlens=("",))
    cases = load_suite(path, ov, known_impls=KNOWN).cases
    assert {(c.window_left, c.window_right, c.alibi, c.softcap) for c in cases} == {
        (4, 4, True, 0.0), (-1, -1, True, 0.0)}  # fmt: skip
    for bad, message in (
        (Overrides(windows=((-3, 0),)), "--window: .*left must be -1"),
        (Overrides(softcaps=(-2.0,)), "--softcap: softcap must be 0"),
        (Overrides(varlens=("list:9,0",)), "--varlen: varlen 'list:9,0': every length"),
        (Overrides(varlens=("x",)), "--varlen: varlen 'x' does not parse"),
        (Overrides(alibi=1), "--alibi: expected true or false"),  # type: ignore[arg-type]
    ):
        with pytest.raises(SuiteError, match=message):
            load_suite(path, bad, known_impls=KNOWN)


def test_the_variant_flags_parse() -> None:
    assert window_items("--window", ["4096,0", "inf, 8", "none", "-1,-1"]) == (
        (4096, 0), (-1, 8), (-1, -1), (-1, -1))  # fmt: skip
    for bad in ("4096", "a,0", "1,2,3", "-2,0"):
        with pytest.raises(ListFlagError, match="--window"):
            window_items("--window", [bad])
    axes = variant_axes(None, False, ["0,50", "30"], ["uniform:1-9", "none", "list:1,2"])
    assert axes == {"windows": (), "alibi": False, "softcaps": (0.0, 50.0, 30.0),
                    "varlens": ("uniform:1-9", "", "list:1,2")}  # fmt: skip


def test_run_passes_the_variant_flags_to_the_suite(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = []
    monkeypatch.setattr(cli, "run_command", lambda req, **kw: seen.append(req) or 0)
    args = ["run", "-s", "smoke", "--window", "16,0", "--window", "none", "--alibi",
            "--softcap", "0,30", "--varlen", "uniform:8-64"]  # fmt: skip
    result = CliRunner().invoke(cli.app, args)
    assert result.exit_code == 0, result.output
    req = seen[0]
    assert (req.windows, req.alibi, req.softcaps, req.varlens) == (
        ((16, 0), (-1, -1)), True, (0.0, 30.0), ("uniform:8-64",))  # fmt: skip
    assert req.selects_cases
    cases = load_suite("smoke", Overrides.from_flags(req), known_impls=KNOWN).cases
    assert all(c.alibi and c.varlen == "uniform:8-64" for c in cases)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--window", "4096"], "--window: '4096' is not LEFT,RIGHT"),
        (["--window", "-5,0"], "--window: "),
        (["--softcap", "big"], "--softcap: 'big' is not a number"),
        (["--softcap", "-1"], "--softcap: softcap must be 0"),
        (["--varlen", "uniform:9-1"], "--varlen: varlen 'uniform:9-1'"),
    ],
)
def test_bad_variant_flags_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    result = CliRunner().invoke(
        cli.app, ["run", "-s", "smoke", "--device", "cpu", "--out", str(tmp_path / "o"), *args]
    )
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_sweep_refuses_variant_cases(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        cli.app, ["sweep", "-s", "variants", "--device", "cpu", "--out", str(tmp_path / "s")]
    )
    assert result.exit_code == 2, result.output
    assert "sweep tunes dense attention only" in result.output


# ------------------------------------------------------------------------- the built-in suite


def test_the_variants_suite_is_the_issue_grid() -> None:
    cases = load_suite("variants", known_impls=KNOWN).cases
    assert {c.impl for c in cases} == set(KNOWN)
    assert {c.dtype.value for c in cases} == {"bf16", "fp16"} and all(c.causal for c in cases)
    assert {c.mode.value for c in cases} == {"fwd", "bwd"}
    ids = {c.id for c in cases}
    windowed = {c.seqlen_q for c in cases if c.window_left == 4096 and not c.softcap}
    assert windowed == {8192, 16384, 32768, 65536}
    assert {c.head_dim for c in cases if c.window_left == 4096} == {64, 128}
    assert {c.window_left for c in cases if c.softcap == 50} == {4096, -1}
    assert {c.seqlen_q for c in cases if c.alibi} == {2048, 4096, 8192, 16384}
    packed = [c for c in cases if c.varlen]
    assert all(14_000 < c.total_tokens < 80_000 for c in packed)
    assert len({c.sequence_lengths() for c in packed}) > 1
    # Every variant has its dense control: the same shape without the last id segment.
    for c in cases:
        if c.is_variant and not c.varlen:
            assert c.id.rsplit("/", 1)[0] in ids, c.id
    # Packed batches' control: equal 2048-token sequences, as many as the documents (the
    # specs' mean length is 2048, so the same tokens on average).
    for c in packed:
        shape = f"b{c.batch}-hq32-hkv8-sq2048-sk2048-d128/causal"
        assert f"{c.impl}/{c.mode.value}/{c.dtype.value}/{shape}" in ids, c.id


def test_the_variants_suite_at_cpu_sizes() -> None:
    """The override set of docs/suites.md: tiny cases, every variant and its control."""
    ov = Overrides(dtypes=("fp32",), impls=("naive", "sdpa", "sdpa-math", "triton"),
                   seqlens=(64,), batch=(2,), heads=(4,), kv_heads=(2,), head_dims=(32,),
                   windows=((16, 0), (-1, -1)), softcaps=(0.0, 30.0),
                   varlens=("uniform:8-64", ""))  # fmt: skip
    cases = load_suite("variants", ov, known_impls=KNOWN).cases
    assert len(cases) == 4 * 2 * (2 * 2 * 2 * 2)  # impls, modes, windows x softcap x varlen x alibi
    assert max(tensor_bytes(c) for c in cases) < 2**20


@pytest.mark.slow
def test_the_documented_cpu_recipe_runs_ok_or_unsupported(tmp_path: Path) -> None:
    """docs/suites.md's CPU command (about 25 s on two cores): every case ok or
    unsupported, each implementation's dense cases ok, naive every variant."""
    out = tmp_path / "run"
    args = ["run", "-s", "variants", "--device", "cpu", "--dtype", "fp32",
            "--impl", "naive,sdpa,sdpa-math,triton", "--seqlen", "64", "--batch", "2",
            "--heads", "4", "--kv-heads", "2", "--head-dim", "32", "--window", "16,0",
            "--window", "none", "--softcap", "0,30", "--varlen", "uniform:8-64",
            "--varlen", "none", "--max-time", "0.05", "--min-samples", "3",
            "--out", str(out), "--no-report"]  # fmt: skip
    result = CliRunner().invoke(cli.app, args)
    assert result.exit_code == 0, result.output
    records = json.loads((out / "results.json").read_text())["cases"]
    assert len(records) == 128
    assert {r["status"] for r in records} <= {"ok", "unsupported"}
    cases = {r["id"]: Case.from_dict(r) for r in records}
    statuses = {r["id"]: r["status"] for r in records}
    assert all(statuses[i] == "ok" for i, c in cases.items() if not c.is_variant)
    assert all(statuses[i] == "ok" for i, c in cases.items() if c.impl == "naive")


def test_compare_filters_on_the_variant_fields() -> None:
    dense = CaseRecord.from_json(_record(case().to_dict()), "r[0]")
    windowed = CaseRecord.from_json(_record(case(window_left=4096, softcap=50).to_dict()), "r[1]")
    for text, want in (
        ("window_left=4096", (False, True)),
        ("window_left=-1", (True, False)),
        ("softcap=50", (False, True)),
        ("softcap=0", (True, False)),
        ("alibi=false", (True, True)),
        ("varlen=", (True, True)),
    ):
        f = CaseFilter.parse(text)
        assert (f.matches(dense), f.matches(windowed)) == want, text


def test_a_huge_packed_batch_is_refused_not_drawn(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="batch 4611686018427387907 is too many documents"):
        varlen_lengths("uniform:1-9", 4611686018427387907)
    ov = Overrides(batch=(2**62 + 3,), varlens=("uniform:1-9",))
    with pytest.raises(SuiteError, match="too many documents"):
        load_suite(write(tmp_path, BODY), ov, known_impls=KNOWN)
    # Equal lengths at that batch: no tuple of lengths is built for the token count.
    assert case(batch=2**62 + 3).total_tokens == (2**62 + 3) * 8192


def test_results_csv_names_every_rows_variant_only_in_variant_runs(tmp_path: Path) -> None:
    from fa_bench.results.files import build_document, to_frame

    dense = CaseRecord.from_json(_record(case().to_dict()), "r[0]")
    windowed = CaseRecord.from_json(_record(case(window_left=4096).to_dict()), "r[1]")
    plain = to_frame(build_document({}, {}, [dense]))
    assert "window_left" not in plain.columns  # a dense run's CSV as before issue 19
    frame = to_frame(build_document({}, {}, [dense, windowed]))
    columns = list(frame.columns)
    at = columns.index("causal")
    assert columns[at + 1 : at + 6] == ["window_left", "window_right", "alibi", "softcap", "varlen"]
    assert (
        frame["window_left"].tolist() == [-1, 4096] and str(frame["window_left"].dtype) == "int64"
    )
    assert frame["varlen"].tolist() == ["", ""] and frame["softcap"].tolist() == [0.0, 0.0]
