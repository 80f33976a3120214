"""The peers (issue 17 items 1, 2, 3, 5): FlashAttention-4, flash-attn, xFormers.

On a CPU machine without them: listed as unavailable with the reason, a case for them is a
recorded `unsupported`. The adapters' own logic (layout views, GQA, causal, backward, the
output's layout) runs against fake packages (tests/peer_fakes.py: honest about what they
are) through the real accuracy check, in-process and, once, through `fa-bench run`. The
`gpu` tests run the real packages where installed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import peer_fakes
import pytest
import torch
from conftest import FAST, HERE
from typer.testing import CliRunner

from fa_bench import registry
from fa_bench.case import Case, DType, Mode, Status
from fa_bench.cli import app
from fa_bench.env import PEER_PACKAGES, collect_env, package_versions
from fa_bench.kernels import fa4_impl, flash_attn_impl, peers, xformers_impl
from fa_bench.registry import Unsupported
from fa_bench.run.accuracy import check_accuracy
from fa_bench.run.execute import ExecOptions, make_inputs, run_case
from fa_bench.run.timing import TimingConfig

registry.load()
ROOT = HERE.parent
PEERS = {"fa4": fa4_impl, "flash-attn": flash_attn_impl, "xformers": xformers_impl}
SPECS = {"fa4": fa4_impl.FA4, "flash-attn": flash_attn_impl.FA2, "xformers": xformers_impl.XFORMERS}
QUICK = ExecOptions(timing=TimingConfig(min_samples=2, max_time_s=0.05, min_time_s=0.0,
                                        warmup_ms=0.0, flush_l2=False))  # fmt: skip
FAKE_NAMES = ("flash_attn", "flash_attn.cute", "flash_attn.flash_attn_interface", "xformers",
              "xformers.ops", "xformers.ops.fmha", "xformers.ops.fmha.attn_bias")  # fmt: skip
CPU = torch.device("cpu")


def _installed(dist: str) -> bool:
    return package_versions((dist,))[dist] is not None


needs_absent = pytest.mark.skipif(
    any(_installed(p.dist) for p in SPECS.values()) or torch.cuda.is_available(),
    reason="a peer package or a GPU is present: the CPU machine's view does not apply",
)


@pytest.fixture
def no_fakes() -> Iterator[None]:
    """sys.modules without any flash_attn/xformers entry, as it was afterwards (what a
    test imported or faked there is gone, what was there is back)."""
    saved = {name: sys.modules.pop(name) for name in FAKE_NAMES if name in sys.modules}
    yield
    for name in FAKE_NAMES:
        sys.modules.pop(name, None)
    sys.modules.update(saved)


@pytest.fixture
def fakes(monkeypatch: pytest.MonkeyPatch, no_fakes: None) -> None:
    for name, module in peer_fakes.fake_modules().items():
        monkeypatch.setitem(sys.modules, name, module)


def _gpu(monkeypatch: pytest.MonkeyPatch, capability: tuple[int, int]) -> None:
    """This process sees a CUDA GPU of `capability` (for the availability checks only)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)


# ---------------------------------------------------------------------------------------
# This CPU machine: unavailable, with the reason, never an error.


@needs_absent
def test_list_impls_shows_peers_unavailable_with_the_reason(no_fakes: None) -> None:
    # The JSON rows are the table's, whole: a table row wraps where another test's plugin
    # or a longer description widens a column (the table's layout has its own tests).
    out = CliRunner().invoke(app, ["list", "impls", "--json"])
    assert out.exit_code == 0, out.output
    rows = {row["name"]: row for row in json.loads(out.stdout)}
    for name, spec in SPECS.items():
        row = rows[name]
        assert row["available"] is False, row
        reason = row["reason"]
        assert f"{spec.dist} is not installed" in reason and f"fa-bench[{spec.extra}]" in reason
        assert "no CUDA GPU" in reason


@needs_absent
def test_env_shows_peers_unavailable_and_their_versions(no_fakes: None) -> None:
    out = CliRunner().invoke(app, ["env"], env={"COLUMNS": "400"})
    assert out.exit_code == 0, out.output
    assert "Traceback" not in out.output
    lines = out.output.splitlines()
    for name, spec in SPECS.items():
        row = next(line for line in lines if line.startswith(f"│ {name} "))
        assert "no:" in row and f"{spec.dist} is not installed" in row, row
    for dist in PEER_PACKAGES:
        assert any(dist in line and "not installed" in line for line in lines), dist


@needs_absent
def test_list_and_env_json_carry_the_reasons_and_versions(no_fakes: None) -> None:
    listed = CliRunner().invoke(app, ["list", "impls", "--json"])
    assert listed.exit_code == 0, listed.output
    rows = {r["name"]: r for r in json.loads(listed.stdout)}
    shown = CliRunner().invoke(app, ["env", "--json"])
    assert shown.exit_code == 0, shown.output
    doc = json.loads(shown.stdout)
    availability = {r["name"]: r for r in doc["impls"]}
    for name, spec in SPECS.items():
        for row in (rows[name], availability[name]):
            assert row["available"] is False and f"fa-bench[{spec.extra}]" in row["reason"]
    assert doc["env"]["packages"] == dict.fromkeys(PEER_PACKAGES)


def test_env_records_each_peer_package_version() -> None:
    env = collect_env()
    assert set(env["packages"]) == set(PEER_PACKAGES)
    assert all(v is None or isinstance(v, str) for v in env["packages"].values())
    # An installed distribution reads back its version (typer stands in for a peer).
    import typer

    assert package_versions(("typer",)) == {"typer": typer.__version__}
    json.dumps(env)  # results.json takes it as it is


@needs_absent
@pytest.mark.parametrize("name", list(PEERS))
def test_a_case_on_cpu_is_a_recorded_unsupported(name: str, no_fakes: None) -> None:
    record = run_case(Case(name, "fwd", "bf16", 1, 2, 2, 16, 16, 64, True), CPU, QUICK)
    assert record.status is Status.UNSUPPORTED
    assert record.error == f"{name} runs on cuda, not cpu"


@pytest.mark.parametrize("name", list(PEERS))
def test_the_builder_without_the_package_is_unsupported_naming_the_extra(
    name: str, no_fakes: None
) -> None:
    """A GPU machine without the package: the builder refuses with the reason (this is
    what a run records), rather than an ImportError per case."""
    if _installed(SPECS[name].dist):
        pytest.skip(f"{SPECS[name].dist} is installed")
    case = Case(name, "fwd", "bf16", 1, 2, 2, 16, 16, 64, False)
    q = torch.zeros(1, 2, 16, 64)
    with pytest.raises(Unsupported, match=rf"fa-bench\[{SPECS[name].extra}\]"):
        PEERS[name].build(case, q, q, q)


# ---------------------------------------------------------------------------------------
# Availability: which package, which GPU, an import that fails.


@pytest.mark.parametrize("name", list(PEERS))
def test_available_with_the_package_and_a_new_enough_gpu(
    name: str, fakes: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    _gpu(monkeypatch, (9, 0))
    assert registry.get(name).unavailable_reason() is None


def test_fa4_on_an_older_gpu_says_which(fakes: None, monkeypatch: pytest.MonkeyPatch) -> None:
    _gpu(monkeypatch, (8, 0))
    why = registry.get("fa4").unavailable_reason()
    assert why == "FlashAttention-4 needs compute capability >= 9.0 (this GPU is 8.0)"
    assert registry.get("flash-attn").unavailable_reason() is None  # FA2 runs on sm80
    _gpu(monkeypatch, (7, 5))
    assert "needs compute capability >= 8.0 (this GPU is 7.5)" in str(
        registry.get("flash-attn").unavailable_reason()
    )


def test_the_builder_on_an_older_gpu_is_unsupported(
    fakes: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    _gpu(monkeypatch, (8, 6))
    q = torch.zeros(1, 2, 16, 64)
    monkeypatch.setattr(torch.Tensor, "device", property(lambda t: torch.device("cuda", 0)))
    with pytest.raises(Unsupported, match=r"9\.0 \(this GPU is 8\.6\)"):
        fa4_impl.build(Case("fa4", "fwd", "bf16", 1, 2, 2, 16, 16, 64, False), q, q, q)


def _package(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_fa2_and_fa4_share_flash_attn_but_are_told_apart(
    tmp_path: Path, no_fakes: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """flash-attn-4 installs only flash_attn/cute (flash_attn a namespace package); the
    flash-attn package has flash_attn/__init__.py and flash_attn_interface.py."""
    fa4_only = _package(tmp_path / "a", {"flash_attn/cute/__init__.py": ""})
    fa2_only = _package(tmp_path / "b", {"flash_attn/__init__.py": "",
                                         "flash_attn/flash_attn_interface.py": ""})  # fmt: skip
    monkeypatch.syspath_prepend(str(fa4_only))
    assert peers.missing_reason(fa4_impl.FA4) is None
    if not _installed("flash-attn"):
        assert "flash-attn is not installed" in str(peers.missing_reason(flash_attn_impl.FA2))
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(fa4_only)])
    monkeypatch.syspath_prepend(str(fa2_only))
    assert peers.missing_reason(flash_attn_impl.FA2) is None
    if not _installed("flash-attn-4"):
        assert "flash-attn-4 is not installed" in str(peers.missing_reason(fa4_impl.FA4))
    assert "flash_attn" not in sys.modules  # found without importing anything


def test_an_import_that_fails_is_the_reason_not_an_error(
    tmp_path: Path, no_fakes: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    fails = "raise ImportError('libcuda.so.1: cannot open shared object')"
    broken = _package(tmp_path, {"flash_attn/cute/__init__.py": fails})
    monkeypatch.syspath_prepend(str(broken))
    _gpu(monkeypatch, (9, 0))
    why = registry.get("fa4").unavailable_reason()
    assert why == (
        "flash_attn.cute is installed but failed to import: ImportError: "
        "libcuda.so.1: cannot open shared object"
    )


# ---------------------------------------------------------------------------------------
# The adapters against the fakes, through execute's accuracy check: layout, GQA, causal
# (Sq != Sk both ways), forward and backward.

SHAPES = [  # (batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim)
    (2, 4, 4, 17, 17, 16),
    (1, 8, 2, 13, 29, 16),  # GQA 4:1, Sq < Sk
    (1, 4, 1, 29, 13, 8),  # MQA, Sq > Sk: the first rows see no key under causal
]


def _fake_impl(name: str) -> registry.Impl:
    """The registered peer with the CPU allowed and fp32 (the fakes compute in it)."""
    return replace(registry.get(name), name=f"{name}-fake", devices=frozenset({"cpu"}),
                   dtypes=frozenset(DType))  # fmt: skip


def _checked(name: str, case: Case) -> dict:
    """The adapter's output and gradients (w.r.t. the runner's own tensors, as
    fa_bench.run.execute computes them) against the float64 reference."""
    impl = _fake_impl(name)
    q, k, v, do = make_inputs(case, CPU)
    fn = impl.prepare(case, q, k, v).fn
    qg, kg, vg = (t.detach().requires_grad_(True) for t in (q, k, v))
    out = fn(qg, kg, vg)
    assert out.shape == q.shape and out.is_contiguous() is False  # a view of (B, S, H, D)
    out.backward(do)
    return check_accuracy(case, q, k, v, out.detach(), do=do, dq=qg.grad, dk=kg.grad, dv=vg.grad)


@pytest.mark.parametrize("name", list(PEERS))
def test_adapter_output_and_grads_match_the_reference(name: str, fakes: None) -> None:
    for shape in SHAPES:
        for causal in (False, True):
            case = Case(f"{name}-fake", "bwd", "fp32", *shape, causal)
            accuracy = _checked(name, case)
            assert accuracy["passed"], (case.id, accuracy)
            assert set(accuracy["tensors"]) == {"o", "dq", "dk", "dv"}


def test_a_case_through_execute_is_ok_with_its_backend(
    fakes: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The backend each adapter records; once through execute.run_case (timing,
    accuracy, the record) on xFormers' GQA path."""
    case = Case("fa4-fake", "fwd", "fp32", 1, 4, 2, 8, 12, 16, True)
    q, k, v, _ = make_inputs(case, CPU)
    for name, backend in (("fa4", "flash_attn.cute.flash_attn_func"),
                          ("flash-attn", "flash_attn.flash_attn_func")):  # fmt: skip
        assert _fake_impl(name).prepare(case, q, k, v).backend == backend
    monkeypatch.setitem(registry._REGISTRY, "xformers-fake", _fake_impl("xformers"))
    record = run_case(replace(case, impl="xformers-fake", mode=Mode.BWD), CPU, QUICK)
    assert record.status is Status.OK, (record.error, record.traceback)
    assert record.backend == "xformers.ops.memory_efficient_attention:fake-cutlassF"
    assert record.accuracy["passed"]


def test_the_accuracy_check_catches_a_wrong_layout(
    fakes: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The test above can fail: hand FA4 our (B, H, S, D) tensors as they are, and the
    fake reads heads as positions (as many of each, so the shapes agree and only the
    values tell); the record is a mismatch."""
    monkeypatch.setitem(registry._REGISTRY, "fa4-fake", _fake_impl("fa4"))
    monkeypatch.setattr(peers, "bshd", lambda t: t)
    record = run_case(Case("fa4-fake", "fwd", "fp32", 1, 8, 8, 8, 8, 16, True), CPU, QUICK)
    assert record.status is Status.MISMATCH, record.error


@pytest.mark.parametrize(
    ("capability", "head_dim", "reason"),
    [
        ((9, 0), 12, "a multiple of 8"),
        ((9, 0), 264, "sm90 takes head_dim 8..256"),
        ((9, 0), 256, None),
        ((10, 0), 192, "sm100 takes head_dim 8..128 or 256"),
        ((10, 0), 256, None),
        ((10, 0), 128, None),
    ],
)
def test_fa4_head_dims(
    capability: tuple, head_dim: int, reason: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    _gpu(monkeypatch, capability)
    case = Case("fa4", "fwd", "bf16", 1, 2, 2, 16, 16, head_dim, False)
    why = fa4_impl._check(case, torch.device("cuda", 0))
    assert (why is None) if reason is None else (reason in str(why))


def test_a_kernel_assertion_is_unsupported_with_its_words(
    fakes: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """FA4 checks its inputs with `assert`: its refusal is the case's reason."""

    def refuses(*args: object, **kwargs: object) -> None:
        raise AssertionError("num_head must be divisible by num_head_kv")

    monkeypatch.setattr(sys.modules["flash_attn.cute"], "flash_attn_func", refuses)
    monkeypatch.setitem(registry._REGISTRY, "fa4-fake", _fake_impl("fa4"))
    record = run_case(Case("fa4-fake", "fwd", "fp32", 1, 4, 4, 8, 8, 16, True), CPU, QUICK)
    assert record.status is Status.UNSUPPORTED
    assert record.error == "the kernel refused this case: num_head must be divisible by num_head_kv"


@pytest.mark.slow
def test_fake_peers_through_fa_bench_run(tmp_path: Path) -> None:
    """End to end: the worker imports the fakes as a --plugin; every case ok with its
    accuracy checked, grads included (Sq != Sk both ways, GQA, causal)."""
    suite = tmp_path / "peers.toml"
    suite.write_text(
        'name = "peers"\ndescription = "fake peers"\n'
        'impls = ["fa4-fake", "flash-attn-fake", "xformers-fake"]\nmodes = ["fwd", "bwd"]\n'
        'dtypes = "fp32"\nbatch = 1\nheads_q = 4\nheads_kv = [4, 2]\nhead_dims = 16\n'
        "seqlens_q = [9, 24]\nseqlens_k = [24]\ncausal = [false, true]\n"
    )
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "fa_bench.cli", "run", "--suite", str(suite), "--out", str(out),
           "--plugin", str(HERE / "plugins" / "fake_peers.py"), *FAST]  # fmt: skip
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    cases = json.loads((out / "results.json").read_text())["cases"]
    assert len(cases) == 3 * 2 * 2 * 2 * 2
    bad = [(c["id"], c["status"], c.get("error")) for c in cases if c["status"] != "ok"]
    assert not bad
    assert all(c["accuracy"]["passed"] for c in cases)
    # The report and compare take the new implementations like any other.
    page = (out / "report.html").read_text()
    assert all(f"{name}-fake" in page for name in PEERS)
    compared = CliRunner().invoke(app, ["compare", str(out), str(out)], env={"COLUMNS": "200"})
    assert compared.exit_code == 0, compared.output
    assert all(f"{name}-fake" in compared.output for name in PEERS)


# ---------------------------------------------------------------------------------------
# The extras: one per peer, the base install and CI unchanged.


def test_extras_install_each_peer_and_ci_installs_none() -> None:
    from packaging.requirements import Requirement  # pytest's own dependency

    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10 reads pyproject with the tomli backport
        tomllib = pytest.importorskip("tomli")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    for spec in SPECS.values():
        names = {Requirement(r).name for r in extras[spec.extra]}
        assert spec.dist in names, (spec.extra, names)
    fa4 = next(Requirement(r) for r in extras["fa4"] if Requirement(r).name == "flash-attn-4")
    assert fa4.specifier.contains("4.0.0b36")  # a pre-release: the pin must admit it
    assert {"fa4", "flash-attn", "xformers"} <= set(Requirement(extras["peers"][0]).extras)
    base = {Requirement(r).name for r in project["dependencies"]}
    assert not base & {s.dist for s in SPECS.values()} and "nvidia-cutlass-dsl" not in base
    ci = (ROOT / ".ci" / "run").read_text()
    assert '".[test]"' in ci and "fa4" not in ci and "xformers" not in ci


# ---------------------------------------------------------------------------------------
# The real packages, where installed (run on the GPU machine).

GPU_SHAPES = [(2, 8, 8, 512, 512, 64), (1, 8, 2, 384, 1024, 128), (1, 4, 4, 1024, 384, 128)]


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(PEERS))
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_real_peer_on_gpu(name: str, dtype: str, no_fakes: None) -> None:
    why = registry.get(name).unavailable_reason()
    if why is not None:
        pytest.skip(f"{name}: {why}")
    device = torch.device("cuda", 0)
    for shape in GPU_SHAPES:
        for mode in ("fwd", "bwd"):
            for causal in (False, True):
                case = Case(name, mode, dtype, *shape, causal)
                record = run_case(case, device, QUICK)
                assert record.status is Status.OK, (case.id, record.error, record.accuracy)


# ---------------------------------------------------------------------------------------
# The versions in the report's header.


def test_report_header_names_the_installed_peer_versions() -> None:
    import re

    from report_fixture import clone, two_gpu_docs

    from fa_bench.reports.build import render

    doc = clone(two_gpu_docs()[0])
    doc.env["packages"] = {"flash-attn-4": "4.0.0b36", "nvidia-cutlass-dsl": "4.8.1",
                           "flash-attn": None, "xformers": None}  # fmt: skip
    page = render([doc], plotlyjs="cdn")
    header = page[page.index("<header>") : page.index("</header>")]
    where = re.search(r"<dt>where</dt><dd>(.*?)</dd>", header).group(1)
    assert "flash-attn-4 4.0.0b36" in where and "nvidia-cutlass-dsl 4.8.1" in where
    assert "xformers" not in where  # not installed: not in the header
    assert "<dt>flash-attn-4</dt><dd>4.0.0b36</dd>" in page  # the environment section
    doc.env["packages"] = ["not", "a", "mapping"]  # a hand-edited file: no versions, no error
    assert "<dt>flash-attn-4</dt>" not in render([doc], plotlyjs="cdn")


def test_what_an_import_prints_stays_off_stdout(
    tmp_path: Path, no_fakes: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """`list impls --json` prints one JSON document: a chatty package import must not
    land in it."""
    chatty = _package(tmp_path, {"flash_attn/cute/__init__.py":
                                 "print('compiling...')\nflash_attn_func = print\n"})  # fmt: skip
    monkeypatch.syspath_prepend(str(chatty))
    _gpu(monkeypatch, (9, 0))
    assert registry.get("fa4").unavailable_reason() is None
    out, err = capsys.readouterr()
    assert out == "" and "compiling..." in err


def test_xformers_without_a_kernel_for_the_case_is_unsupported(
    fakes: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_operator(*args: object, **kwargs: object) -> None:
        raise NotImplementedError(
            "No operator found for `memory_efficient_attention_forward` with inputs:\n"
            "     query       : shape=(1, 8, 4, 16) (torch.float32)"
        )

    monkeypatch.setattr(sys.modules["xformers.ops"], "memory_efficient_attention", no_operator)
    monkeypatch.setitem(registry._REGISTRY, "xformers-fake", _fake_impl("xformers"))
    record = run_case(Case("xformers-fake", "fwd", "fp32", 1, 4, 4, 8, 8, 16, True), CPU, QUICK)
    assert record.status is Status.UNSUPPORTED
    assert record.error == (
        "the kernel refused this case: No operator found for "
        "`memory_efficient_attention_forward` with inputs:"
    )


def test_the_gpu_check_tool_compares_fa4_with_the_anchors() -> None:
    """tools/gpu/fa4_vs_anchors.py: the table for docs/results-h200.md and the 5% check."""
    import importlib.util

    path = ROOT / "tools" / "gpu" / "fa4_vs_anchors.py"
    spec = importlib.util.spec_from_file_location("fa4_vs_anchors", path)
    assert spec is not None and spec.loader is not None
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)

    def case(impl: str, mode: str, tflops: float | None, status: str = "ok") -> dict:
        return {"id": f"{impl}/{mode}", "impl": impl, "mode": mode, "dtype": "bf16",
                "head_dim": 128, "seqlen_q": 16384, "causal": False, "status": status,
                "tflops": tflops, "error": None if status == "ok" else "boom"}  # fmt: skip

    lines, problems = tool.table([case("fa4", "fwd", 664 * 1.02), case("fa4", "bwd", 606 * 0.9),
                                  case("sdpa-cudnn", "fwd", 612)])  # fmt: skip
    row = next(line for line in lines if line.startswith("| 128 | 16k | no |"))
    assert "| 677 / 545 | 664 / 606 | 1.020 / 0.900 | 612 / – |" in row
    assert problems == ["fa4 bwd D=128 N=16384 causal=False: 0.900"]
    _, problems = tool.table([case("fa4", "fwd", None, status="mismatch")])
    assert problems == ["fa4/fwd: mismatch: boom"]
