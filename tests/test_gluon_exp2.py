"""The Gluon softmax's exp2 split (kernels/gluon_exp2.py, GluonConfig.exp2_emu; issue 21).

On a CPU: the PTX that exp2_split emits, evaluated instruction by instruction in numpy
fp32 (the polynomial's accuracy, −inf and the clamp, the fp16/bf16 rounding of P), a
flash-attention forward with that P against fa_bench.run.accuracy's rule, the config's
field and labels, and tools/gpu/gluon_d64.py's launches and report. Compiled for sm_90
(slow, with a triton 3.6 installed aside) and run on an H200 (gpu) where those exist.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import json
import math
import os
import pickle
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from fa_bench.case import Case
from fa_bench.kernels import gluon_exp2
from fa_bench.kernels.flash_gluon import (
    EXP2_EMU,
    SMEM_BYTES,
    GluonConfig,
    gluon_config,
    version_reason,
)
from fa_bench.run.accuracy import check_accuracy

ROOT = Path(__file__).resolve().parents[1]

# --- the emitted PTX, run in numpy -------------------------------------------------------


def _f32(bits: str) -> np.float32:
    """A PTX fp32 immediate (0fXXXXXXXX) as a numpy float32."""
    return np.array([int(bits[2:], 16)], dtype=np.uint32).view(np.float32)[0]


def _operand(regs: dict, text: str) -> np.ndarray:
    text = text.strip()
    if text.startswith("0f"):
        return np.full_like(regs["$in"], _f32(text), dtype=np.float32).view(np.uint32)
    if re.fullmatch(r"-?\d+", text):
        return np.full(regs["$in"].shape, int(text), dtype=np.int64).astype(np.uint32)
    return regs[text]


def _as_f(x: np.ndarray) -> np.ndarray:
    return x.view(np.float32)


def _fma(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """fp32 fma: the product of two fp32 values is exact in float64, one rounding after."""
    out = _as_f(a).astype(np.float64) * _as_f(b).astype(np.float64) + _as_f(c)
    return out.astype(np.float32).view(np.uint32)


def run_ptx(asm: str, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """Evaluate split_asm's block on fp32 inputs (one array per packed element): the
    handful of PTX instructions it uses, each in fp32 (ex2.approx as exactly rounded)."""
    pack = len(inputs)
    regs: dict[str, np.ndarray] = {"$in": inputs[0]}
    for i, x in enumerate(inputs):
        regs[f"${pack + i}"] = np.asarray(x, dtype=np.float32).view(np.uint32)
    body = asm.strip()
    assert body.startswith("{") and body.endswith("}"), asm
    for stmt in body[1:-1].split(";"):
        stmt = stmt.strip()
        if not stmt or stmt.startswith(".reg"):
            continue
        op, args = stmt.split(None, 1)
        dst, *srcs = [a.strip() for a in args.split(",")]
        vals = [_operand(regs, s) for s in srcs]
        with np.errstate(all="ignore"):
            if op == "ex2.approx.ftz.f32":
                res = np.exp2(_as_f(vals[0]).astype(np.float64)).astype(np.float32)
            elif op == "max.ftz.f32":
                res = np.fmax(_as_f(vals[0]), _as_f(vals[1]))
            elif op == "add.rn.f32":
                res = _as_f(vals[0]) + _as_f(vals[1])
            elif op == "sub.rn.f32":
                res = _as_f(vals[0]) - _as_f(vals[1])
            elif op == "fma.rn.f32":
                regs[dst] = _fma(*vals)
                continue
            elif op == "shl.b32":
                regs[dst] = vals[0] << vals[1]
                continue
            elif op == "add.s32":
                regs[dst] = vals[0] + vals[1]
                continue
            else:
                raise AssertionError(f"instruction {op!r} not modelled")
        regs[dst] = np.asarray(res, dtype=np.float32).view(np.uint32)
    return [regs[f"${i}"].view(np.float32) for i in range(pack)]


def split_exp2(x: np.ndarray, emu: int) -> np.ndarray:
    """2^x as exp2_split(x, emu) computes it: the flat elements in groups of `emu`
    (a thread's consecutive registers), the last of each group emulated."""
    flat = np.asarray(x, dtype=np.float32).reshape(-1, emu)
    outs = run_ptx(gluon_exp2.split_asm(emu), [flat[:, i].copy() for i in range(emu)])
    return np.stack(outs, axis=1).reshape(np.shape(x))


def emulated(x: np.ndarray) -> np.ndarray:
    """Only the emulated lane: pack 2's second element."""
    x = np.asarray(x, dtype=np.float32)
    return run_ptx(gluon_exp2.split_asm(2), [np.zeros_like(x), x])[1]


def test_the_polynomial_is_within_its_bound_on_the_softmax_range():
    x = np.linspace(-126.0, 0.0, 400_001, dtype=np.float32)
    got = emulated(x).astype(np.float64)
    rel = np.abs(got / np.exp2(x.astype(np.float64)) - 1.0)
    assert rel.max() <= gluon_exp2.MAX_REL_ERR, rel.max()
    # the bound is tight (a fifth of fp16's half ulp), not a loose number
    assert rel.max() > 0.8 * gluon_exp2.MAX_REL_ERR


def test_exact_where_the_softmax_needs_it():
    # 2^0 = 1 exactly: the row maximum's p is 1, as with the MUFU
    assert emulated(np.array([0.0], np.float32))[0] == 1.0
    # integers are exact (f = 0), masked scores (−inf) and the clamp give exactly 0
    ints = np.arange(-100, 1, dtype=np.float32)
    assert np.array_equal(emulated(ints), np.exp2(ints))
    low = np.array([-np.inf, -1e30, -200.0, -127.0], np.float32)
    assert np.array_equal(emulated(low), np.zeros(4, np.float32))
    # just above the clamp: tiny, finite, never negative or NaN
    near = np.linspace(-127.0, -120.0, 1001, dtype=np.float32)
    out = emulated(near)
    assert np.isfinite(out).all() and (out >= 0).all() and out.max() < 2.0**-119


@pytest.mark.parametrize("emu", [2, 4, 8])
def test_split_emulates_one_element_in_emu(emu):
    rng = np.random.default_rng(emu)
    x = rng.uniform(-20.0, 0.0, size=(64, 8 * emu)).astype(np.float32)
    got = split_exp2(x, emu).reshape(-1, emu)
    exact = np.exp2(x.astype(np.float64)).astype(np.float32).reshape(-1, emu)
    # the MUFU lanes are untouched; the last lane of each group is the polynomial's
    assert np.array_equal(got[:, :-1], exact[:, :-1])
    lane = got[:, -1].astype(np.float64) / exact[:, -1] - 1.0
    assert 0 < np.abs(lane).max() <= gluon_exp2.MAX_REL_ERR
    asm = gluon_exp2.split_asm(emu)
    assert asm.count("ex2.approx.ftz.f32") == emu - 1 and asm.count("fma.rn.f32") == 3
    assert gluon_exp2.split_constraints(emu) == ",".join(["=r"] * emu + ["r"] * emu)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_p_rounded_to_the_input_dtype_moves_at_most_one_ulp(dtype):
    x = np.linspace(-24.0, 0.0, 200_001, dtype=np.float32)
    ours = torch.from_numpy(emulated(x)).to(dtype).float()
    exact = torch.from_numpy(np.exp2(x.astype(np.float64))).to(dtype).float()
    mant = {torch.float16: 10, torch.bfloat16: 7}[dtype]
    ulp = exact.abs() * 2.0**-mant  # the dtype's ulp at that magnitude (normal range)
    steps = ((ours - exact).abs() / ulp.clamp_min(1e-30))[exact > 2.0**-14]
    assert steps.max() <= 1.0 + 1e-6
    # and only a small share of them moves at all
    assert (steps > 0).float().mean() < {torch.float16: 0.15, torch.bfloat16: 0.02}[dtype]


def _flash_forward(q, k, v, causal, emu, exp2=None):
    """Our kernels' forward arithmetic on a CPU: 128-key blocks, log2-domain online
    softmax in fp32, P rounded to the input dtype for PV, acc in fp32, exp2 as
    exp2_split(emu) computes it (or `exp2`)."""
    scale = 1.0 / math.sqrt(q.shape[-1]) * 1.4426950408889634
    qf, kf, vf = q.float(), k.float(), v.float()
    sq, sk = q.shape[2], k.shape[2]
    m = torch.full(q.shape[:3], -math.inf)
    l_sum = torch.zeros(q.shape[:3])
    acc = torch.zeros((*q.shape[:3], v.shape[-1]))
    rows = torch.arange(sq)[:, None]
    for j0 in range(0, sk, 128):
        s = qf @ kf[:, :, j0 : j0 + 128].transpose(-1, -2)
        if causal:
            cols = torch.arange(j0, min(j0 + 128, sk))[None, :]
            s = s.masked_fill(cols > rows + (sk - sq), -math.inf)
        m_new = torch.maximum(m, s.amax(-1))
        m_sc = torch.where(m_new == -math.inf, 0.0, m_new * scale)
        arg = (s * scale - m_sc[..., None]).numpy()
        p = torch.from_numpy(exp2(arg) if exp2 else split_exp2(arg, emu))
        alpha = torch.exp2(m * scale - m_sc)
        l_sum = l_sum * alpha + p.sum(-1)
        acc = acc * alpha[..., None] + p.to(q.dtype).float() @ vf[:, :, j0 : j0 + 128]
        m = m_new
    return (acc / l_sum.clamp_min(1e-30)[..., None]).to(q.dtype)


def _case(dtype, sq, sk, causal):
    name = {torch.float16: "fp16", torch.bfloat16: "bf16"}[dtype]
    return Case(impl="triton", mode="fwd", dtype=name, batch=1, heads_q=2, heads_kv=2,
                seqlen_q=sq, seqlen_k=sk, head_dim=64, causal=causal)  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("emu", [2, 8])
def test_a_forward_with_the_split_passes_the_accuracy_rule(dtype, emu):
    gen = torch.Generator().manual_seed(emu)
    sq, sk = 130, 260  # three key blocks, the last one partial
    q, k, v = (torch.randn(1, 2, n, 64, generator=gen).to(dtype) for n in (sq, sk, sk))
    for causal in (False, True):
        o = _flash_forward(q, k, v, causal, emu)
        report = check_accuracy(_case(dtype, sq, sk, causal), q, k, v, o)
        assert report["passed"], report


def test_the_rule_catches_a_worse_exp2():
    # the same forward with a 2 % error in every exponential fails: the check can fail
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 256, 64, generator=gen).to(torch.float16) for _ in range(3))

    def coarse(x):
        rng = np.random.default_rng(1)
        return (np.exp2(x) * (1 + 0.02 * rng.choice([-1.0, 1.0], size=x.shape))).astype(np.float32)

    o = _flash_forward(q, k, v, False, 0, exp2=coarse)
    assert not check_accuracy(_case(torch.float16, 256, 256, False), q, k, v, o)["passed"]


# --- the config field ---------------------------------------------------------------------


def test_exp2_emu_field_values_and_labels():
    assert EXP2_EMU == gluon_exp2.EMU_CHOICES
    assert GluonConfig().exp2_emu == 0
    for bad in (1, 3, 16, -2, True, 2.0, "4"):
        with pytest.raises(ValueError, match=rf"GluonConfig.exp2_emu={bad!r}: expected one of"):
            GluonConfig(exp2_emu=bad)
    with pytest.raises(ValueError, match=r"emu=0: expected one of \(2, 4, 8\)"):
        gluon_exp2.split_asm(0)
    # 0 keeps every existing label; the split is a suffix on every kind of launch
    ws64 = GluonConfig(stages=4)
    assert ws64.label() == "ws-m64-n128-s4"
    assert dataclasses.replace(ws64, exp2_emu=8).label() == "ws-m64-n128-s4-e8"
    pq2 = dataclasses.replace(gluon_config(128), exp2_emu=4)
    assert pq2.label() == "ws-m64-n128-s2-q2-persist-e4"
    pipe = dataclasses.replace(gluon_config(64, causal=True), exp2_emu=2)
    assert pipe.label() == "pipelined-m128-n128-s2-w8-e2"


def test_the_softmax_code_carries_both_knobs():
    for emu in EXP2_EMU:
        for tree in (False, True):
            cfg = GluonConfig(exp2_emu=emu, tree_reduce=tree)
            code = cfg.softmax_code()
            # the kernels decode it with gluon_exp2's constexpr functions
            assert gluon_exp2.softmax_emu(code) == emu
            assert gluon_exp2.softmax_tree(code) is tree
            assert cfg.label().endswith("-t") is tree
            assert (f"-e{emu}" in cfg.label()) is bool(emu)
    assert GluonConfig().softmax_code() == 0  # the plain softmax, as before the fields
    # a compile that leaves SOFTMAX out passes None: the plain softmax
    assert gluon_exp2.softmax_emu(None) == 0 and gluon_exp2.softmax_tree(None) is False
    assert GluonConfig(exp2_emu=8, tree_reduce=True).label() == "ws-m64-n128-s2-e8-t"
    with pytest.raises(ValueError, match=r"GluonConfig.tree_reduce=1: expected a bool"):
        GluonConfig(tree_reduce=1)


def test_tree_levels_fold_a_row_to_the_quad():
    # a thread holds column pairs of n / 8 groups of 8: after the pair, log2(n / 8) halvings
    # leave [M, 4] (the 4 threads of a quad), reduced across threads by two shuffles
    for n, levels in ((32, 2), (64, 3), (128, 4), (256, 5)):
        assert gluon_exp2.tree_levels(n) == levels
        assert n // 2 // 2**levels == 4


# --- tools/gpu/gluon_d64.py ---------------------------------------------------------------


def _tool(name: str):
    path = ROOT / "tools" / "gpu" / f"{name}.py"
    sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # as a script's module is: its classes pickle by name
    spec.loader.exec_module(module)
    return module


def test_the_study_launches_are_valid_and_distinct():
    tool = _tool("gluon_d64")
    cands = tool.candidates()
    assert set(cands) == {(64, False), (64, True), (128, False), (128, True)}
    for (head_dim, causal), roles in cands.items():
        assert roles["heuristic"] == gluon_config(head_dim, causal)
        labels = [c.label() for c in roles.values()]
        assert len(set(labels)) == len(labels)
        assert all(c.smem_bytes(head_dim) <= SMEM_BYTES for c in roles.values())
        assert {c.exp2_emu for c in roles.values()} >= {0, 8}
        assert {c.tree_reduce for c in roles.values()} == {False, True}
    d64 = cands[(64, False)]
    assert {"ws", "pq2", "pq2-e8-t", "ws-e2", "ws-e4", "c3-n64", "e8-t"} <= set(d64)
    assert d64["heuristic"].consumers == 3 and d64["ws"].consumers == 2
    # the timing diagnostic: no exponentials (gluon_exp2 decodes it to EMU -1: x itself)
    diag = d64["diag-ws-noexp2"]
    assert diag.label() == "ws-m64-n128-s4-noexp2" and diag.exp2_emu == 0
    assert gluon_exp2.softmax_emu(diag.softmax_code()) == -1
    assert pickle.loads(pickle.dumps(diag)) == diag  # the compile workers unpickle it
    assert not any(r.startswith("diag") for key, roles in cands.items() if key != (64, False)
                   for r in roles)  # fmt: skip
    # the order starts with the shapes the heuristic decision needs
    assert tool.ORDER[:2] == (("bf16", 64, False), ("fp16", 64, False))


def test_the_report_names_launches_past_the_target_only_where_both_lengths_clear_it():
    report = _tool("gluon_d64_report")
    rows = [{"kind": "env", "device": "dev", "torch": "t", "triton": "3.6.0"}]
    key = dict(dtype="bf16", head_dim=64, causal=False)
    for role, label, t4, t16 in (
        ("cudnn", "sdpa-cudnn", 100.0, 100.0),
        ("heuristic", "ws", 99.0, 101.0),
        ("e8", "ws-e8", 103.0, 102.5),
        ("e4", "ws-e4", 103.0, 101.0),
        ("e2", "ws-e2", 110.0, 110.0),
        ("diag-noexp2", "ws-noexp2", 120.0, 120.0),
    ):
        if role != "cudnn":
            passed = role not in ("e2", "diag-noexp2")  # failed or unchecked: never a winner
            error = "diagnostic: not checked" if role.startswith("diag") else "wrong"
            rows.append(dict(kind="check", role=role, label=label, passed=passed, error=error,
                             **key))  # fmt: skip
        for n, t in ((4096, t4), (16384, t16)):
            rows.append(dict(kind="bench", role=role, label=label, n=n, tflops=t, **key))
    text = report.markdown(rows, 1.02)
    assert "| e8 | ws-e8 | pass | 103.0 | 102.5 | 1.030 | 1.025 | 1.040 | 1.015 |" in text
    assert "| diag-noexp2 | ws-noexp2 | diag | 120.0 |" in text and "| FAIL wrong |" in text
    winners = report.winners(report.shape_tables(rows), 1.02)
    assert winners == ["bf16 d64 non-causal: e8 (ws-e8) 1.030 / 1.025"]


def _stand_in_forward(q, k, v, causal, scale, cfg=None, factor=1.0):
    """The float64 reference in the Gluon forward's place (o, lse2): the script's plumbing
    runs on a CPU; `factor` spoils o for the negative case."""
    from fa_bench.run.accuracy import reference_attention

    group = q.shape[1] // k.shape[1]
    kk, vv = (t.repeat_interleave(group, dim=1) for t in (k, v))
    ref = reference_attention(q.double(), kk.double(), vv.double(), causal=causal, scale=scale)
    o = (ref.o * factor).to(q.dtype)
    lse2 = torch.zeros(q.shape[:3])
    if causal and q.shape[2] > k.shape[2]:  # rows that see no key: +inf, as the kernels
        lse2[:, :, : q.shape[2] - k.shape[2]] = math.inf
    return o, lse2


@pytest.mark.parametrize("spoil", [False, True])
def test_the_script_checks_then_times_only_passing_launches(monkeypatch, spoil):
    import fa_bench.kernels.flash_gluon as fg

    tool = _tool("gluon_d64")
    check = importlib.import_module("gluon_check")  # as the script imports it

    def cpu_inputs(shape, dtype, head_dim, seed=0):
        b, hq, hk, sq, sk, _ = shape
        gen = torch.Generator().manual_seed(seed)
        return tuple(torch.randn(b, h, n, head_dim, generator=gen).to(dtype)
                     for h, n in ((hq, sq), (hk, sk), (hk, sk)))  # fmt: skip

    def forward(q, k, v, causal, scale, cfg):
        # the split launches stand for a wrong kernel in the spoiled run
        return _stand_in_forward(
            q, k, v, causal, scale, factor=1.05 if spoil and cfg.exp2_emu else 1
        )

    timed = []

    def fake_bench(fn, n, head_dim, dtype_name, causal):
        fn()  # the cuDNN call raises on a CPU: its row records the error
        timed.append(n)
        return dict(ms=1.0)

    monkeypatch.setattr(tool, "DEVICE", "cpu")
    monkeypatch.setattr(tool, "CHECK_SHAPES", ((1, 4, 2, 40, 24, False),))
    monkeypatch.setattr(tool, "BENCH_NS", (32,))
    monkeypatch.setattr(tool, "TOKENS", 64)
    monkeypatch.setattr(tool, "bench", fake_bench)
    monkeypatch.setattr(check, "_inputs", cpu_inputs)
    monkeypatch.setattr(fg, "gluon_forward", forward)
    rows = []
    roles = tool.candidates()[(64, True)]
    tool.run_shape(rows.append, roles, "fp16", 64, True)
    checks = {r["role"]: r["passed"] for r in rows if r["kind"] == "check"}
    assert checks == {role: not (spoil and cfg.exp2_emu) for role, cfg in roles.items()}
    benched = [r["role"] for r in rows if r["kind"] == "bench"]
    assert benched == ["cudnn"] + [role for role, ok in checks.items() if ok]
    assert "error" in rows[len(checks)] and rows[len(checks)]["role"] == "cudnn"


def test_the_script_writes_its_tables_and_stops_at_its_budget(monkeypatch, tmp_path):
    import fa_bench.kernels.flash_gluon as fg

    tool = _tool("gluon_d64")
    check = importlib.import_module("gluon_check")
    shapes = []

    def fake_run_shape(emit, roles, dtype, head_dim, causal):
        shapes.append((dtype, head_dim, causal))
        for role, cfg in roles.items():
            emit(dict(kind="check", role=role, label=cfg.label(), passed=True, dtype=dtype,
                      head_dim=head_dim, causal=causal))  # fmt: skip
        tool.time.sleep(0.05)

    monkeypatch.setenv("OUT", str(tmp_path))
    monkeypatch.setattr(tool, "run_shape", fake_run_shape)
    monkeypatch.setattr(check, "_inputs", None)  # never reached
    monkeypatch.setattr(fg, "gluon_forward", None)
    assert tool.main(["--workers", "0", "--budget", "0.01", "--only", "0,1,2"]) == 0
    assert shapes == [("bf16", 64, False)]  # the budget stops the next shapes
    text = (tmp_path / "gluon_d64.md").read_text()
    assert (
        "## bf16 d64 non-causal" in text and "| pq2-e8-t | ws-m64-n128-s4-q2-persist-e8-t" in text
    )
    assert "skipped (budget): fp16 d64 causal=False" in text
    rows = [json.loads(line) for line in (tmp_path / "gluon_d64.jsonl").read_text().splitlines()]
    assert rows[0]["kind"] == "env" and rows[-1]["kind"] == "skipped"
    # --roles keeps those and the heuristic's (the baseline)
    shapes.clear()
    assert tool.main(["--workers", "0", "--only", "3", "--roles", "e8,c3"]) == 0
    text = (tmp_path / "gluon_d64.md").read_text()
    assert shapes == [("fp16", 64, True)] and "| e8 | pipelined-m128-n128-s2-w8-e8 |" in text
    assert "| heuristic |" in text and "| t |" not in text


# --- compiled for sm_90 (triton 3.6 aside), and on the H200 -------------------------------


@pytest.mark.slow
def test_the_split_launches_compile_for_sm90_without_spills():
    import triton

    path = (
        ""
        if version_reason(triton.__version__) is None
        else os.environ.get("GLUON_TRITON_PATH", "/tmp/tri36")
    )
    if path and not Path(path, "triton", "__init__.py").exists():
        pytest.skip("no triton 3.6 here: set GLUON_TRITON_PATH to one installed aside")
    env = dict(os.environ, PYTHONPATH=path)
    env.pop("TRITON_INTERPRET", None)
    out = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "gpu" / "gluon_d64_compile.py"), "--dtypes", "bf16"],
        capture_output=True, text=True, env=env, timeout=1200,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    # every split launch emits its emulated lanes: 1 shl by 23 per EMU elements
    for line in out.stdout.splitlines():
        if re.search(r"-e\d ", line):
            assert int(re.search(r"shl23 (\d+)", line).group(1)) > 0, line


needs_sm90 = pytest.mark.skipif(
    not torch.cuda.is_available()
    or os.environ.get("TRITON_INTERPRET") == "1"
    or torch.cuda.get_device_capability() != (9, 0),
    reason="needs an sm_90 GPU",
)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize(
    ("head_dim", "emu", "tree"), [(64, 2, False), (64, 8, True), (64, 0, True), (128, 8, True)]
)
def test_split_launches_pass_the_rule_on_the_h200(head_dim, emu, tree):
    # the heuristic's launch with the split, both dtypes and masks; GQA, odd lengths and
    # causal rows without keys (tools/gpu/gluon_d64.py checks every launch it times too)
    check = _tool("gluon_check")
    for causal in (False, True):
        cfg = dataclasses.replace(gluon_config(head_dim, causal), exp2_emu=emu, tree_reduce=tree)
        for dtype in ("bf16", "fp16"):
            for shape in ((2, 4, 1, 1000, 1000, False), (1, 4, 2, 1100, 600, False)):
                row = check.check_one(cfg, shape, dtype, head_dim, causal, False)
                assert row["passed"], (cfg.label(), row)
