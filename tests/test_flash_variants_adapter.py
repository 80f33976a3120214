"""The `triton` adapter on variant cases (issue 19): the config a variant runs with, a
packed case's call through flash_attention_varlen on views of the runner's (1, H, T, D)
tensors, and the variants suite's CPU recipe (docs/suites.md) with every `triton` case
`ok` and accurate.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

pytest.importorskip("triton")

from fa_bench import registry
from fa_bench.case import Case
from fa_bench.kernels import triton_impl
from fa_bench.kernels.flash_config import default_config
from fa_bench.run.variant_reference import case_reference

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


def case_of(mode: str = "fwd", **over: object) -> Case:
    fields: dict = dict(impl="triton", mode=mode, dtype="fp32", batch=2, heads_q=4, heads_kv=2,
                        seqlen_q=24, seqlen_k=24, head_dim=16, causal=True)  # fmt: skip
    fields.update(over)
    return Case(**fields)


def test_case_config_gives_variants_the_dense_config_of_their_shape(monkeypatch):
    """On an sm_90 heuristic (no tuning cache): a window, ALiBi or softcap case gets the
    dense config of its shape; a packed case the one of its longest document."""
    monkeypatch.setenv("FA_BENCH_TUNING_CACHE", "off")
    monkeypatch.setattr(
        triton_impl, "heuristic_config",
        lambda d, dtype, causal, device, seqlen: default_config(d, dtype, causal, (9, 0), seqlen),
    )  # fmt: skip
    big = dict(dtype="bf16", head_dim=128, seqlen_q=8192, seqlen_k=8192)
    cpu = torch.device("cpu")
    dense, _ = triton_impl.case_config(case_of(**big), cpu)
    assert dense == default_config(128, torch.bfloat16, True, (9, 0), 8192)
    for over in (dict(window_left=4096), dict(alibi=True), dict(softcap=50.0)):
        assert triton_impl.case_config(case_of(**big, **over), cpu)[0] == dense, over
    # a packed batch whose longest document is 1000 tokens: the short-causal tiles (<= 1k)
    packed = dict(big, varlen="list:1000,100", batch=2, seqlen_q=1000, seqlen_k=1000)
    short = default_config(128, torch.bfloat16, True, (9, 0), 1000)
    assert short != dense and triton_impl.case_config(case_of(**packed), cpu)[0] == short


@pytest.mark.skipif(not INTERPRETED, reason="needs TRITON_INTERPRET=1 (CPU runs)")
def test_packed_case_runs_on_views_and_grads_reach_the_runner_tensors():
    """A packed case's inputs are (1, H, T, D); the adapter hands flash_attention_varlen
    (T, H, D) views and returns a (1, H, T, D) view: the output matches the float64
    reference document by document and the gradients land on the runner's tensors."""
    case = case_of("fwd_bwd", varlen="list:5,17,1,9", batch=4, seqlen_q=17, seqlen_k=17,
                   window_left=6, alibi=True, softcap=3.0)  # fmt: skip
    t = case.total_tokens
    g = torch.Generator().manual_seed(0)
    q = torch.randn((1, 4, t, 16), generator=g).requires_grad_()
    k = torch.randn((1, 2, t, 16), generator=g).requires_grad_()
    v = torch.randn((1, 2, t, 16), generator=g).requires_grad_()
    prepared = registry.get("triton").builder(case, q, k, v)
    o = prepared.fn(q, k, v)
    assert o.shape == q.shape and o._base is not None  # a view, not a copy
    do = torch.randn(o.shape, generator=g)
    o.backward(do)
    ref = case_reference(case, *(x.detach().double() for x in (q, k, v)), do.double())
    torch.testing.assert_close(o.detach().double(), ref.o, atol=2e-6, rtol=1e-5)
    for ours, want in ((q.grad, ref.dq), (k.grad, ref.dk), (v.grad, ref.dv)):
        torch.testing.assert_close(ours.double(), want, atol=5e-6, rtol=1e-5)


@pytest.mark.slow
@pytest.mark.skipif(not INTERPRETED, reason="needs TRITON_INTERPRET=1 (CPU runs)")
def test_the_variants_suites_cpu_recipe_runs_every_triton_case_ok(tmp_path: Path) -> None:
    """docs/suites.md's CPU command for `triton` alone: all 32 cases (window, ALiBi,
    softcap, packed, and their dense controls, fwd and bwd) ok and accurate."""
    from typer.testing import CliRunner

    import fa_bench.cli as cli

    out = tmp_path / "run"
    args = ["run", "-s", "variants", "--device", "cpu", "--dtype", "fp32", "--impl", "triton",
            "--seqlen", "64", "--batch", "2", "--heads", "4", "--kv-heads", "2",
            "--head-dim", "32", "--window", "16,0", "--window", "none", "--softcap", "0,30",
            "--varlen", "uniform:8-64", "--varlen", "none", "--max-time", "0.05",
            "--min-samples", "3", "--out", str(out), "--no-report"]  # fmt: skip
    result = CliRunner().invoke(cli.app, args)
    assert result.exit_code == 0, result.output
    records = json.loads((out / "results.json").read_text())["cases"]
    assert len(records) == 32
    for r in records:
        assert r["status"] == "ok", (r["id"], r.get("error"))
        assert r["accuracy"]["passed"], (r["id"], r["accuracy"])
    # per mode: 2 windows × 2 softcaps × 2 varlens × ALiBi on/off, one of them dense
    assert sum(Case.from_dict(r).is_variant for r in records) == 30
