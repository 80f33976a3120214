"""Issue 19's window, ALiBi and softcap in the Gluon backward (kernels/flash_gluon_bwd_var.py),
on a GPU: gradients through `flash_attention`'s default backward against the float64
reference under the project's accuracy rule (fa_bench.run.accuracy), with the Gluon kernel
asserted to have run (the two-kernel one where the Gluon launch spills,
flash_gluon_bwd_varhost._SPILLS). Every combination, both dtypes, head_dim 64 and 128, causal and
not, GQA, odd lengths, Sq != Sk, rows that see no key, (H,) and (B, H) slopes.

`-m gpu` on an sm_90 machine with triton 3.6; skipped elsewhere.
"""

from __future__ import annotations

import pytest
import torch
from gluon_bwd_helpers import needs_cuda

pytestmark = [pytest.mark.gpu, needs_cuda]

DTYPES = [torch.bfloat16, torch.float16]


def _gluon_ok() -> bool:
    from fa_bench.kernels import flash_gluon

    return torch.cuda.get_device_capability() == (9, 0) and not flash_gluon.gluon_reason(
        *(torch.empty(1, 1, 64, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3)), False
    )


def _case(dtype, *, b=1, hq=4, hk=2, sq=1000, sk=1000, d=128, causal=True, window=(-1, -1),
          alibi=None, softcap=0.0, monkeypatch=None) -> None:  # fmt: skip
    from fa_bench.case import alibi_slopes
    from fa_bench.kernels import flash_attention, flash_gluon_bwd
    from fa_bench.run.accuracy import _tensor_report
    from fa_bench.run.variant_reference import variant_attention

    if not _gluon_ok():
        pytest.skip("the Gluon backward needs sm_90 and triton 3.6")
    g = torch.Generator(device="cuda").manual_seed(sq + sk + d)

    def rand(h, s):
        return torch.randn((b, h, s, d), generator=g, device="cuda").to(dtype).requires_grad_()

    q, k, v = rand(hq, sq), rand(hk, sk), rand(hk, sk)
    slopes = None
    if alibi is not None:
        one = torch.tensor(alibi_slopes(hq), dtype=torch.float32, device="cuda")
        # (B, H): each batch its own slopes, so a wrong batch stride shows
        slopes = one if alibi == "h" else torch.stack([one * (1 + i) for i in range(b)])
    runs = []
    real = flash_gluon_bwd.gluon_backward

    def spy(*a, **kw):
        runs.append(kw.get("variant"))
        return real(*a, **kw)

    monkeypatch.setattr(flash_gluon_bwd, "gluon_backward", spy)
    kw = dict(causal=causal, window=window, softcap=softcap)
    o = flash_attention(q, k, v, alibi_slopes=slopes, **kw)
    do = torch.randn_like(o)
    grads = torch.autograd.grad(o, (q, k, v), do)
    # the Gluon kernel, but where its launch spills (flash_gluon_bwd_varhost._SPILLS):
    # there the two-kernel backward, which the same rule checks
    from fa_bench.kernels.flash_gluon_bwd_varhost import variant_reason
    from fa_bench.kernels.flash_validate import make_variant

    var = make_variant(q, causal=causal, window=window, alibi_slopes=slopes, softcap=softcap,
                       batch=b, seq_q=sq, seq_k=sk)  # fmt: skip
    if variant_reason(var, d, causal) is None:
        assert runs and runs[0] is not None, "the Gluon backward did not run this variant"
    else:
        assert not runs, "a launch that spills ran the Gluon backward"
    # the reference takes (H,) slopes: (B, H) ones batch by batch
    per = [None] * b if slopes is None else list(slopes.expand(b, hq))

    def grads_of(dtype):
        outs = [variant_attention(*(t.detach()[i : i + 1].to(dtype) for t in (q, k, v)),
                                  alibi_slopes=per[i], do=do[i : i + 1].to(dtype), **kw)
                for i in range(b)]  # fmt: skip
        return [torch.cat([getattr(r, n) for r in outs]) for n in ("dq", "dk", "dv")]

    ref, base = grads_of(torch.float64), grads_of(dtype)
    for name, x, r, bl in zip(("dq", "dk", "dv"), grads, ref, base, strict=True):
        assert x.isfinite().all(), name
        report = _tensor_report(x, x, r, bl, sk)
        assert report["passed"], (name, report)


VARIANTS = {
    "window-causal": dict(window=(300, -1)),
    "window-both": dict(window=(200, 150), causal=False),
    "window-left-only": dict(window=(64, -1), causal=False),
    "softcap-causal": dict(softcap=30.0),
    "softcap": dict(softcap=50.0, causal=False),
    "alibi-causal": dict(alibi="h"),
    "alibi-bh": dict(alibi="bh", causal=False, b=2),
    "window-softcap": dict(window=(256, -1), softcap=50.0),
    "window-alibi": dict(window=(128, 64), alibi="bh", causal=False, b=2),
    "softcap-alibi": dict(softcap=20.0, alibi="h"),
    "all": dict(window=(333, -1), softcap=40.0, alibi="bh", b=2),
}


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_gluon_bwd_variant(name, dtype, d, monkeypatch):
    _case(dtype, d=d, monkeypatch=monkeypatch, **VARIANTS[name])


@pytest.mark.parametrize("dtype", DTYPES)
def test_gluon_bwd_variant_odd_lengths_rows_without_keys(dtype, monkeypatch):
    """Sq > Sk, bottom-right causal: the first 431 query rows see no key (lse2 = +inf), and
    a window whose rows past the last key see none; odd lengths end mid-block."""
    _case(dtype, sq=1231, sk=800, window=(100, -1), softcap=30.0, alibi="h",
          monkeypatch=monkeypatch)  # fmt: skip


@pytest.mark.parametrize("dtype", DTYPES)
def test_gluon_bwd_variant_more_keys_than_rows(dtype, monkeypatch):
    _case(dtype, sq=333, sk=1500, hq=6, hk=3, window=(700, 30), causal=False, alibi="h",
          monkeypatch=monkeypatch)  # fmt: skip


@pytest.mark.parametrize("dtype", DTYPES)
def test_gluon_bwd_window_skips_key_blocks_no_row_sees(dtype, monkeypatch):
    """A narrow window non-causal over keys far past the rows: CTAs whose keys no row sees
    run no step and must still write zero dK and dV."""
    _case(dtype, sq=256, sk=2048, window=(0, 0), causal=False, monkeypatch=monkeypatch)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gluon_bwd_variant_plans_replay(dtype):
    """As fa-bench run times it (grads reset, the backward run again on the same graph):
    the replays take the plan (its bound launches checked against the JIT's, the slopes'
    stand-in included) and give the first call's gradients within the reduce-adds' order."""
    from fa_bench.case import alibi_slopes
    from fa_bench.kernels import flash_attention, flash_gluon_bwd_plan

    if not _gluon_ok():
        pytest.skip("the Gluon backward needs sm_90 and triton 3.6")
    g = torch.Generator(device="cuda").manual_seed(7)
    q, k, v = (torch.randn((2, 4, 1024, 128), generator=g, device="cuda").to(dtype)
               .requires_grad_() for _ in range(3))  # fmt: skip
    slopes = torch.tensor(alibi_slopes(4), dtype=torch.float32, device="cuda")
    out = flash_attention(q, k, v, causal=True, window=(300, -1), softcap=30.0,
                          alibi_slopes=slopes)  # fmt: skip
    grad = torch.randn_like(out)
    out.backward(grad, retain_graph=True)
    first = [t.grad.clone() for t in (q, k, v)]
    hits = flash_gluon_bwd_plan.hits
    for _ in range(2):
        q.grad = k.grad = v.grad = None
        out.backward(grad, retain_graph=True)
        for a, b in zip((q.grad, k.grad, v.grad), first, strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=2e-2 * float(b.abs().max()))
    assert flash_gluon_bwd_plan.hits >= hits + 1, flash_gluon_bwd_plan.last_reason
