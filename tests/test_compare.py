"""`fa-bench compare`: the decision rule on results with known samples, the exit codes,
the outputs, and real CPU runs compared end to end."""

from __future__ import annotations

import itertools
import json
import math
import random
from pathlib import Path

import pytest
import torch
from slow_tuning import write_slow_cache
from typer.testing import CliRunner

from fa_bench.case import Case
from fa_bench.cli import app
from fa_bench.compare.core import (
    Comparison,
    Metric,
    Thresholds,
    Verdict,
    parse_threshold,
)
from fa_bench.compare.core import compare_docs as compare_results
from fa_bench.compare.stats import mann_whitney_p
from fa_bench.reports.embed import embed_json
from fa_bench.results.record import ResultsDoc
from fa_bench.run.timing import summarize

runner = CliRunner()
SHAPES = [(s, d) for s in (128, 512, 1024, 2048, 4096) for d in (64, 128)]


def invoke(*args: object):
    return runner.invoke(app, ["compare", *map(str, args)])


def make_case(
    impl: str,
    seqlen: int,
    head_dim: int,
    samples: list[float] | None,
    status: str = "ok",
    error: str | None = None,
    peak: int | None = None,
) -> dict:
    case = Case(impl, "fwd", "bf16", 2, 16, 16, seqlen, seqlen, head_dim, False)
    flops = 4 * 2 * 16 * seqlen * seqlen * head_dim
    lat = summarize(samples) if samples else None
    return {"id": case.id, **case.to_dict(), "device": "cuda:0", "status": status,
            "error": error, "backend": None, "derived": None, "latency_ms": lat, "timing": None,
            "flops": flops, "bytes_model": 4 * 2 * 16 * seqlen * head_dim * 2,
            "tflops": flops / lat["median"] / 1e9 if lat else None, "gbps_model": None,
            "peak_mem_bytes": peak, "accuracy": None, "telemetry": None}  # fmt: skip


def compare_docs(base: list[dict], cur: list[dict], **kw: object) -> Comparison:
    """compare_docs on documents written as JSON, the way the tests build them."""
    return compare_results(
        [ResultsDoc.from_json(d) for d in base], [ResultsDoc.from_json(d) for d in cur], **kw
    )


def draw(rng: random.Random, center: float, noise: float, n: int = 60) -> list[float]:
    """n samples around `center` ms with a relative standard deviation `noise`."""
    return [max(1e-6, rng.gauss(center, center * noise)) for _ in range(n)]


def make_doc(cases: list[dict], gpu: str | None = "NVIDIA H200", **env: object) -> dict:
    base_env = {"gpu_name": gpu, "driver": "580.159.04", "torch": "2.11.0", "triton": "3.6.0",
                "cuda": "13.0", "cudnn": 91900, "python": "3.11", "fa_bench": "0.1.0"}  # fmt: skip
    return {"schema": "fa-bench/1", "run": {"id": "test", "git_sha": None},
            "env": base_env | env, "cases": cases}  # fmt: skip


def run_doc(seed: int, noise: float, scale: float = 1.0, **kw: object) -> dict:
    """A run of 20 cases (10 shapes x 2 impls) with latencies scaled by `scale`."""
    rng = random.Random(seed)
    cases = [make_case(impl, s, d, draw(rng, scale * s * d / 1e5, noise))
             for s, d in SHAPES for impl in ("triton", "sdpa-cudnn")]  # fmt: skip
    return make_doc(cases, **kw)


def save(tmp_path: Path, name: str, doc: dict) -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return path


def verdicts(cmp) -> dict[str, int]:
    return {v.value: cmp.count(v) for v in Verdict if cmp.count(v)}


# --- statistics -------------------------------------------------------------------------


def test_mann_whitney_matches_hand_computed_values() -> None:
    # Fully separated, n1 = n2 = 10: U = 0, mu = 50, sigma = sqrt(100 * 21 / 12) = 13.229,
    # z = (50 - 0.5) / 13.229 = 3.742, p = erfc(3.742 / sqrt 2) = 1.827e-4.
    assert mann_whitney_p(list(range(10)), list(range(10, 20))) == pytest.approx(1.827e-4, rel=1e-3)
    # With ties: [1..5] vs [3..7] -> U = 4.5, tie term 3 * (2^3 - 2) = 18,
    # var = 25 / 12 * (11 - 18 / 90) = 22.5, z = (8 - 0.5) / sqrt(22.5), p = 0.1138.
    assert mann_whitney_p([1, 2, 3, 4, 5], [3, 4, 5, 6, 7]) == pytest.approx(0.1138, rel=1e-3)
    assert mann_whitney_p([1.0] * 5, [1.0] * 7) == 1.0
    assert mann_whitney_p([1, 2, 3], [3, 2, 1]) == pytest.approx(1.0)


# --- the decision rule on known samples ---------------------------------------------------


@pytest.mark.parametrize("noise", [0.01, 0.05])
def test_a_a_runs_are_not_slower(noise: float) -> None:
    for seed in range(5):  # different draws of one distribution: never slower
        cmp = compare_docs([run_doc(seed, noise)], [run_doc(100 + seed, noise)])
        assert cmp.count(Verdict.SLOWER) == 0, verdicts(cmp)
        assert cmp.count(Verdict.FASTER) == 0, verdicts(cmp)
        assert cmp.exit_code == 0


def test_ten_percent_shift_with_low_noise_is_slower(tmp_path: Path) -> None:
    base = save(tmp_path, "base.json", run_doc(1, 0.01))
    cur = save(tmp_path, "cur.json", run_doc(2, 0.01, scale=1.10))
    cmp = compare_docs([run_doc(1, 0.01)], [run_doc(2, 0.01, scale=1.10)])
    assert verdicts(cmp) == {"slower": 20}
    assert all(1.07 < r.ratio < 1.13 and r.p_value < 1e-6 and not r.overlap for r in cmp.rows)
    result = invoke(base, cur)
    assert result.exit_code == 1, result.output
    assert "FAIL: 20 slower" in result.output
    # The reverse direction is an improvement and passes the gate.
    back = invoke(cur, base)
    assert back.exit_code == 0 and "20 faster" in back.output


def test_ten_percent_shift_within_high_noise_is_ambiguous(tmp_path: Path) -> None:
    base_doc, cur_doc = run_doc(3, 0.15), run_doc(4, 0.15, scale=1.10)
    cmp = compare_docs([base_doc], [cur_doc])
    assert cmp.count(Verdict.SLOWER) == 0
    amb = [r for r in cmp.rows if r.verdict is Verdict.AMBIGUOUS]
    assert amb and all(r.worse > 1.05 and (r.overlap or r.p_value >= 0.01) for r in amb)
    base, cur = save(tmp_path, "b.json", base_doc), save(tmp_path, "c.json", cur_doc)
    assert invoke(base, cur).exit_code == 0
    strict = invoke(base, cur, "--fail-on", "ambiguous")
    assert strict.exit_code == 1 and "ambiguous" in strict.output


def test_a_clock_change_is_named_beside_the_verdict(tmp_path: Path) -> None:
    # On the H200 the power cap moved the SM clock between two runs of the same code and
    # sdpa-cudnn timed 6-8% slower: the row says so, and the verdict still stands.
    base_doc, cur_doc = run_doc(1, 0.01), run_doc(2, 0.01, scale=1.08)
    for doc, mhz in ((base_doc, 1980.0), (cur_doc, 1830.0)):
        for c in doc["cases"]:
            c["timing"] = {"sm_clock_mhz": {"min": mhz, "mean": mhz, "max": mhz, "n": 3}}
    cmp = compare_docs([base_doc], [cur_doc])
    assert verdicts(cmp) == {"slower": 20}
    assert all(r.reason.endswith("; SM clock 1980→1830 MHz") for r in cmp.rows)
    out = tmp_path / "v.json"
    invoke(save(tmp_path, "b.json", base_doc), save(tmp_path, "c.json", cur_doc), "--json", out)
    rows = json.loads(out.read_text())["cases"]
    assert {tuple(r["sm_clock_mhz"]) for r in rows} == {(1980.0, 1830.0)}
    # Same clock, or a side without clock readings: nothing is added.
    for c in cur_doc["cases"]:
        c["timing"] = None
    assert not any("SM clock" in r.reason for r in compare_docs([base_doc], [cur_doc]).rows)


def test_too_few_samples_is_ambiguous() -> None:
    rng = random.Random(0)
    base = make_doc([make_case("triton", 1024, 64, draw(rng, 1.0, 0.01, n=3))])
    cur = make_doc([make_case("triton", 1024, 64, draw(rng, 2.0, 0.01, n=3))])
    (row,) = compare_docs([base], [cur]).rows
    assert row.verdict is Verdict.AMBIGUOUS and "too few samples" in row.reason


def test_tflops_agrees_with_latency_and_peak_memory_uses_the_threshold() -> None:
    slow = compare_docs([run_doc(1, 0.01)], [run_doc(2, 0.01, scale=1.10)], metric=Metric.TFLOPS)
    assert slow.count(Verdict.SLOWER) == 20
    assert all(r.ratio < 0.95 for r in slow.rows)  # TFLOP/s went down
    rng = random.Random(0)
    samples = draw(rng, 1.0, 0.01)

    def doc(peak: int) -> dict:
        return make_doc([make_case("triton", 1024, 64, samples, peak=peak)])

    assert (
        compare_docs([doc(100 << 20)], [doc(104 << 20)], metric=Metric.PEAK_MEM).rows[0].verdict
        is Verdict.SAME
    )
    more = compare_docs([doc(100 << 20)], [doc(120 << 20)], metric=Metric.PEAK_MEM)
    assert more.rows[0].verdict is Verdict.SLOWER and more.exit_code == 1


def test_strict_preset_catches_what_default_lets_through() -> None:
    base, cur = run_doc(1, 0.003), run_doc(2, 0.003, scale=1.03)
    assert compare_docs([base], [cur]).count(Verdict.SLOWER) == 0
    strict = Thresholds(latency=0.02, alpha=0.05)
    assert compare_docs([base], [cur], thresholds=strict).count(Verdict.SLOWER) == 20


# --- statuses, missing and new cases ------------------------------------------------------


def test_status_regressions_fail_and_missing_is_opt_in(tmp_path: Path) -> None:
    rng = random.Random(0)
    ok = [make_case("triton", s, 64, draw(rng, 1.0, 0.01)) for s in (512, 1024, 2048)]
    base = make_doc([*ok, make_case("sdpa-cudnn", 512, 64, draw(rng, 1.0, 0.01))])
    cur_cases = [dict(c) for c in ok]
    cur_cases[0] = make_case("triton", 512, 64, None, status="mismatch", error="max err 0.3")
    cur_cases[1] = make_case("triton", 1024, 64, None, status="oom", error="CUDA out of memory")
    cur_cases.append(make_case("flex", 512, 64, draw(rng, 1.0, 0.01)))  # new
    cur = make_doc(cur_cases)
    cmp = compare_docs([base], [cur])
    assert verdicts(cmp) == {"broken": 2, "missing": 1, "new": 1, "same": 1}
    assert {r.reason.split(":")[0] for r in cmp.rows if r.verdict is Verdict.BROKEN} == {
        "ok → mismatch", "ok → oom"}  # fmt: skip
    b, c = save(tmp_path, "b.json", base), save(tmp_path, "c.json", cur)
    result = invoke(b, c)
    assert result.exit_code == 1 and "ok → mismatch" in result.output
    # Only a missing case: passes unless --fail-on missing.
    only_missing = make_doc(ok)
    m = save(tmp_path, "m.json", only_missing)
    assert invoke(b, m).exit_code == 0
    assert invoke(b, m, "--fail-on", "missing").exit_code == 1
    # A fixed case (mismatch -> ok) is not a failure.
    assert invoke(c, b, "--filter", "impl=triton").exit_code == 0


# --- unusable input: exit 2 ----------------------------------------------------------------


def test_unusable_input_exits_2(tmp_path: Path) -> None:
    good = save(tmp_path, "good.json", run_doc(1, 0.01))
    other = save(tmp_path, "other.json", {**run_doc(1, 0.01), "schema": "fa-bench/0"})
    r = invoke(good, other)
    assert r.exit_code == 2 and "fa-bench/0" in r.output and "other.json" in r.output
    r = invoke(good, tmp_path / "nope.json")
    assert r.exit_code == 2 and "nope.json" in r.output
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    assert invoke(good, broken).exit_code == 2
    rng = random.Random(0)
    disjoint = save(tmp_path, "d.json", make_doc([make_case("flex", 64, 32, draw(rng, 1, 0.01))]))
    r = invoke(good, disjoint)
    assert r.exit_code == 2 and "no case is common" in r.output
    for args, needle in [(["-t", "abc"], "--threshold"), (["-t", "5"], "5%"),
                         (["-t", "speed=5%"], "latency"), (["--filter", "color=red"], "impl"),
                         (["--filter", "impl=nothing"], "matches no case"),
                         (["--metric", "joules"], "--metric"),
                         (["--preset", "lax"], "--preset")]:  # fmt: skip
        r = invoke(good, good, *args)
        assert r.exit_code == 2, (args, r.output)
        assert needle in r.output, (args, r.output)


def test_thresholds_parse() -> None:
    assert parse_threshold("5%") == (None, pytest.approx(0.05))
    assert parse_threshold("0.05") == (None, 0.05)
    assert parse_threshold("peak_mem=10%") == (Metric.PEAK_MEM, pytest.approx(0.10))
    result = invoke(*["x"] * 2, "-h")
    assert result.exit_code == 0 and "--allow-env-mismatch" in result.output


# --- environment ---------------------------------------------------------------------------


def test_gpu_model_mismatch_refused_unless_allowed(tmp_path: Path) -> None:
    h200 = save(tmp_path, "h200.json", run_doc(1, 0.01))
    h100 = save(tmp_path, "h100.json", run_doc(2, 0.01, gpu="NVIDIA H100 80GB HBM3"))
    r = invoke(h200, h100)
    assert r.exit_code == 2 and "--allow-env-mismatch" in r.output and "H100" in r.output
    md = tmp_path / "summary.md"
    r = invoke(h200, h100, "--allow-env-mismatch", "--markdown", md)
    assert r.exit_code == 0 and "GPU models differ" in r.output
    assert "Environment differs" in md.read_text() and "H100" in md.read_text()


def test_version_differences_are_shown_but_do_not_block(tmp_path: Path) -> None:
    base = save(tmp_path, "b.json", run_doc(1, 0.01))
    cur = save(tmp_path, "c.json", run_doc(2, 0.01, torch="2.12.0", driver="590.1"))
    r = invoke(base, cur)
    assert r.exit_code == 0
    assert "environment differs" in r.output and "2.12.0" in r.output and "590.1" in r.output


def test_report_page_with_merged_runs_matches_by_gpu(tmp_path: Path) -> None:
    h100_doc = run_doc(5, 0.01, gpu="NVIDIA H100 80GB HBM3", scale=3.0)  # much slower card
    page = tmp_path / "report.html"
    embedded = embed_json([ResultsDoc.from_json(d) for d in (h100_doc, run_doc(1, 0.01))])
    page.write_text(f"<html><body>{embedded}</body></html>")
    cur = save(tmp_path, "c.json", run_doc(2, 0.01))
    cmp_json = tmp_path / "cmp.json"
    r = invoke(page, cur, "--json", cmp_json)
    # H200 compares with H200 (same); the page's H100 cases have no counterpart: missing.
    assert r.exit_code == 0, r.output
    doc = json.loads(cmp_json.read_text())
    assert doc["schema"] == "fa-bench-compare/1" and doc["keyed_by_gpu"] is True
    assert doc["counts"] == {"same": 20, "missing": 20}
    assert all(c["key"].startswith("NVIDIA H100") for c in doc["cases"]
               if c["verdict"] == "missing")  # fmt: skip


# --- outputs -------------------------------------------------------------------------------


def test_markdown_and_json_name_the_slower_cases(tmp_path: Path) -> None:
    base = run_doc(1, 0.01)
    cur = run_doc(2, 0.01)
    slowed = {c["id"] for c in cur["cases"] if c["impl"] == "triton" and c["seqlen_q"] >= 2048}
    rng = random.Random(7)
    for c in cur["cases"]:
        if c["id"] in slowed:
            c["latency_ms"] = summarize(draw(rng, 1.25 * c["latency_ms"]["median"], 0.01))
    b, c = save(tmp_path, "b.json", base), save(tmp_path, "c.json", cur)
    md, js = tmp_path / "s.md", tmp_path / "s.json"
    r = invoke(b, c, "--markdown", md, "--json", js)
    assert r.exit_code == 1
    text = md.read_text()
    assert text.startswith("### ❌") and f"{len(slowed)} slower" in text
    assert all(f"`{i}`" in text for i in slowed)
    doc = json.loads(js.read_text())
    assert doc["exit_code"] == 1
    assert {x["key"] for x in doc["cases"] if x["verdict"] == "slower"} == slowed
    first = doc["cases"][: len(slowed)]  # sorted by impact: the failures come first
    assert {x["key"] for x in first} == slowed
    assert all(math.isclose(x["ratio"], 1.25, rel_tol=0.03) for x in first)


# --- end to end on this CPU ------------------------------------------------------------------

# Measured on this 2-core CI machine (2026-11-29): with glibc's adaptive malloc
# thresholds, cases that allocate N x N buffers every call (naive, sdpa-math) timed
# 1.3x-2.8x apart from run to run; the runner now fixes those thresholds for CPU workers.
# Even so, run-to-run shifts of a whole case remain: naive jumped 1.49x, and after the
# heavier tests of this suite had run, sdpa-math (N=512) moved 1.60x and sdpa (N=128)
# 1.52x between two fresh runs. Within a run the p20-p80 ranges are a few % wide, so the
# rank test alone would call such a shift "slower"; only the threshold can absorb it.
# 100% (2x) clears the 1.6x seen and still catches the 3.8-4.5x slowdown of the next test.
# naive is left out: its shifts are the largest, and this test is about the gate.
# Torch's intra-op threads are pinned to 1: with 2 threads and another process on the 2
# cores, OpenMP spin-waits put some medians 1000x off (measured: 36 ms vs 0.03 ms).
CPU_THRESHOLD = "100%"
CPU_RUN = ["--max-time", "0.2", "--min-samples", "10", "--target-noise", "0.01"]


@pytest.fixture
def quiet_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the worker subprocess inherits it
    monkeypatch.setenv("FA_BENCH_TUNING_CACHE", "off")


def fa_run(suite: Path, out: Path, *extra: str) -> Path:
    result = runner.invoke(app, ["run", "-s", str(suite), "--out", str(out), *CPU_RUN, *extra])
    assert result.exit_code == 0, result.output
    return out


# The run-to-run shifts measured above, as fixed samples: whole cases 1.49x-1.60x apart
# between two runs of the same code (either way), a few % spread within a run. What the gate
# decides on them is deterministic; the real runs below can only sample such shifts.
CPU_SHIFTS = {("sdpa-math", 256): 1.60, ("sdpa-math", 512): 1 / 1.60,
              ("sdpa", 256): 1.52, ("sdpa", 512): 1.49}  # fmt: skip


def cpu_shift_docs(seed: int) -> tuple[dict, dict]:
    rng = random.Random(seed)
    base, cur = [], []
    for (impl, seqlen), shift in CPU_SHIFTS.items():
        center = seqlen * seqlen / 1e5  # ms; sdpa-math at N=512 ran about 2.6 ms here
        base.append(make_case(impl, seqlen, 16, draw(rng, center, 0.03, n=10)))
        cur.append(make_case(impl, seqlen, 16, draw(rng, center * shift, 0.03, n=10)))
    return make_doc(base, gpu=None), make_doc(cur, gpu=None)


@pytest.mark.parametrize("seed", range(3))  # three comparisons, as of the runs below
def test_cpu_run_to_run_shifts_pass_the_cpu_threshold(tmp_path: Path, seed: int) -> None:
    base_doc, cur_doc = cpu_shift_docs(seed)
    base, cur = save(tmp_path, "b.json", base_doc), save(tmp_path, "c.json", cur_doc)
    result = invoke(base, cur, "--threshold", CPU_THRESHOLD)
    assert result.exit_code == 0, result.output
    assert "PASS" in result.output
    # Only the threshold absorbs them: the default 5% calls the slower three "slower".
    strict_json = tmp_path / "strict.json"
    assert invoke(base, cur, "--json", strict_json).exit_code == 1
    verdicts = {c["verdict"] for c in json.loads(strict_json.read_text())["cases"]}
    assert "slower" in verdicts


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU end-to-end")
def test_cpu_runs_of_the_same_code_do_not_flap(tmp_path: Path, tiny_suite, quiet_cpu) -> None:
    suite = tiny_suite(["sdpa-math", "sdpa"], seqlens=[256, 512])
    runs = [fa_run(suite, tmp_path / f"run{i}") for i in range(4)]
    for base, cur in itertools.pairwise(runs):  # three comparisons, each of two fresh runs
        result = invoke(base, cur, "--threshold", CPU_THRESHOLD)
        assert result.exit_code == 0, result.output
        assert "PASS" in result.output


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU end-to-end")
def test_cpu_slowed_triton_config_fails_the_gate(
    tmp_path: Path, tiny_suite, quiet_cpu, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Our Triton kernel, interpreted: the heuristic's 64x64 tiles cover seqlen 64 in one
    # program; 16x64 tiles take four (measured: 3.8-4.5x the time, 13.5 -> 50 ms), well
    # past the run-to-run shifts this machine shows (up to 1.69x).
    suite = tiny_suite(["triton"], seqlens=[64], head_dims=[16])
    cpu_run = ["--max-time", "1.0"]
    normal = fa_run(suite, tmp_path / "normal", *cpu_run)
    slow_cache = write_slow_cache(tmp_path / "slow.json", "cpu", block_m=16, block_n=64)
    monkeypatch.setenv("FA_BENCH_TUNING_CACHE", str(slow_cache))
    slowed = fa_run(suite, tmp_path / "slowed", *cpu_run)
    assert "bm16-bn64" in json.loads((slowed / "results.json").read_text())["cases"][0]["backend"]
    verdicts_json = tmp_path / "verdicts.json"
    result = invoke(normal, slowed, "--threshold", CPU_THRESHOLD, "--json", verdicts_json)
    assert result.exit_code == 1, result.output
    (case,) = json.loads(verdicts_json.read_text())["cases"]
    assert case["verdict"] == "slower" and case["key"].startswith("triton/fwd/fp32/")
    assert case["ratio"] > 2 and "FAIL: 1 slower" in result.output


# --- on the GPU (next session) ----------------------------------------------------------------

# triton-deterministic: on the H200 `triton` runs Gluon kernels here (the forward at
# head_dim 128 from 1k keys, the default backward), whose launches the tuning cache does
# not reach; the two-kernel backward and its `tl` forward take the slowed tiles
GPU_AXES = ["-i", "sdpa-cudnn", "-i", "triton-deterministic", "--dtype", "bf16",
            "--head-dim", "128", "--seqlen", "1024", "--seqlen", "4096"]  # fmt: skip


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_gate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FA_BENCH_TUNING_CACHE", "off")

    def gpu_run(out: Path) -> Path:
        result = runner.invoke(app, ["run", "-s", "standard", *GPU_AXES, "--out", str(out)])
        assert result.exit_code == 0, result.output
        return out

    a, b = gpu_run(tmp_path / "a"), gpu_run(tmp_path / "b")
    same = invoke(a, b)
    print(same.output)
    assert same.exit_code == 0 and "slower" not in same.output.split("PASS")[1]
    slow_cache = write_slow_cache(tmp_path / "slow.json", torch.cuda.get_device_name(0))
    monkeypatch.setenv("FA_BENCH_TUNING_CACHE", str(slow_cache))
    verdicts_json = tmp_path / "verdicts.json"
    slow = invoke(a, gpu_run(tmp_path / "slow"), "--json", verdicts_json)
    print(slow.output)
    assert slow.exit_code == 1
    rows = json.loads(verdicts_json.read_text())["cases"]
    slower = {r["key"] for r in rows if r["verdict"] == "slower"}
    assert slower and all(k.startswith("triton-deterministic/") for k in slower)
