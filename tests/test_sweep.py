"""`fa-bench sweep`: config space, pruning, rules of thumb, an interpreter sweep end to end."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fa_bench.case import Case
from fa_bench.cli import app
from fa_bench.kernels.flash_config import FlashConfig
from fa_bench.sweep.space import (
    H200_SMEM_BYTES,
    RULES,
    SweepSpace,
    expand,
    prune_reason,
    rules_of_thumb,
    smem_estimate_bytes,
    sweep_points,
)
from fa_bench.sweep.vocab import MODE_FIELDS, config_label, label, mode_fields, short_fields


def _case(mode: str = "fwd", seqlen: int = 4096, head_dim: int = 128, dtype: str = "bf16") -> Case:
    return Case("triton", mode, dtype, 4, 16, 16, seqlen, seqlen, head_dim, False)


def test_expand_is_the_full_product_with_mode_fields() -> None:
    space = SweepSpace(block_m=(64, 128), block_n=(32, 64, 128), warps=(4, 8), stages=(2, 3))
    fwd = expand(space, "fwd")
    assert len(fwd) == space.size == 24 and len({json.dumps(f) for f in fwd}) == 24
    assert set(fwd[0]) == {"block_m", "block_n", "num_warps", "num_stages"}
    assert set(expand(space, "bwd")[0]) == {"bwd_block_m", "bwd_block_n", "bwd_num_warps",
                                           "bwd_num_stages"}  # fmt: skip
    with pytest.raises(ValueError, match="fwd, bwd"):
        expand(space, "fwd_bwd")
    with pytest.raises(ValueError, match="--warps"):
        SweepSpace(warps=())


def test_shared_memory_rule_matches_the_h200_measurements() -> None:
    """docs/kernel.md, the development runs: 128x128 tiles at head_dim 128 with 4 stages
    were OutOfResources, 3 stages ran."""
    case = _case()
    four = {"block_m": 128, "block_n": 128, "num_warps": 8, "num_stages": 4}
    three = dict(four, num_stages=3)
    assert smem_estimate_bytes(case, four) == 4 * 2 * 128 * 128 * 2
    assert "shared memory" in prune_reason(case, four, H200_SMEM_BYTES)
    assert prune_reason(case, three, H200_SMEM_BYTES) is None
    assert prune_reason(case, four, None) is None  # no device: no limit to check
    bwd = {"bwd_block_m": 128, "bwd_block_n": 128, "bwd_num_warps": 8, "bwd_num_stages": 4}
    assert "shared memory" in prune_reason(_case("bwd"), bwd, H200_SMEM_BYTES)


def test_invalid_and_redundant_configs_are_pruned_with_a_reason() -> None:
    bad = {"block_m": 48, "block_n": 64, "num_warps": 4, "num_stages": 2}
    assert "power of two" in prune_reason(_case(), bad, None)
    big = {"block_m": 256, "block_n": 64, "num_warps": 4, "num_stages": 2}
    assert "redundant" in prune_reason(_case(seqlen=100), big, None)
    assert prune_reason(_case(seqlen=200), big, None) is None  # 200 pads to 256


def test_points_keep_the_default_first_and_never_prune_it() -> None:
    space = SweepSpace(block_m=(16, 256), block_n=(16,), warps=(4,), stages=(1,))
    case = _case(seqlen=32, head_dim=16, dtype="fp32")
    points = sweep_points([case], space, capability=None, smem_limit_bytes=None, with_rules=False)
    assert points[0].is_default and points[0].pruned is None
    assert sum(p.is_default for p in points) == 1
    assert [p.pruned is not None for p in points[1:]] == [False, True]  # 256 > 32: redundant


def test_the_default_point_is_the_heuristic_for_the_case_length() -> None:
    space = SweepSpace(block_m=(64, 128), block_n=(64, 128), warps=(4, 8), stages=(3,))
    short, long = (replace(_case(seqlen=n), causal=True) for n in (1024, 4096))
    for case, tile in ((short, "bm64-bn64-w4-s3"), (long, "bm128-bn128-w8-s3")):
        points = sweep_points([case], space, capability=(9, 0), smem_limit_bytes=None,
                              with_rules=False)  # fmt: skip
        assert label(points[0].fields) == tile and points[0].is_default


def test_each_rule_of_thumb_tile_is_measured_even_outside_the_product() -> None:
    space = SweepSpace(block_m=(64, 128), block_n=(64, 128), warps=(4, 8), stages=(2, 3))
    case = _case(seqlen=4096, head_dim=128)
    points = sweep_points([case], space, capability=(9, 0), smem_limit_bytes=H200_SMEM_BYTES)
    assert len(points) == space.size + 1  # the product holds the default; one rule tile is new
    marked = {label(p.fields): p.rules for p in points if p.rules}
    # sqrt(227 KB / 2 B / (3 * 128)) = 17 -> 16, outside the product, with the default's
    # 8 warps and 3 stages; 192 -> 128 and "128 up to 4k" pick the same tile, in the product.
    assert marked == {
        "bm16-bn16-w8-s3": ("sqrt(M/3d)",),
        "bm128-bn128-w8-s3": ("256@d64,192@d128", "by seqlen"),
    }
    assert points[-1].pruned is None and label(points[-1].fields) == "bm16-bn16-w8-s3"
    # A rule's tile that cannot fit is a pruned row with the reason, not a silent gap.
    wide = sweep_points([_case(seqlen=1024, head_dim=64)], space, capability=(9, 0),
                        smem_limit_bytes=64 * 1024)  # fmt: skip
    big = [p for p in wide if "by seqlen" in p.rules]
    assert len(big) == 1 and "shared memory" in big[0].pruned
    bare = sweep_points([case], space, capability=(9, 0), smem_limit_bytes=H200_SMEM_BYTES,
                        with_rules=False)  # fmt: skip
    assert len(bare) == space.size and not any(p.rules for p in bare)


def test_one_label_format_for_sweep_rows_and_backend_strings() -> None:
    cfg = FlashConfig(block_m=128, block_n=64, num_warps=4, num_stages=3, bwd_block_m=32,
                      bwd_block_n=128, bwd_num_warps=8, bwd_num_stages=2)  # fmt: skip
    fwd, bwd = mode_fields(cfg, "fwd"), mode_fields(cfg, "bwd")
    assert tuple(fwd) == MODE_FIELDS["fwd"] and tuple(bwd) == MODE_FIELDS["bwd"]
    assert label(fwd) == "bm128-bn64-w4-s3" and label(bwd) == "bm32-bn128-w8-s2"
    assert short_fields(bwd) == {"block_m": 32, "block_n": 128, "num_warps": 8, "num_stages": 2}
    assert config_label(cfg, "fwd") == "bm128-bn64-w4-s3"
    assert config_label(cfg, "bwd") == "bwd-bm32-bn128-w8-s2"
    assert config_label(cfg, "fwd_bwd") == "bm128-bn64-w4-s3/bwd-bm32-bn128-w8-s2"
    # A pruned row still gets its label: the fields need not make a valid FlashConfig.
    assert label({"block_m": 48, "block_n": 64, "num_warps": 3, "num_stages": 9}) == (
        "bm48-bn64-w3-s9"
    )


def test_the_label_format_and_the_mode_fields_have_one_owner() -> None:
    """Only fa_bench/sweep/vocab.py spells the label format or the mode -> fields table;
    everything else (kernel adapter, tuning cache, report, tools) calls it."""
    root = Path(__file__).resolve().parent.parent
    owner = (root / "fa_bench" / "sweep" / "vocab.py").resolve()
    spelled = ['f"bm{', "f'bm{", '("bwd_block_m", "bwd_block_n", "bwd_num_warps"']
    sources = [
        p for d in ("fa_bench", "kernels", "reports", "tools") for p in (root / d).rglob("*.py")
    ]
    assert owner in {p.resolve() for p in sources}
    for path in sources:
        if path.resolve() != owner:
            text = path.read_text(encoding="utf-8")
            assert not [s for s in spelled if s in text], path


def test_rules_of_thumb() -> None:
    assert tuple(rules_of_thumb(64, 1024, None, 2)) == RULES
    assert rules_of_thumb(64, 1024, H200_SMEM_BYTES, 2) == {
        "sqrt(M/3d)": 16, "256@d64,192@d128": 256, "by seqlen": 256}  # fmt: skip
    r = rules_of_thumb(128, 16384, None, 2)
    assert r == {"sqrt(M/3d)": None, "256@d64,192@d128": 128, "by seqlen": 64}
    assert rules_of_thumb(256, 4096, None, 2)["by seqlen"] == 128


def test_cli_rejects_bad_flags(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["sweep", "--device", "cpu", "--block-m", "64,x",
                                      "--out", str(tmp_path / "o")])  # fmt: skip
    assert result.exit_code == 2 and "--block-m" in result.output
    result = CliRunner().invoke(app, ["sweep", "--device", "cpu", "--mode", "fwd_bwd"])
    assert result.exit_code == 2 and "fwd, bwd" in result.output


SWEEP = ["sweep", "--device", "cpu", "--dtype", "fp32", "--mode", "fwd", "--mode", "bwd",
         "--seqlen", "40", "--head-dim", "16", "--batch", "1", "--heads", "2", "--kv-heads", "1",
         "--no-causal", "--block-m", "16,32", "--block-n", "32", "--warps", "4", "--stages", "1",
         "--max-time", "0.05", "--min-samples", "3", "--target-noise", "0.2"]  # fmt: skip


@pytest.mark.slow
def test_interpreter_sweep_end_to_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    cache = tmp_path / "tuning.json"
    out = tmp_path / "sweep"
    flags = ["-s", "smoke", "--save-best", "--min-gain", "0", "--tuning-cache", str(cache)]
    result = CliRunner().invoke(app, [*SWEEP, *flags, "--out", str(out)])
    assert result.exit_code == 0, result.output
    from fa_bench.sweep.execute import load_sweep

    doc = load_sweep(out / "sweep.json")
    assert doc["run"]["timing"]["warmup_ms"] == 20.0  # the CPU default (GPU: 500)
    case_ids = {r["case_id"] for r in doc["rows"]}
    assert len(case_ids) == 2  # the flags collapse smoke's groups into one shape: fwd, bwd
    for cid in case_ids:
        rows = [r for r in doc["rows"] if r["case_id"] == cid]
        # default (bm64-bn64) + 2 configs of the product + the rules' 256 tile, which is
        # longer than the 40-token sequence: a pruned row that says so.
        assert len(rows) == 4
        assert sum(r["is_default"] for r in rows) == 1
        rule_row = rows.pop()
        assert rule_row["rules"] == ["256@d64,192@d128", "by seqlen"]
        assert rule_row["status"] == "pruned" and "redundant" in rule_row["error"]
        for r in rows:
            assert r["status"] == "ok", r
            assert r["accuracy_passed"] is True and r["tflops"] > 0
            assert r["compile_s"] is not None and "(sweep)" in r["backend"]
    summary = {c["case_id"]: c for c in doc["cases"]}
    for c in summary.values():
        assert c["best_tflops"] >= c["default_tflops"] > 0
    entries = json.loads(cache.read_text())["entries"]
    assert {e["mode"] for e in entries} == {"fwd", "bwd"}

    # A run of the same shape now reports the cached config.
    run_out = tmp_path / "run"
    run = CliRunner().invoke(app, ["run", "-s", "smoke", "-i", "triton", "--device", "cpu",
                                   "--dtype", "fp32", "--mode", "fwd", "--seqlen", "40",
                                   "--head-dim", "16", "--batch", "1", "--heads", "2",
                                   "--kv-heads", "1", "--no-causal", "--max-time", "0.05",
                                   "--min-samples", "3", "--target-noise", "0.2",
                                   "--tuning-cache", str(cache),
                                   "--out", str(run_out)])  # fmt: skip
    assert run.exit_code == 0, run.output
    records = json.loads((run_out / "results.json").read_text())["cases"]
    fwd_entry = next(e for e in entries if e["mode"] == "fwd")
    want = "triton:" + label(fwd_entry["config"])
    for rec in records:
        assert "(tuning cache" in rec["backend"] and want in rec["backend"], rec["backend"]

    from fa_bench.reports.sweep_figures import sweep_section

    section = sweep_section(doc)
    assert len(section) == 2 and section[0]["heatmap"].data[0].z is not None
    assert section[0]["top"][0]["rank"] == 1
    assert {r["rule"] for r in section[0]["rules"]} == {"sqrt(M/3d)", "256@d64,192@d128",
                                                        "by seqlen"}  # fmt: skip

    # The sweep's page, and `fa-bench report` on a sweep.json, show those sections.
    page = (out / "sweep.html").read_text()
    assert page.count('class="figure" id="section-sweep-') == 2
    assert "Best: " in page and "rule of thumb" in page
    both = tmp_path / "both.html"
    made = CliRunner().invoke(app, ["report", str(out / "sweep.json"), str(run_out), "--out",
                                    str(both), "--plotlyjs", "cdn"])  # fmt: skip
    assert made.exit_code == 0, made.output
    html = both.read_text()
    assert 'id="section-sweep-1"' in html and 'id="section-cases"' in html


@pytest.mark.slow
def test_budget_stops_cleanly_keeping_rows(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    out = tmp_path / "sweep"
    # 0.01 minutes: the first point starts the worker and runs; the budget is spent after.
    result = CliRunner().invoke(app, [*SWEEP, "--mode", "fwd", "--budget-minutes", "0.01",
                                      "--out", str(out)])  # fmt: skip
    assert result.exit_code == 0, result.output
    doc = json.loads((out / "sweep.json").read_text())
    assert doc["run"]["stopped"] == "budget"
    measured = [r for r in doc["rows"] if r["status"] != "pruned"]
    assert 1 <= len(measured) < doc["run"]["points"]
    assert "stopped early" in result.output


@pytest.mark.slow
def test_parallel_compile_phase_builds_every_point_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # inherited by the spawned builders
    out = tmp_path / "sweep"
    result = CliRunner().invoke(app, [*SWEEP, "-s", "smoke", "--compile-jobs", "2", "--no-rules",
                                      "--out", str(out)])  # fmt: skip
    assert result.exit_code == 0, result.output
    doc = json.loads((out / "sweep.json").read_text())
    phase = doc["run"]["compile_phase"]
    # fwd and bwd, 3 configs each, every one its own group; the builds ran in the pool.
    assert phase | {"wall_s": 0} == {"jobs": 2, "groups": 6, "wall_s": 0, "stopped": None,
                                     "built": 6, "failed": 0}  # fmt: skip
    for r in doc["rows"]:
        assert r["status"] == "ok", r
        assert r["compile_s"] is not None and r["prepare_s"] is not None


def test_compile_groups_share_a_config_across_sequence_lengths() -> None:
    from fa_bench.sweep.precompile import compile_groups, default_jobs

    space = SweepSpace(block_m=(64, 128), block_n=(64,), warps=(4,), stages=(2,))
    cases = [_case(seqlen=n) for n in (1024, 4096)] + [_case(seqlen=1024, mode="bwd")]
    points = sweep_points(cases, space, capability=(9, 0), smem_limit_bytes=H200_SMEM_BYTES,
                          with_rules=False)  # fmt: skip
    groups = compile_groups(points)
    sizes = sorted(len(g) for g in groups)
    # fwd: the default + 2 tiles, each shared by both lengths; bwd: the default + 2 tiles.
    assert sizes == [1, 1, 1, 2, 2, 2]
    assert default_jobs("cpu") == 0 and default_jobs("cuda") >= 1


def test_compile_phase_past_its_deadline_stops_and_leaves_the_rest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import signal

    from fa_bench.sweep import precompile as sweep_compile
    from fa_bench.sweep.precompile import compile_groups, precompile

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    seen = []  # every process the phase sees as a child: its workers, to check they were stopped

    def children() -> list:
        kids = real()
        seen.extend(kids)
        return kids

    real = sweep_compile.active_children
    monkeypatch.setattr(sweep_compile, "active_children", children)
    space = SweepSpace(block_m=(16, 32), block_n=(16,), warps=(4,), stages=(1,))
    points = sweep_points([_case(seqlen=40, head_dim=16, dtype="fp32")], space, capability=None,
                          smem_limit_bytes=None, with_rules=False)  # fmt: skip
    # 0.3 s is less than a builder process needs to import torch: nothing gets built.
    groups = compile_groups(points)
    built, summary = precompile(groups, device="cpu", gpu=None, jobs=2, deadline_s=0.3)
    assert built == {} and summary["stopped"] == "deadline" and summary["wall_s"] < 5
    # The running builds were killed, not left to finish beside the timing.
    assert seen and all(p.exitcode == -signal.SIGTERM for p in seen)


def _summary(case_id: str, seqlen: int, gain: float | None) -> tuple[dict, dict]:
    case = replace(_case(seqlen=seqlen, head_dim=64), causal=True)
    row = {"case_id": case_id, **case.to_dict()}
    fields = {"block_m": 64, "block_n": 64, "num_warps": 4, "num_stages": 3}
    default = None if gain is None else 100.0
    best = 100.0 * (1 + (gain or 0))
    case = {"case_id": case_id, "best_fields": fields, "best_tflops": best,
            "default_tflops": default, "gain_over_default": gain}  # fmt: skip
    return row, case


def test_save_best_keeps_the_heuristic_below_the_minimum_gain() -> None:
    from fa_bench.sweep.execute import best_entries

    parts = [_summary("a", 1024, 0.05), _summary("b", 4096, 0.02), _summary("c", 16384, None),
             _summary("d", 512, 0.20)]  # fmt: skip
    doc = {"rows": [r for r, _ in parts], "cases": [c for _, c in parts]}
    keep, stay = best_entries(doc, "H200", "sweep.json", "now", min_gain=0.03)
    # "d" (512) shares the 257-1024 bucket with "a" (1024): the longer case decides.
    assert sorted(e["seqlen"] for e in keep) == [1024, 16384]  # 5% and a failed default
    assert stay == [("H200", "bf16", 64, True, "fwd", "1025-4096")]  # 2% < 3%
    keep, stay = best_entries(doc, "H200", "sweep.json", "now")
    assert len(keep) == 3 and stay == []
