"""The Gluon forward's launch as FlashConfig fields, its sweep (`fa-bench sweep --kernel
gluon`), the tuning cache and the `triton` adapter (issue 21, item 4).

CPU tests fake the Gluon side's answers where a decision needs an sm_90 GPU; the GPU test
runs a two-point Gluon sweep, saves the best and runs it on sm_90.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from fa_bench.case import Case
from fa_bench.cli import app
from fa_bench.kernels import flash_dispatch, flash_gluon, gluon_fields, triton_impl
from fa_bench.kernels.flash_config import FlashConfig
from fa_bench.kernels.flash_gluon import GluonConfig, candidate_configs, gluon_config
from fa_bench.sweep import tuning
from fa_bench.sweep.execute import _row, best_entries, summarize_cases
from fa_bench.sweep.gluon_space import (
    GluonSpace,
    case_reason,
    check_not_all_pruned,
    device_reason,
    gluon_points,
)
from fa_bench.sweep.plan import SweepPlan, load_plan, write_plan
from fa_bench.sweep.space import H200_SMEM_BYTES
from fa_bench.sweep.vocab import fields_kernel, label, row_config

HEURISTIC = FlashConfig().__dict__  # every gluon_* field unset


def _case(head_dim: int = 128, seqlen: int = 4096, causal: bool = False, **kw) -> Case:
    d = dict(mode="fwd", dtype="bf16")
    d.update(kw)
    return Case("triton", d["mode"], d["dtype"], 1, 4, 4, seqlen, seqlen, head_dim, causal)


# --- the fields -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "field, value",
    [("gluon_variant", "wx"), ("gluon_block_n", 48), ("gluon_block_n", True),
     ("gluon_stages", 5), ("gluon_warps", 2), ("gluon_pingpong", 1),
     ("gluon_persistent", "yes"), ("gluon_consumers", 4), ("gluon_q_buffers", 3)],
)  # fmt: skip
def test_each_gluon_field_is_validated_naming_it_and_its_values(field, value):
    with pytest.raises(ValueError, match=rf"{field} must be .* or one of .*got {value!r}"):
        FlashConfig(**{field: value})


def test_unset_fields_are_the_heuristic_at_every_head_dim():
    for head_dim in flash_gluon.HEAD_DIMS:
        for causal in (False, True):
            assert gluon_fields.resolve(HEURISTIC, head_dim, causal) == gluon_config(
                head_dim, causal
            )


def test_every_candidate_round_trips_through_the_fields():
    for head_dim in flash_gluon.HEAD_DIMS:
        for role, g in candidate_configs(head_dim).items():
            fields = gluon_fields.fields_of(g)
            assert gluon_fields.pinned(fields) == g, role
            assert gluon_fields.resolve(FlashConfig(**fields).__dict__, head_dim, False) == g
            assert label(fields) == f"gluon-{g.label()}" and fields_kernel(fields) == "gluon"


def test_partial_fields_lay_over_the_heuristic():
    persist = gluon_fields.resolve({"gluon_persistent": True}, 128, False)
    assert persist == GluonConfig(block_n=128, stages=3, persistent=True)
    # head_dim 256: the pipelined fallback takes 4 warps x 64 rows, its 2 stages
    pipe = gluon_fields.resolve({"gluon_variant": "pipelined"}, 256, False)
    assert (pipe.block_m, pipe.num_warps, pipe.stages, pipe.block_n) == (64, 4, 2, 64)
    # three consumers: no ping-pong, 160 registers each, the deepest ring that fits
    c3 = gluon_fields.resolve({"gluon_consumers": 3, "gluon_block_n": 128}, 64, False)
    assert c3 == candidate_configs(64)["ws-c3"]
    # causal d64's heuristic is pipelined; a forced ws takes the ws rule (deepest ring)
    ws = gluon_fields.resolve({"gluon_variant": "ws"}, 64, True)
    assert ws == candidate_configs(64)["ws"]


def test_a_forced_launch_that_cannot_run_is_a_value_error_naming_it():
    with pytest.raises(ValueError, match=r"gluon_stages.*4.*shared memory"):
        gluon_fields.resolve({"gluon_stages": 4}, 128, False)
    with pytest.raises(ValueError, match=r"head_dim=96"):
        gluon_fields.resolve({"gluon_stages": 2}, 96, False)
    with pytest.raises(ValueError, match=r"consumers=3, pingpong=True"):
        gluon_fields.resolve({"gluon_consumers": 3, "gluon_pingpong": True}, 64, False)
    with pytest.raises(ValueError, match=r"unset: gluon_block_n"):
        gluon_fields.pinned({"gluon_variant": "ws"})


def _qkv(head_dim: int = 128):
    t = torch.zeros((1, 2, 64, head_dim), dtype=torch.float16)
    return t, t, t


def test_the_dispatch_builds_the_forced_gluon_config(monkeypatch):
    monkeypatch.setattr(flash_gluon, "gluon_reason", lambda *a: None)
    monkeypatch.setattr(flash_gluon, "gluon_preferred", lambda *a: True)
    q, k, v = _qkv()
    cfg = FlashConfig(forward="gluon", gluon_stages=2, gluon_pingpong=False)
    got = flash_dispatch.gluon_choice(q, k, v, False, cfg)
    assert got == GluonConfig(block_n=128, stages=2, pingpong=False)
    tuned = FlashConfig(gluon_persistent=True)  # forward "auto": where Gluon is preferred
    assert flash_dispatch.gluon_choice(q, k, v, False, tuned).persistent is True
    assert flash_dispatch.gluon_choice(q, k, v, False, FlashConfig()) == gluon_config(128)
    with pytest.raises(ValueError, match="shared memory"):
        flash_dispatch.gluon_choice(q, k, v, False, FlashConfig(forward="gluon", gluon_stages=4))


# --- the space --------------------------------------------------------------------------


def test_the_space_is_the_candidates_heuristic_first_without_duplicates():
    case = _case(128)
    points = gluon_points([case], GluonSpace(), smem_limit_bytes=H200_SMEM_BYTES)
    labels = [p.label for p in points]
    assert points[0].is_default and labels[0] == "gluon-" + gluon_config(128).label()
    assert sum(p.is_default for p in points) == 1 and len(set(labels)) == len(labels)
    want = {"gluon-" + g.label() for g in candidate_configs(128).values()}
    assert set(labels) == want  # no ws-c3 at head_dim 128
    assert not any(p.pruned for p in points)
    # causal d64: the heuristic is the pipelined fallback, measured once
    d64 = gluon_points([_case(64, causal=True)], GluonSpace(), smem_limit_bytes=None)
    assert d64[0].fields["gluon_variant"] == "pipelined"
    assert [p.label for p in d64].count(d64[0].label) == 1
    assert any(p.fields["gluon_consumers"] == 3 for p in d64)


def test_axis_values_are_laid_over_each_role_and_pruned_by_shared_memory():
    space = GluonSpace(roles=("ws", "pipelined"), stages=(2, 4))
    points = gluon_points([_case(128, causal=True)], space, smem_limit_bytes=H200_SMEM_BYTES)
    by_label = {p.label: p for p in points}
    assert set(by_label) == {"gluon-ws-m64-n128-s3", "gluon-ws-m64-n128-s2",
                             "gluon-ws-m64-n128-s4", "gluon-pipelined-m128-n128-s2-w8",
                             "gluon-pipelined-m128-n128-s4-w8"}  # fmt: skip
    assert by_label["gluon-ws-m64-n128-s4"].pruned.startswith("shared memory")
    assert by_label["gluon-pipelined-m128-n128-s4-w8"].pruned.startswith("shared memory")
    assert by_label["gluon-ws-m64-n128-s2"].pruned is None
    # a device with less shared memory prunes more; keys longer than the sequence are redundant
    small = gluon_points([_case(128, causal=True)], space, smem_limit_bytes=160 * 1024)
    assert {p.label for p in small if not p.pruned and not p.is_default} == set()
    short = gluon_points([_case(64, seqlen=64)], GluonSpace(block_n=(128,)), smem_limit_bytes=None)
    others = [p for p in short if not p.is_default]
    assert others and all("redundant: block_n 128" in (p.pruned or "") for p in others)


def test_a_space_pruned_for_every_case_is_refused_naming_the_flag():
    space = GluonSpace(roles=("ws", "pipelined"), stages=(4,))
    points = gluon_points([_case(128, causal=True)], space, smem_limit_bytes=H200_SMEM_BYTES)
    with pytest.raises(ValueError, match=r"--gluon-stages 4: every launch is pruned: shared"):
        check_not_all_pruned(points, space, {"--gluon-stages"})
    only_default = gluon_points(
        [_case(128, causal=True)], GluonSpace(roles=("ws",)), smem_limit_bytes=None
    )
    with pytest.raises(ValueError, match="--gluon-role ws: no candidate"):
        check_not_all_pruned(only_default, GluonSpace(roles=("ws",)), set())


def test_space_flags_are_checked():
    with pytest.raises(ValueError, match="--gluon-role wsx: valid roles are ws, "):
        GluonSpace(roles=("wsx",))
    with pytest.raises(ValueError, match="--gluon-block-n 48"):
        GluonSpace(block_n=(48,))
    with pytest.raises(ValueError, match="--gluon-stages 5: valid values are 1, 2, 3, 4"):
        GluonSpace(stages=(5,))


def test_why_gluon_cannot_run_a_device_or_a_case(monkeypatch):
    assert "no sm_90 GPU" in device_reason("cpu", None)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert device_reason("cuda", 0).startswith("TRITON_INTERPRET=1")
    assert "fp16 and bf16" in case_reason(_case(dtype="fp32"))
    assert "head_dim 96" in case_reason(_case(96))
    assert "--mode fwd" in case_reason(_case(mode="bwd"))
    assert case_reason(_case(256)) is None


@pytest.mark.parametrize(
    "flags, says",
    [(["--kernel", "gluon"], "--kernel gluon: no sm_90 GPU"),
     (["--kernel", "gluon", "--block-m", "64"], "--block-m: an axis of the `tl` kernel"),
     (["--gluon-stages", "2"], "--gluon-stages: an axis of the Gluon forward"),
     (["--kernel", "cute"], "--kernel cute: valid kernels are tl, gluon"),
     (["--kernel", "gluon", "--mode", "bwd"], "--mode bwd: --kernel gluon sweeps the Gluon"),
     (["--kernel", "gluon", "--gluon-role", "ws,x"], "--gluon-role x: valid roles")],
)  # fmt: skip
def test_cli_flag_errors_exit_2_with_the_reason(tmp_path, flags, says):
    result = CliRunner().invoke(app, ["sweep", "--device", "cpu", *flags, "--out",
                                      str(tmp_path / "o")])  # fmt: skip
    assert result.exit_code == 2, result.output
    assert says in " ".join(result.output.split()), result.output
    assert not (tmp_path / "o").exists()  # refused before the folder is claimed


# --- plan, rows, tuning cache, adapter ---------------------------------------------------


def test_the_plan_keeps_a_gluon_sweeps_fields_and_space(tmp_path):
    from fa_bench.run.runner import RunOptions

    points = gluon_points([_case(64)], GluonSpace(), smem_limit_bytes=H200_SMEM_BYTES)
    run = {"started": "t", "argv": [], "device": "cuda", "smem_limit_bytes": H200_SMEM_BYTES,
           "space": GluonSpace(stages=(2,)).to_dict(), "rules": True, "budget_minutes": None,
           "save_best": False, "min_gain_pct": 3.0, "compile_jobs": 0, "tuning_cache": None,
           "resumed": [], "kernel": "gluon"}  # fmt: skip
    write_plan(tmp_path, SweepPlan(run, RunOptions(device="cuda"), points))
    back = load_plan(tmp_path)
    assert [p.fields for p in back.points] == [p.fields for p in points]
    assert [p.id for p in back.points] == [p.id for p in points]
    # bools, not 0: the heuristic's three consumers and ws-nopp run without ping-pong
    assert back.points[0].fields["gluon_pingpong"] is False
    assert back.points[2].fields["gluon_pingpong"] is False


def _doc(points, tflops):
    rows = []
    for p, tf in zip(points, tflops, strict=True):
        rows.append(_row(p, status="ok", tflops=tf, latency_ms={"median": 1.0}))
    return {"run": {"smem_limit_bytes": H200_SMEM_BYTES}, "rows": rows,
            "cases": summarize_cases(rows)}  # fmt: skip


def test_rows_and_the_tuning_cache_carry_the_gluon_fields(tmp_path, monkeypatch):
    case = _case(128, causal=True)
    points = gluon_points([case], GluonSpace(roles=("ws", "ws-persist")), smem_limit_bytes=None)
    doc = _doc(points, [600.0, 650.0])
    row = doc["rows"][1]
    assert row["kernel"] == "gluon" and row["label"] == "gluon-ws-m64-n128-s3-persist"
    assert row["config"] == row_config(points[1].fields) and row["config"]["persistent"] is True
    assert doc["cases"][0]["kernel"] == "gluon"
    assert doc["cases"][0]["best_fields"] == points[1].fields
    cache = tmp_path / "tuning.json"
    # an older cache's `tl` entry of the same key (no "kernel") stays beside the Gluon one
    old = {"gpu": "cpu", "dtype": "bf16", "head_dim": 128, "causal": True, "mode": "fwd",
           "seqlen_bucket": "1025-4096", "config": {"block_m": 64, "block_n": 64,
                                                    "num_warps": 4, "num_stages": 3}}  # fmt: skip
    cache.write_text(json.dumps({"schema": tuning.SCHEMA, "entries": [old]}))
    entries, stay = best_entries(doc, "cpu", "sweep.json", "now", min_gain=0.03)
    assert stay == [] and entries[0]["kernel"] == "gluon"
    tuning.write_cache(cache, entries)
    kept = tuning.read_cache(cache)
    assert len(kept) == 2 and {tuning.entry_kernel(e) for e in kept} == {"tl", "gluon"}

    # the adapter lays both over the heuristic; the dispatch runs the tuned launch
    monkeypatch.setenv(tuning.ENV_VAR, str(cache))
    cfg, source = triton_impl.case_config(case, torch.device("cpu"))
    assert source == "tuning cache (fwd, gluon)" and cfg.forward == "auto"
    assert (cfg.block_m, cfg.gluon_persistent) == (64, True)
    monkeypatch.setattr(flash_gluon, "gluon_reason", lambda *a: None)
    monkeypatch.setattr(flash_gluon, "gluon_preferred", lambda *a: True)
    q, k, v = _qkv()
    assert flash_dispatch.gluon_choice(q, k, v, True, cfg) == gluon_fields.pinned(points[1].fields)
    named = triton_impl._forward_named("bm64-bn64-w4-s3", case, cfg, q, k, v)
    assert named == "gluon-ws-m64-n128-s3-persist"


def test_a_gain_below_the_minimum_keeps_the_gluon_heuristic(tmp_path):
    points = gluon_points(
        [_case(128, causal=True)], GluonSpace(roles=("ws", "ws-nopp")), smem_limit_bytes=None
    )
    entries, stay = best_entries(_doc(points, [600.0, 606.0]), "H200", "s", "now", 0.03)
    assert entries == [] and stay == [("H200", "bf16", 128, True, "fwd", "1025-4096", "gluon")]


def test_a_sweep_point_forces_the_gluon_kernel():
    fields = gluon_fields.fields_of(candidate_configs(128)["ws-nopp"])
    cfg, source = triton_impl.case_config(_case(128, causal=True), torch.device("cpu"), fields)
    assert (cfg.forward, cfg.gluon_pingpong, source) == ("gluon", False, "sweep")


def test_a_cache_entry_with_bad_gluon_fields_is_refused(tmp_path):
    bad = {"gpu": "g", "dtype": "bf16", "head_dim": 128, "causal": False, "mode": "bwd",
           "seqlen_bucket": "1-256", "kernel": "gluon", "config": {"gluon_stages": 2}}  # fmt: skip
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"schema": tuning.SCHEMA, "entries": [bad]}))
    with pytest.raises(tuning.TuningCacheError, match="gluon: mode fwd only"):
        tuning.read_cache(path)
    bad.update(mode="fwd", config={"gluon_stages": 9})
    path.write_text(json.dumps({"schema": tuning.SCHEMA, "entries": [bad]}))
    with pytest.raises(tuning.TuningCacheError, match="gluon_stages must be"):
        tuning.read_cache(path)
    bad.update(config={"block_m": 64})  # a tl field in a Gluon entry
    path.write_text(json.dumps({"schema": tuning.SCHEMA, "entries": [bad]}))
    with pytest.raises(tuning.TuningCacheError, match="takes only gluon_variant"):
        tuning.read_cache(path)


def test_the_report_shows_the_gluon_launches():
    from fa_bench.reports.sweep_figures import sweep_section

    space = GluonSpace(roles=("ws", "ws-persist", "pipelined"))
    points = gluon_points([_case(128, causal=True)], space, smem_limit_bytes=None)
    section = sweep_section(_doc(points, [600.0, 650.0, 500.0]))[0]
    assert section["rules"] == []  # the rules of thumb pick `tl` tiles
    assert [t["label"] for t in section["top"]][:2] == [points[1].label, points[0].label]
    text = [c for row in section["heatmap"].data[0].text for c in row]
    assert any("ws-m64-n128-s3-persist" in c for c in text)
    assert "Gluon launches" in section["heatmap"].layout.title.text


# --- on the H200 ------------------------------------------------------------------------

needs_sm90 = pytest.mark.skipif(
    not torch.cuda.is_available()
    or os.environ.get("TRITON_INTERPRET") == "1"
    or torch.cuda.get_device_capability() != (9, 0),
    reason="needs an sm_90 GPU",
)


@pytest.mark.gpu
@needs_sm90
def test_gpu_a_two_point_gluon_sweep_saves_and_run_times_the_tuned_launch(tmp_path: Path):
    cache, out, run_out = tmp_path / "tuning.json", tmp_path / "sweep", tmp_path / "run"
    shape = ["-s", "standard", "--dtype", "bf16", "--head-dim", "128", "--seqlen", "4096",
             "--no-causal", "--max-time", "0.3", "--warmup", "100"]  # fmt: skip
    result = CliRunner().invoke(app, ["sweep", *shape, "--kernel", "gluon", "--gluon-role",
                                      "ws-persist", "--save-best", "--min-gain", "0",
                                      "--tuning-cache", str(cache), "--out", str(out)])  # fmt: skip
    assert result.exit_code == 0, result.output
    doc = json.loads((out / "sweep.json").read_text())
    assert doc["run"]["points"] == 2 and doc["run"]["kernel"] == doc["space"]["kernel"] == "gluon"
    for row in doc["rows"]:
        assert row["status"] == "ok" and row["accuracy_passed"] is True, row
        assert row["kernel"] == "gluon" and f"triton:{row['label']} (sweep)" in row["backend"]
    best = doc["cases"][0]["best"]
    (entry,) = json.loads(cache.read_text())["entries"]
    assert entry["kernel"] == "gluon" and label(entry["config"]) == best
    run = CliRunner().invoke(app, ["run", *shape, "-i", "triton", "--mode", "fwd",
                                   "--tuning-cache", str(cache), "--no-telemetry",
                                   "--no-report", "--out", str(run_out)])  # fmt: skip
    assert run.exit_code == 0, run.output
    (rec,) = json.loads((run_out / "results.json").read_text())["cases"]
    assert rec["backend"] == f"triton:{best} (tuning cache (gluon))", rec["backend"]


@pytest.mark.slow
def test_cpu_gluon_points_are_forced_gluon_never_a_silent_tl_run(tmp_path, monkeypatch):
    """With the device check bypassed, the interpreter's worker runs each point: every row
    is an error naming why the Gluon kernel cannot run (no point falls back to `tl`)."""
    from fa_bench.commands import sweep_gluon

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(sweep_gluon, "check_gluon_device", lambda *a: None)
    out = tmp_path / "sweep"
    result = CliRunner().invoke(app, ["sweep", "--device", "cpu", "--kernel", "gluon",
                                      "-s", "smoke", "--dtype", "fp16", "--seqlen", "128",
                                      "--head-dim", "64", "--batch", "1", "--heads", "2",
                                      "--kv-heads", "1", "--no-causal", "--gluon-role", "ws-nopp",
                                      "--max-time", "0.05", "--out", str(out)])  # fmt: skip
    assert result.exit_code == 0, result.output
    doc = json.loads((out / "sweep.json").read_text())
    assert doc["space"]["kernel"] == doc["run"]["kernel"] == "gluon" and len(doc["rows"]) == 2
    for row in doc["rows"]:
        assert row["kernel"] == "gluon" and row["status"] == "error", row
        assert "TRITON_INTERPRET=1" in row["error"], row["error"]
    assert (out / "sweep.html").exists()
