"""The correctness half of tools/gpu/variants_gluon.py: every variant and combination
through `flash_attention(..., config=FlashConfig(forward="gluon"))` /
`flash_attention_varlen` against the float64 reference (fa_bench.run.variant_reference)
under the accuracy rule (o), the lse (empty rows, values), and our `tl` backward's
gradients on the Gluon forward's (o, lse2). `_cases()` names them (the GPU tests in
tests/test_flash_gluon_var.py run the same); DEVICE / CHECKED let a CPU test run them
through the `tl` kernel in the interpreter. A developer tool, not installed.
"""

from __future__ import annotations

import traceback

import torch

from fa_bench.kernels import FlashConfig, flash_attention, flash_attention_varlen
from fa_bench.run.accuracy import _tensor_report
from fa_bench.run.variant_reference import variant_attention
from fa_bench.variants import alibi_slopes

GLUON, TL = FlashConfig(forward="gluon"), FlashConfig(forward="tl")
# The checks' device and config: a CPU test runs them through the `tl` kernel in the
# interpreter (tests/test_flash_gluon_var.py) to check this script's own plumbing.
DEVICE = "cuda"
CHECKED = GLUON
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def _rand(shape, dtype, g):
    return torch.randn(shape, generator=g, device=g.device).to(dtype)


def _slopes(heads, batch=None):
    s = torch.tensor(alibi_slopes(heads), dtype=torch.float32, device=DEVICE)
    return (
        s
        if batch is None
        else (s[None, :] * torch.linspace(0.5, 1.5, batch, device=DEVICE)[:, None]).contiguous()
    )


def _dense_check(dtype, d, b, hq, hk, sq, sk, grads=False, alibi="", nan_keys=0, **kw) -> dict:
    """One dense-layout variant call against the float64 reference; alibi "h" for
    (H,) slopes, "bh" for (B, H); nan_keys: ours runs with the first keys (and values)
    NaN, which no row's window reaches: any load of them would show in the output."""
    kw.setdefault("causal", False)
    if alibi:
        kw["alibi_slopes"] = _slopes(hq, b if alibi == "bh" else None)
    g = torch.Generator(device=DEVICE).manual_seed(sq * 7 + sk)
    q, k, v = (
        _rand((b, hq, sq, d), dtype, g),
        _rand((b, hk, sk, d), dtype, g),
        _rand((b, hk, sk, d), dtype, g),
    )
    if grads:
        q, k, v = (t.requires_grad_() for t in (q, k, v))
    k_in, v_in = k, v
    if nan_keys:
        k_in, v_in = k.detach().clone(), v.detach().clone()
        k_in[:, :, :nan_keys] = float("nan")
        v_in[:, :, :nan_keys] = float("nan")
    o, lse = flash_attention(q, k_in, v_in, config=CHECKED, return_lse=True, **kw)
    do = torch.randn(o.shape, generator=g, device=DEVICE).to(dtype) if grads else None
    ref = _reference([t.detach().double() for t in (q, k, v)], do, torch.float64, kw)
    base = _reference([t.detach() for t in (q, k, v)], do, dtype, kw)
    terms = sk
    out = {"o": _tensor_report(o, o, ref.o, base.o, terms)}
    if grads:
        got = torch.autograd.grad(o, (q, k, v), do)
        for name, x, r, bb in zip(
            ("dq", "dk", "dv"),
            got,
            (ref.dq, ref.dk, ref.dv),
            (base.dq, base.dk, base.dv),
            strict=True,
        ):
            out[name] = _tensor_report(x, x, r, bb, terms)
    return _lse(out, lse, ref.lse, base.lse)


def _reference(qkv: list, do, dtype, kw: dict):
    """variant_attention in `dtype`; (B, H) slopes one batch element at a time (the
    reference takes (H,) slopes)."""
    slopes = kw.get("alibi_slopes")
    do = None if do is None else do.to(dtype)
    if slopes is None or slopes.dim() == 1:
        return variant_attention(*qkv, do=do, **kw)
    parts = []
    for b in range(qkv[0].shape[0]):
        one = dict(kw, alibi_slopes=slopes[b])
        d_b = None if do is None else do[b : b + 1]
        parts.append(variant_attention(*(t[b : b + 1] for t in qkv), do=d_b, **one))
    return type(parts[0])(
        *(None if p[0] is None else torch.cat(list(p)) for p in zip(*parts, strict=True))
    )


def _lse(out: dict, lse: torch.Tensor, ref: torch.Tensor, base: torch.Tensor) -> dict:
    """The lse: the same empty rows (-inf) as the reference, the others within twice the
    same-dtype baseline's error (the accuracy rule's form) plus 1e-4."""
    same_inf = bool(torch.equal(torch.isinf(lse), torch.isinf(ref)))
    fin = torch.isfinite(ref)
    err = (lse[fin].double() - ref[fin]).abs().max().item() if fin.any() else 0.0
    base_err = (base[fin].double() - ref[fin]).abs().max().item() if fin.any() else 0.0
    out["lse"] = {
        "passed": same_inf and err <= 2 * base_err + 1e-4,
        "max_abs_err": err,
        "baseline_max_abs_err": base_err,
        "empty_rows": int((~fin).sum()),
    }
    return out


def _varlen_check(dtype, d, lens_q, lens_k, hq, hk, alibi=False, **kw) -> dict:
    kw.setdefault("causal", False)
    g = torch.Generator(device=DEVICE).manual_seed(sum(lens_q) + len(lens_k))
    tq, tk = sum(lens_q), sum(lens_k)
    q, k, v = (
        _rand((tq, hq, d), dtype, g),
        _rand((tk, hk, d), dtype, g),
        _rand((tk, hk, d), dtype, g),
    )
    cum = lambda ls: torch.tensor([0, *itertools_acc(ls)], dtype=torch.int32, device=DEVICE)  # noqa: E731
    cq, ck = cum(lens_q), cum(lens_k)
    slopes = _slopes(hq, len(lens_q)) if alibi else None
    # the output buffer's rows between sequences must stay untouched: the kernel allocates
    # its own, so check every row against its own sequence's reference instead
    o, lse = flash_attention_varlen(
        q,
        k,
        v,
        cq,
        ck,
        max(lens_q),
        max(lens_k),
        config=CHECKED,
        alibi_slopes=slopes,
        return_lse=True,
        **kw,
    )
    refs, bases, lses, base_lses = [], [], [], []
    for i in range(len(lens_q)):
        rq, rk = slice(int(cq[i]), int(cq[i + 1])), slice(int(ck[i]), int(ck[i + 1]))
        one = [t[r].transpose(0, 1).unsqueeze(0) for t, r in ((q, rq), (k, rk), (v, rk))]
        s_b = None if slopes is None else slopes[i]
        ref = variant_attention(*(t.double() for t in one), alibi_slopes=s_b, **kw)
        base = variant_attention(*one, alibi_slopes=s_b, **kw)
        refs.append(ref.o[0].transpose(0, 1))
        bases.append(base.o[0].transpose(0, 1))
        lses.append(ref.lse[0])
        base_lses.append(base.lse[0])
    ref_o, base_o = torch.cat(refs), torch.cat(bases)
    out = {"o": _tensor_report(o, o, ref_o, base_o, max(lens_k))}
    return _lse(out, lse, torch.cat(lses, dim=1), torch.cat(base_lses, dim=1))


def itertools_acc(lengths):
    total, out = 0, []
    for n in lengths:
        total += n
        out.append(total)
    return out


def _cases(dtypes: tuple[str, ...] = tuple(DTYPES)) -> list[tuple]:
    """(name, check function, args, kwargs) of every correctness check."""
    dc, vc = _dense_check, _varlen_check
    cases: list[tuple] = []
    mixed = [1, 300, 1, 1000, 129, 64]
    for dname in dtypes:
        dt = DTYPES[dname]
        for d in (128, 64):
            p = f"{dname} d{d}"
            cases += [
                (
                    f"{p} window (256,0) causal 2x4/2 1000",
                    dc,
                    (dt, d, 2, 4, 2, 1000, 1000),
                    dict(causal=True, window=(256, -1)),
                ),
                (
                    f"{p} window (100,50) 700x1300",
                    dc,
                    (dt, d, 1, 4, 1, 700, 1300),
                    dict(window=(100, 50)),
                ),
                (
                    f"{p} window (64,0) causal 1300x700 (empty rows)",
                    dc,
                    (dt, d, 1, 2, 1, 1300, 700),
                    dict(causal=True, window=(64, -1)),
                ),
                (f"{p} window (0,0) 513", dc, (dt, d, 1, 2, 2, 513, 513), dict(window=(0, 0))),
                (
                    f"{p} window (64,0) causal 256x1024, keys < 640 NaN (never loaded)",
                    dc,
                    (dt, d, 1, 2, 1, 256, 1024),
                    dict(causal=True, window=(64, -1), nan_keys=640),
                ),
                (
                    f"{p} softcap 50 causal 1000",
                    dc,
                    (dt, d, 2, 4, 2, 1000, 1000),
                    dict(causal=True, softcap=50.0),
                ),
                (f"{p} softcap 5 700x1300", dc, (dt, d, 1, 4, 4, 700, 1300), dict(softcap=5.0)),
                (
                    f"{p} alibi causal 1000",
                    dc,
                    (dt, d, 2, 4, 2, 1000, 1000),
                    dict(causal=True, alibi="h"),
                ),
                (  # the per-column ALiBi (causal): Sq != Sk, (B, H) slopes, GQA 4/1
                    f"{p} alibi (B,H) causal 700x2100",
                    dc,
                    (dt, d, 2, 4, 1, 700, 2100),
                    dict(causal=True, alibi="bh"),
                ),
                (  # ... with a left window alone, keys 4.6k long (2 heads: slopes 1/16, 1/256)
                    f"{p} alibi window (512,0) causal 4600",
                    dc,
                    (dt, d, 1, 2, 2, 4600, 4600),
                    dict(causal=True, window=(512, -1), alibi="h"),
                ),
                (
                    f"{p} alibi (B,H) 1300x700",
                    dc,
                    (dt, d, 2, 4, 1, 1300, 700),
                    dict(alibi="bh"),
                ),
                (
                    f"{p} window (300,20) softcap 30 alibi 900x1100",
                    dc,
                    (dt, d, 2, 4, 2, 900, 1100),
                    dict(window=(300, 20), softcap=30.0, alibi="h"),
                ),
                (
                    f"{p} causal window 128 softcap alibi 1300x700",
                    dc,
                    (dt, d, 1, 4, 2, 1300, 700),
                    dict(causal=True, window=(128, -1), softcap=30.0, alibi="h"),
                ),
                (f"{p} packed causal {mixed}", vc, (dt, d, mixed, mixed, 4, 2), dict(causal=True)),
                (
                    f"{p} packed Sq!=Sk causal",
                    vc,
                    (dt, d, [5, 1, 700, 200], [9, 1, 300, 1200], 4, 1),
                    dict(causal=True),
                ),
                (
                    f"{p} packed window (200,0) softcap 30 alibi",
                    vc,
                    (dt, d, mixed, mixed, 4, 2),
                    dict(alibi="bh", causal=True, window=(200, -1), softcap=30.0),
                ),
                (
                    f"{p} packed window (50,50)",
                    vc,
                    (dt, d, [64, 1, 513, 130], [64, 1, 513, 130], 2, 2),
                    dict(window=(50, 50)),
                ),
            ]
        cases += [
            (
                f"{dname} d128 grads window (256,0) causal",
                dc,
                (dt, 128, 1, 4, 2, 1000, 1000),
                dict(grads=True, causal=True, window=(256, -1)),
            ),
            (  # the softcap's fixed offset (bf16 default): lse2 as the backward expects
                f"{dname} d128 grads softcap 50 causal",
                dc,
                (dt, 128, 1, 4, 2, 1000, 1000),
                dict(grads=True, causal=True, softcap=50.0),
            ),
            (  # ... with a window (rows past Sk's start see few keys) and Sq != Sk
                f"{dname} d128 window (256,0) causal softcap 50 700x1500",
                dc,
                (dt, 128, 1, 4, 2, 700, 1500),
                dict(causal=True, window=(256, -1), softcap=50.0),
            ),
            (
                f"{dname} d128 grads softcap 50 alibi causal",
                dc,
                (dt, 128, 1, 4, 2, 1000, 1000),
                dict(grads=True, causal=True, softcap=50.0, alibi="h"),
            ),
        ]
    return cases


# Development modes of the softcap (flash_gluon_varhost's switches): the check's name
# tag -> (TANH_F16X2, SOFTCAP_EMU, QSCALE, FIXED_MAX); SOFTCAP_FAST (the default's FIXED_MAX
# with QSCALE) is off in each, so the tag says all that runs.
DEV_MODES = {
    "tanh f16x2": (True, 0, False, False),
    "emu 2": (False, 2, False, False),
    "qscale": (False, 0, True, False),
    "fixed": (False, 0, False, True),
    "fixed qscale": (False, 0, True, True),
    "plain": (False, 0, False, False),
}
_SWITCHES = ("TANH_F16X2", "SOFTCAP_EMU", "QSCALE", "FIXED_MAX", "SOFTCAP_FAST")


def _dev_cases(dtypes: tuple[str, ...], modes: list[str]) -> list[tuple]:
    """The softcap checks again in each development mode, tagged [mode]."""
    return [
        (f"{name} [{mode}]", fn, args, dict(kw, dev=mode))
        for mode in modes
        for name, fn, args, kw in _cases(dtypes)
        if "softcap" in kw
    ]


def _run_check(fn, args, kw) -> dict:
    """One check, with its development mode's switches on for it."""
    from fa_bench.kernels import flash_gluon_varhost as vh

    kw = dict(kw)
    mode = kw.pop("dev", "")
    saved = {name: getattr(vh, name) for name in _SWITCHES}
    if mode:
        for name, value in zip(_SWITCHES, (*DEV_MODES[mode], False), strict=True):
            setattr(vh, name, value)
    try:
        return fn(*args, **kw)
    finally:  # the defaults back for the next check
        for name, value in saved.items():
            setattr(vh, name, value)


def _check_row(name: str, fn, args: tuple, kw: dict) -> dict:
    """One check's row; a failure to run is a failed row with the error."""
    try:
        res = _run_check(fn, args, kw)
        row = {"check": name, "passed": all(r["passed"] for r in res.values()), "detail": res}
    except Exception as e:  # a compile or launch failure is a result here
        row = {"check": name, "passed": False, "error": f"{type(e).__name__}: {str(e)[-400:]}"}
        traceback.print_exc()
    print(("ok  " if row["passed"] else "FAIL") + " " + name, flush=True)
    return row


def correctness(dtypes: tuple[str, ...], dev: list[str] | None = None) -> list[dict]:
    """Every check's row, in this process."""
    return [_check_row(*case) for case in _cases(dtypes) + _dev_cases(dtypes, dev or [])]
