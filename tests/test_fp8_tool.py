"""The fp8_e4m3 dtype across the tool (issue 21, item 3): the case model and its suite and
CLI checks, the byte model, the per-tensor quantisation, the accuracy rule, the registry's
opt-in (every other implementation records "no fp8_e4m3 forward in <impl>"), the record's
fp8_scales, and one case through run_case on the CPU with fp8 implementations written
here in torch (the kernel itself is tested in tests/test_fp8_kernel.py)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import fa_bench.cli as cli
from fa_bench import models, registry
from fa_bench.case import Case, DType
from fa_bench.kernels.flash_fp8 import dequantize_fp8, fp8_v_layout, quantize_fp8
from fa_bench.results.record import CaseRecord, ResultsError
from fa_bench.run.accuracy import E4M3_STEP, check_fp8_accuracy, reference_attention
from fa_bench.run.execute import ExecOptions, run_case
from fa_bench.run.fp8_inputs import OPTION, quantise_inputs, with_descales
from fa_bench.run.timing import TimingConfig
from fa_bench.suite.expand import load_suite
from fa_bench.suite.parse import SuiteError

runner = CliRunner()
SHAPE = dict(batch=1, heads_q=4, heads_kv=2, seqlen_q=40, seqlen_k=56, head_dim=32)


def fp8_case(impl: str = "triton", causal: bool = True, **kw: object) -> Case:
    return Case(impl=impl, mode="fwd", dtype="fp8_e4m3", causal=causal, **{**SHAPE, **kw})


# ------------------------------------------------------------------------------------------
# The case model, suites and the CLI
# ------------------------------------------------------------------------------------------


def test_dtype_itemsize_and_torch_dtype():
    assert DType("fp8_e4m3") is DType.FP8_E4M3
    assert DType.FP8_E4M3.itemsize == 1
    assert DType.FP8_E4M3.torch() is torch.float8_e4m3fn
    assert [d.itemsize for d in (DType.FP32, DType.FP16, DType.BF16)] == [4, 2, 2]


def test_fp8_case_is_forward_only_and_keeps_the_id_format():
    case = fp8_case()
    assert case.id == "triton/fwd/fp8_e4m3/b1-hq4-hkv2-sq40-sk56-d32/causal"
    for mode in ("bwd", "fwd_bwd", "decode"):
        with pytest.raises(ValueError, match=rf"mode {mode} does not apply to dtype fp8_e4m3.*fwd"):
            Case(impl="x", mode=mode, dtype="fp8_e4m3", causal=True, **SHAPE)
    # the other dtypes' ids are what they were
    bf16 = Case(impl="triton", mode="bwd", dtype="bf16", causal=False, **SHAPE)
    assert bf16.id == "triton/bwd/bf16/b1-hq4-hkv2-sq40-sk56-d32/full"
    assert Case.from_dict(case.to_dict()) == case


def test_byte_model_counts_one_byte_inputs_and_a_bf16_output():
    case = fp8_case()
    q = 4 * 40 * 32  # heads_q · tokens · head_dim
    kv = 2 * 56 * 32
    assert models.case_bytes(case) == q * 1 + q * 2 + 2 * kv * 1
    bf16 = Case(impl="triton", mode="fwd", dtype="bf16", causal=True, **SHAPE)
    assert models.case_bytes(bf16) == 2 * (2 * q + 2 * kv)
    assert models.case_flops(case) == models.case_flops(bf16)


def _suite(tmp_path: Path, modes: str, dtypes: str) -> Path:
    path = tmp_path / "f.toml"
    path.write_text(
        'name = "f"\ndescription = "fp8"\nimpls = ["triton"]\n'
        f"modes = {modes}\ndtypes = {dtypes}\nbatch = 1\nheads_q = 2\n"
        "seqlens = [64]\nhead_dims = [64]\ncausal = [false, true]\n"
    )
    return path


def test_suite_makes_fp8_forward_cases(tmp_path: Path):
    suite = load_suite(str(_suite(tmp_path, '["fwd"]', '["fp8_e4m3", "bf16"]')))
    assert sorted(c.dtype.value for c in suite.cases) == ["bf16", "bf16", "fp8_e4m3", "fp8_e4m3"]


def test_suite_refuses_fp8_with_a_backward_mode(tmp_path: Path):
    path = _suite(tmp_path, '["fwd", "bwd"]', '["fp8_e4m3"]')
    with pytest.raises(SuiteError) as info:
        load_suite(str(path))
    message = str(info.value)
    assert message.startswith(f"{path}: key 'dtypes': fp8_e4m3 is a forward-only dtype")
    assert "'modes' has bwd" in message and "valid modes with fp8_e4m3: fwd" in message


def test_cli_refuses_fp8_with_the_standard_suites_bwd_mode_and_names_the_flag():
    result = runner.invoke(cli.app, ["run", "-s", "standard", "--dtype", "fp8_e4m3", "-i", "naive"])
    assert result.exit_code == 2, result.output
    assert "fp8_e4m3 is a forward-only dtype" in result.output
    assert "valid modes with fp8_e4m3: fwd" in result.output and "(after --dtype)" in result.output


def test_cli_lists_fp8_among_the_dtypes():
    result = runner.invoke(cli.app, ["run", "--dtype", "fp9"])
    assert result.exit_code == 2
    assert "fp8_e4m3" in result.output


# ------------------------------------------------------------------------------------------
# Quantisation
# ------------------------------------------------------------------------------------------


def test_quantize_round_trip_within_one_e4m3_rounding():
    x = torch.randn(2, 3, 50, 16, dtype=torch.bfloat16) * 3
    x8, descale = quantize_fp8(x)
    assert x8.dtype == torch.float8_e4m3fn and descale.dtype == torch.float32
    assert descale.shape == (1,)
    amax = x.float().abs().max()
    assert torch.allclose(descale, amax / 448)
    assert x8.float().abs().max() == 448  # the largest |x| maps to e4m3's largest value
    back = dequantize_fp8(x8, descale)
    # e4m3 normals round to 3 mantissa bits (2^-4 relative); subnormals (below 2^-6 of the
    # scale) to an absolute step of 2^-9 · scale, half of it in rounding
    bound = torch.maximum(x.float().abs() * 2**-4, descale * 2**-10)
    assert ((back - x.float()).abs() <= bound + 1e-7).all()


def test_quantize_zero_nan_and_wrong_types():
    x8, descale = quantize_fp8(torch.zeros(4, 4))
    assert descale.item() == 1.0 and (x8.float() == 0).all()
    with pytest.raises(ValueError, match="NaN or Inf"):
        quantize_fp8(torch.tensor([1.0, float("nan")]))
    with pytest.raises(TypeError, match="x must be a 16- or 32-bit float tensor"):
        quantize_fp8(torch.zeros(3, dtype=torch.int32))
    with pytest.raises(TypeError, match=r"torch\.Tensor"):
        quantize_fp8([1.0])  # type: ignore[arg-type]


def test_v_layout_is_k_major_with_the_same_values():
    v = torch.randn(2, 3, 10, 16).to(torch.float8_e4m3fn)
    vt = fp8_v_layout(v)
    assert vt.shape == v.shape and vt.stride(-2) == 1 and vt.stride(-1) == 10
    assert torch.equal(vt.float(), v.float())
    assert fp8_v_layout(vt) is vt  # already K-major: no copy


def test_quantise_inputs_records_scales_and_keeps_a_sweeps_options():
    q, k, v = (torch.randn(1, 2, 20, 16, dtype=torch.bfloat16) * s for s in (1, 2, 3))
    fp8 = quantise_inputs(q, k, v)
    assert fp8.v.stride(-2) == 1
    scales = fp8.scales()
    for name, t in zip("qkv", (q, k, v), strict=True):
        assert scales[name] == pytest.approx(t.float().abs().max().item() / 448)
    qd, _, vd = fp8.dequantised()
    assert vd.is_contiguous() and qd.dtype == torch.float32
    options = with_descales({"config": {"block_m": 32}}, fp8)
    assert options["config"] == {"block_m": 32}
    assert set(options[OPTION]) == {"q_descale", "k_descale", "v_descale"}


# ------------------------------------------------------------------------------------------
# The accuracy rule
# ------------------------------------------------------------------------------------------


def _dequantised(case: Case, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    shape_q = (case.batch, case.heads_q, case.seqlen_q, case.head_dim)
    shape_k = (case.batch, case.heads_kv, case.seqlen_k, case.head_dim)
    tensors = [torch.randn(s, generator=g).to(torch.bfloat16) for s in (shape_q, shape_k, shape_k)]
    return quantise_inputs(*tensors).dequantised()


def _emulated_kernel(q, k, v, causal: bool) -> torch.Tensor:
    """The fp8 kernel's arithmetic in torch: fp32 scores, P = exp2(s − m + 8) rounded to
    e4m3, fp32 PV and row sums of the unrounded P, a bf16 output."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = (q @ k.transpose(-1, -2)) * (math.log2(math.e) / math.sqrt(q.shape[-1]))
    if causal:
        sq, sk = q.shape[2], k.shape[2]
        s = s.masked_fill(~torch.ones(sq, sk, dtype=torch.bool).tril(sk - sq), float("-inf"))
    p = torch.exp2(s - s.amax(-1, keepdim=True) + 8)
    p8 = p.to(torch.float8_e4m3fn).float()
    return ((p8 @ v) / p.sum(-1, keepdim=True)).to(torch.bfloat16)


@pytest.mark.parametrize("causal", [False, True])
def test_rule_accepts_the_kernels_arithmetic(causal):
    case = fp8_case(causal=causal, seqlen_q=56)  # causal with Sq = Sk: no empty rows
    q, k, v = _dequantised(case)
    report = check_fp8_accuracy(case, q, k, v, _emulated_kernel(q, k, v, causal))
    assert report["passed"], report
    assert report["tensors"]["o"]["max_abs_err"] > 0  # P's rounding shows


def test_rule_tolerance_is_twice_the_bf16_baseline_plus_the_floors():
    case = fp8_case()
    q, k, v = _dequantised(case)
    group = case.heads_q // case.heads_kv
    sl = [t[:1, :group] if i == 0 else t[:1, :1] for i, t in enumerate((q, k, v))]
    ref = reference_attention(*(t.double() for t in sl), causal=True).o
    base = reference_attention(*(t.bfloat16() for t in sl), causal=True).o
    report = check_fp8_accuracy(case, q, k, v, ref.repeat(1, 2, 1, 1)[:, : case.heads_q].bfloat16())
    tol = report["tensors"]["o"]["tolerance"]
    two_base = 2 * (base.double() - ref).abs().max().item()
    e4m3 = E4M3_STEP * ref.abs().max().item()
    assert tol > two_base + e4m3  # + the bf16 floor of the output
    r = ref.bfloat16()
    bf16_floor = 2 * ((r + 0.3 - 0.3) - r).abs().max().item()
    assert tol == pytest.approx(two_base + e4m3 + bf16_floor, rel=1e-3)


@pytest.mark.parametrize(
    "wrong",
    ["scaled 1.25", "non-causal", "v without its descale", "one row zeroed", "nan"],
)
def test_rule_fails_a_wrong_output(wrong):
    case = fp8_case(causal=True, seqlen_q=56)
    q, k, v = _dequantised(case, seed=1)
    good = _emulated_kernel(q, k, v, True)
    bad = {
        "scaled 1.25": lambda: good * 1.25,
        "non-causal": lambda: _emulated_kernel(q, k, v, False),
        "v without its descale": lambda: _emulated_kernel(q, k, v * 448 / v.abs().max(), True),
        "one row zeroed": lambda: good.index_fill(2, torch.tensor([30]), 0.0),
        "nan": lambda: good.index_fill(3, torch.tensor([0]), float("nan")),
    }[wrong]()
    assert check_fp8_accuracy(case, q, k, v, good)["passed"]
    assert not check_fp8_accuracy(case, q, k, v, bad)["passed"]


def test_rule_refuses_a_backward_case_and_a_wrong_shape():
    case = fp8_case()
    q, k, v = _dequantised(case)
    with pytest.raises(ValueError, match="differs from q"):
        check_fp8_accuracy(case, q, k, v, torch.zeros(1, 1, 1, 1))
    bf16 = Case(impl="x", mode="bwd", dtype="bf16", causal=True, **SHAPE)
    with pytest.raises(ValueError, match="forward only"):
        check_fp8_accuracy(bf16, q, k, v, q)


# ------------------------------------------------------------------------------------------
# Implementations: opt-in, unsupported records, run_case end to end (CPU)
# ------------------------------------------------------------------------------------------


def test_every_builtin_but_triton_records_no_fp8_forward():
    impls = registry.load()
    cuda = torch.device("cuda")  # the checks read the device's type only
    case = fp8_case()
    for name, impl in impls.items():
        reason = impl.unsupported_reason(case, cuda)
        if name in ("triton", "triton-onepass", "triton-deterministic"):
            assert reason is None, (name, reason)
        else:
            assert reason == f"no fp8_e4m3 forward in {name}", (name, reason)


def test_registration_defaults_leave_fp8_out():
    impl = registry.Impl(name="p", builder=lambda *a: None, description="")
    assert DType.FP8_E4M3 not in impl.dtypes
    assert impl.unsupported_reason(fp8_case("p"), torch.device("cpu")) == "no fp8_e4m3 forward in p"


def _torch_fp8_impl(name: str, *, forget_v_descale: bool = False) -> registry.Impl:
    """An fp8 implementation in torch: dequantises with the descales from `options` and
    runs the kernel's arithmetic (_emulated_kernel)."""

    def build(case, q, k, v, options=None):
        d = options[OPTION]
        vd = torch.ones_like(d["v_descale"]) if forget_v_descale else d["v_descale"]

        def fn(q, k, v):
            deq = [
                dequantize_fp8(x, s) for x, s in ((q, d["q_descale"]), (k, d["k_descale"]), (v, vd))
            ]
            return _emulated_kernel(*deq, case.causal)

        return registry.Prepared(fn=fn, backend=f"{name}: torch emulation")

    return registry.Impl(name=name, builder=build, description="test", dtypes=frozenset(DType))


FAST_TIMING = ExecOptions(timing=TimingConfig(max_time_s=0.05, min_time_s=0.0, min_samples=2))


def test_run_case_quantises_records_scales_and_checks_accuracy(monkeypatch):
    monkeypatch.setitem(registry._REGISTRY, "fp8-torch", _torch_fp8_impl("fp8-torch"))
    case = fp8_case("fp8-torch")
    record = run_case(case, torch.device("cpu"), FAST_TIMING)
    assert record.status.value == "ok", record.error
    assert record.backend == "fp8-torch: torch emulation"
    assert record.accuracy["passed"] and "dequantised" in record.accuracy["slice"]
    assert set(record.fp8_scales) == {"q", "k", "v"}
    assert all(0 < s < 0.05 for s in record.fp8_scales.values())  # randn amax / 448
    assert record.bytes_model == models.case_bytes(case)
    again = CaseRecord.from_json(record.to_json())
    assert again.fp8_scales == record.fp8_scales


def test_run_case_reports_a_mismatch_for_a_wrong_fp8_implementation(monkeypatch):
    impl = _torch_fp8_impl("fp8-wrong", forget_v_descale=True)
    monkeypatch.setitem(registry._REGISTRY, "fp8-wrong", impl)
    record = run_case(fp8_case("fp8-wrong"), torch.device("cpu"), FAST_TIMING)
    assert record.status.value == "mismatch"
    assert record.error.startswith("accuracy check failed: o: max_abs_err")


def test_run_case_records_naive_and_triton_as_unsupported_on_cpu():
    registry.load()
    naive = run_case(fp8_case("naive"), torch.device("cpu"), FAST_TIMING)
    assert (naive.status.value, naive.error) == ("unsupported", "no fp8_e4m3 forward in naive")
    ours = run_case(fp8_case("triton"), torch.device("cpu"), FAST_TIMING)
    assert ours.status.value == "unsupported"
    assert "CUDA GPUs only" in ours.error


# ------------------------------------------------------------------------------------------
# The record
# ------------------------------------------------------------------------------------------


def _record_json(**extra: object) -> dict:
    d = CaseRecord.for_case(fp8_case(), "cpu", "unsupported", error="x").to_json()
    d.update(extra)
    return d


def test_record_without_fp8_scales_has_no_key():
    d = CaseRecord.for_case(Case(impl="x", mode="fwd", dtype="bf16", causal=False, **SHAPE),
                            "cpu", "unsupported").to_json()  # fmt: skip
    assert "fp8_scales" not in d
    assert CaseRecord.from_json(d).fp8_scales is None


@pytest.mark.parametrize(
    "bad, message",
    [
        ([1, 2], "fp8_scales must be an object or null"),
        ({"q": 1.0, "k": 1.0}, "fp8_scales lacks 'v'"),
        ({"q": 1.0, "k": -1.0, "v": 1.0}, "k must be a finite number ≥ 0"),
    ],
)
def test_record_checks_fp8_scales(bad, message):
    with pytest.raises(ResultsError, match=message):
        CaseRecord.from_json(_record_json(fp8_scales=bad))


def test_results_csv_has_scale_columns_only_with_fp8_cases():
    from fa_bench.results.files import to_frame
    from fa_bench.results.record import ResultsDoc

    bf16 = CaseRecord.for_case(Case(impl="x", mode="fwd", dtype="bf16", causal=False, **SHAPE),
                               "cpu", "unsupported")  # fmt: skip
    fp8 = CaseRecord.for_case(fp8_case(), "cpu", "ok", fp8_scales={"q": 0.5, "k": 0.25, "v": 2.0})
    dense = to_frame(ResultsDoc(run={}, env={}, cases=[bf16]))
    assert not [c for c in dense.columns if c.startswith("fp8")]
    mixed = to_frame(ResultsDoc(run={}, env={}, cases=[bf16, fp8]))
    assert mixed["fp8_scales.k"].tolist()[1] == 0.25


def test_case_inputs_quantise_fp8_cases_only():
    from fa_bench.run.fp8_inputs import case_inputs

    q, k, v = (torch.randn(1, 2, 16, 32, dtype=torch.bfloat16) for _ in range(3))
    bf16 = Case(impl="triton", mode="fwd", dtype="bf16", causal=False, batch=1, heads_q=2,
                heads_kv=2, seqlen_q=16, seqlen_k=16, head_dim=32)  # fmt: skip
    assert case_inputs(bf16, q, k, v, None) == (q, k, v, None, None)
    fp8 = Case(**{**bf16.to_dict(), "dtype": "fp8_e4m3"})
    q8, _, v8, options, inputs = case_inputs(fp8, q, k, v, {"config": {"block_n": 16}})
    assert q8.dtype == torch.float8_e4m3fn and v8.stride(-2) == 1
    assert options["config"] == {"block_n": 16} and inputs is not None
    assert options[OPTION]["v_descale"] is inputs.v_descale


def test_sweep_precompile_builds_fp8_points_from_quantised_inputs():
    # On a CPU the build stops at the adapter's device check, past the descales it needs.
    from fa_bench.sweep.precompile import _build_group

    case = Case(impl="triton", mode="fwd", dtype="fp8_e4m3", causal=False, batch=1, heads_q=2,
                heads_kv=2, seqlen_q=16, seqlen_k=16, head_dim=32)  # fmt: skip
    [(point, _, error)] = _build_group("cpu", [("p", case.to_dict(), {"block_m": 16})])
    assert point == "p" and "CUDA GPUs only" in error, error
