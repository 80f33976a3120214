"""The packed (varlen) backward's work order (kernels/flash_varlen_sched.py) and the
two-kernel backward's launch (flash_validate.backward_grids): the table holds every real
(sequence, block) pair once, heaviest first by an exact count of its visible positions;
the kernels give the same gradients bit for bit in either order, within the accuracy
rule of the float64 reference; the dK/dV kernel's DP_FIRST order changes no bit.

CPU: the table tests are plain torch (fast); the kernels run in the Triton interpreter
in fp32. GPU runs: tests/test_flash_varlen_sched_gpu.py.
"""

from __future__ import annotations

import os
import random

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

pytest.importorskip("triton")

from fa_bench.kernels import flash_attention, flash_attention_varlen, flash_validate
from fa_bench.kernels.flash_config import FlashConfig
from fa_bench.kernels.flash_validate import Varlen, backward_grids, make_variant
from fa_bench.kernels.flash_varlen_sched import build_schedule, table_len
from fa_bench.run.accuracy import _tensor_report
from fa_bench.run.variant_reference import variant_attention

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
interpreter = pytest.mark.skipif(not INTERPRETED, reason="needs TRITON_INTERPRET=1 (CPU runs)")
SMALL = FlashConfig(block_m=32, block_n=16, bwd_block_m=16, bwd_block_n=32)
BIG = 1 << 40


def _cu(lengths: list[int]) -> torch.Tensor:
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=torch.int32)


def _brute(len_q, len_k, block, left, right, keys: bool) -> dict:
    """{(sequence, block): visible positions} by an explicit mask per sequence: for dK/dV
    (keys) the query rows that see any key of the block, for dQ the keys any row sees."""
    out = {}
    for b, (sq, sk) in enumerate(zip(len_q, len_k, strict=True)):
        i = torch.arange(sq)[:, None]
        j = torch.arange(sk)[None, :]
        diag = i + (sk - sq)
        seen = (j >= diag - left) & (j <= diag + right)  # (sq, sk)
        held = sk if keys else sq
        for n in range(-(-held // block)):
            part = (
                seen[:, n * block : (n + 1) * block] if keys else seen[n * block : (n + 1) * block]
            )
            out[(b, n)] = int(part.any(dim=1 if keys else 0).sum())
    return out


def _check_table(len_q, len_k, block, window, causal, bins=1) -> None:
    cq, ck = _cu(len_q), _cu(len_k)
    sched = build_schedule(
        cq, ck, max(len_q), max(len_k), sum(len_q), sum(len_k), block, window, causal, bins
    )
    entries = max(
        table_len(len(len_q), max(len_k), sum(len_k), block),
        table_len(len(len_q), max(len_q), sum(len_q), block),
    )
    assert sched.dtype == torch.int32 and sched.shape == (4, entries)
    if window is not None:
        left, right = window
    else:
        left, right = BIG, 0 if causal else BIG
    for rows, keys in ((sched[:2], True), (sched[2:], False)):
        cost = _brute(len_q, len_k, block, left, right, keys)
        pairs = [(int(b), int(n)) for b, n in rows.t()]
        real = [p for p in pairs if p[0] >= 0]
        assert sorted(real) == sorted(cost), "every real pair exactly once"
        assert pairs[len(real) :] == [(-1, -1)] * (len(pairs) - len(real)), "padding last"
        costs = [cost[p] for p in real]
        if bins == 1:
            assert costs == sorted(costs, reverse=True), "heaviest first"
            continue
        # bins of `bins` blocks' positions, heaviest bin first; inside one, a sequence's
        # pairs side by side, heaviest first
        binned = [(c // (bins * block), b) for c, (b, _) in zip(costs, real, strict=True)]
        assert [x for x, _ in binned] == sorted((x for x, _ in binned), reverse=True)
        assert binned == sorted(binned, key=lambda t: (-t[0], t[1]))
        for i in range(1, len(real)):
            if binned[i] == binned[i - 1]:
                assert costs[i] <= costs[i - 1]


@pytest.mark.parametrize(
    "len_q, len_k, block, window, causal",
    [
        ([5, 37, 1, 1, 64], [5, 37, 1, 1, 64], 8, None, True),
        ([5, 37, 1, 1, 64], [5, 37, 1, 1, 64], 8, None, False),
        ([17, 64, 1, 30, 0], [17, 64, 2, 9, 3], 16, None, True),
        ([17, 64, 1, 30], [40, 9, 2, 33], 8, (6, 0), True),
        ([17, 64, 1, 30], [40, 9, 2, 33], 8, (3, 5), False),
        ([100, 3, 77], [100, 3, 77], 32, (0, 0), True),
    ],
)
@pytest.mark.parametrize("bins", [1, 3])
def test_table_has_every_pair_once_heaviest_first(len_q, len_k, block, window, causal, bins):
    _check_table(len_q, len_k, block, window, causal, bins)


def test_table_random_batches():
    rng = random.Random(7)
    for _ in range(40):
        b = rng.randint(1, 9)
        len_q = [rng.choice([0, 1, rng.randint(1, 90)]) for _ in range(b)]
        len_k = [rng.choice([n, rng.randint(1, 90)]) for n in len_q]
        window = rng.choice([None, (rng.randint(0, 20), rng.randint(0, 20))])
        causal, bins = rng.random() < 0.5, rng.choice([1, 1, 2, 4])
        _check_table(len_q, len_k, rng.choice([8, 16]), window, causal, bins)


def test_table_len_covers_every_pair_and_no_more_than_the_dense_grid():
    assert table_len(8, 3433, 17460, 128) == min(8 * 27, 137 + 8)
    assert table_len(4, 10, 40, 16) == 4  # four 10-token sequences: one block each
    assert table_len(1, 1, 0, 64) == 1  # never an empty grid


def _variant(lengths, window=(-1, -1), causal=True):
    q = torch.zeros((1, 4, sum(lengths), 16))
    vl = Varlen(_cu(lengths), _cu(lengths), max(lengths), max(lengths))
    return make_variant(
        q, causal=causal, window=window, alibi_slopes=None, softcap=0.0,
        batch=len(lengths), seq_q=max(lengths), seq_k=max(lengths), varlen=vl,
    )  # fmt: skip


def test_backward_grids(monkeypatch):
    # dense: (blocks, batch × heads), no keywords (the dense kernels compile as before)
    assert backward_grids(None, True, 2, 8, 2, 100, 60, 32) == ({}, (2, 4), (4, 16))
    variant = _variant([40, 7, 90])
    extra, dkdv, dq = backward_grids(variant, True, 1, 8, 2, 137, 137, 32)
    entries = extra["Sched"].shape[1]
    # the heads on both kernels' fast axis; no DP_FIRST without a mask
    assert extra["VARLEN"] == 3 and dkdv == (2, entries) and dq == (8, entries)
    assert "DP_FIRST" not in extra
    assert backward_grids(variant, True, 1, 8, 2, 137, 137, 32)[0]["Sched"] is extra["Sched"]
    monkeypatch.setattr(flash_validate, "PACKED_TABLE_FAST", True)
    extra, dkdv, dq = backward_grids(variant, True, 1, 8, 2, 137, 137, 32)
    assert extra["VARLEN"] == 2 and dkdv == (entries, 2) and dq == (8, entries)
    monkeypatch.setattr(flash_validate, "PACKED_SCHEDULE", False)
    extra, dkdv, dq = backward_grids(variant, True, 1, 8, 2, 137, 137, 32)
    assert extra["VARLEN"] is True and "Sched" not in extra
    assert dkdv == (3 * 2, 3) and dq == (3 * 8, 3)
    # DP_FIRST: the masked variants by default, everything with "all", nothing with "off"
    windowed = _variant([40, 7, 90], window=(8, -1))
    assert backward_grids(windowed, True, 1, 8, 2, 137, 137, 32)[0]["DP_FIRST"] is True
    monkeypatch.setattr(flash_validate, "DKDV_DP_FIRST", "off")
    assert "DP_FIRST" not in backward_grids(windowed, True, 1, 8, 2, 137, 137, 32)[0]
    monkeypatch.setattr(flash_validate, "DKDV_DP_FIRST", "all")
    assert backward_grids(None, False, 1, 8, 2, 64, 64, 32)[0] == {"DP_FIRST": True}


def test_schedule_is_built_once_per_key():
    vl = Varlen(_cu([9, 30]), _cu([9, 30]), 30, 30)
    first = vl.schedule(16, None, True, 39, 39)
    assert vl.schedule(16, None, True, 39, 39) is first
    assert vl.schedule(16, (4, 0), True, 39, 39) is not first
    assert vl.schedule(16, None, True, 39, 39, 4) is not first
    assert len(vl.schedules) == 3


# ---------------------------------------------------------------------------------------
# The kernels in the interpreter (fp32)
# ---------------------------------------------------------------------------------------


def _packed_grads(len_q, len_k, hq, hk, d, kw, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn((sum(len_q), hq, d), generator=g).requires_grad_()
    k = torch.randn((sum(len_k), hk, d), generator=g).requires_grad_()
    v = torch.randn((sum(len_k), hk, d), generator=g).requires_grad_()
    cq, ck = _cu(len_q), _cu(len_k)
    o = flash_attention_varlen(q, k, v, cq, ck, max(len_q), max(len_k), config=SMALL, **kw)
    do = torch.randn(o.shape, generator=g)
    return (q, k, v, do, cq, ck), (o, *torch.autograd.grad(o, (q, k, v), do))


def _reference_rule(inputs, ours, kw) -> None:
    """Each sequence's float64 reference and fp32 baseline, packed back, under the rule."""
    q, k, v, do, cq, ck = inputs
    parts = {torch.float64: [], torch.float32: []}
    for b in range(cq.numel() - 1):
        rows, keys = slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])
        one = [t[cut].detach().transpose(0, 1).unsqueeze(0) for t, cut in
               ((q, rows), (k, keys), (v, keys), (do, rows))]  # fmt: skip
        for dtype, out in parts.items():
            if one[0].shape[2] == 0:  # no query rows (the reference needs some): zero grads
                out.append(
                    [one[0].to(dtype), one[0].to(dtype), *(0 * t.to(dtype) for t in one[1:3])]
                )
                continue
            r = variant_attention(*(t.to(dtype) for t in one[:3]), do=one[3].to(dtype), **kw)
            out.append([r.o, r.dq, r.dk, r.dv])
    terms = int(max((cq[1:] - cq[:-1]).max(), (ck[1:] - ck[:-1]).max()))
    for i, name in enumerate(("o", "dq", "dk", "dv")):
        ref, base = (torch.cat([p[i][0].transpose(0, 1) for p in parts[t]]) for t in parts)
        report = _tensor_report(ours[i], ours[i], ref, base, terms)
        assert report["passed"], (name, report)


def _same_as_first_grids(monkeypatch, len_q, len_k, kw) -> None:
    inputs, scheduled = _packed_grads(len_q, len_k, 4, 2, 16, kw)
    _reference_rule(inputs, scheduled, kw)
    monkeypatch.setattr(flash_validate, "PACKED_TABLE_FAST", True)
    _, table_fast = _packed_grads(len_q, len_k, 4, 2, 16, kw)
    monkeypatch.setattr(flash_validate, "PACKED_SCHEDULE", False)
    _, first = _packed_grads(len_q, len_k, 4, 2, 16, kw)
    for a, b, c in zip(scheduled, first, table_fast, strict=True):
        assert torch.equal(a, b) and torch.equal(a, c)


@interpreter
def test_scheduled_packed_backward_is_the_first_grids_bit_for_bit_fast(monkeypatch):
    _same_as_first_grids(monkeypatch, [3, 24, 1], [3, 24, 2], dict(causal=True))


@interpreter
@pytest.mark.slow
@pytest.mark.parametrize(
    "kw",
    [
        dict(causal=True),
        dict(causal=True, window=(20, -1), softcap=5.0),
        dict(causal=False, window=(9, 3)),
    ],
)
def test_scheduled_packed_backward_is_the_first_grids_bit_for_bit(monkeypatch, kw):
    # Sq != Sk per sequence, a sequence without query rows, length-1 and 2 sequences
    _same_as_first_grids(monkeypatch, [5, 70, 1, 33, 0, 48], [5, 41, 2, 33, 3, 80], kw)


@interpreter
@pytest.mark.slow
def test_dkdv_dp_first_changes_no_bit(monkeypatch):
    g = torch.Generator().manual_seed(3)
    q = torch.randn((2, 4, 45, 24), generator=g).requires_grad_()
    k, v = (torch.randn((2, 2, 61, 24), generator=g).requires_grad_() for _ in range(2))
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625])
    kw = dict(causal=True, window=(17, -1), softcap=4.0, alibi_slopes=slopes, config=SMALL)
    do = torch.randn((2, 4, 45, 24), generator=g)
    runs = []
    for on in ("off", "variants"):
        monkeypatch.setattr(flash_validate, "DKDV_DP_FIRST", on)
        o = flash_attention(q, k, v, **kw)
        runs.append(torch.autograd.grad(o, (q, k, v), do))
    for a, b in zip(*runs, strict=True):
        assert torch.equal(a, b)


@interpreter
@pytest.mark.slow
def test_the_gpu_bench_runs_on_a_cpu_and_its_switches_change_no_bit(tmp_path):
    """tools/gpu/variants_bwd.py's plumbing (VB_CPU=1: the interpreter at sizes / 128):
    every case times, every ratio is printed, every switch's gradients are bitwise equal."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    tool = Path(__file__).resolve().parent.parent / "tools" / "gpu" / "variants_bwd.py"
    env = dict(os.environ, VB_CPU="1", ROUNDS="1", OUT=str(tmp_path), TRITON_INTERPRET="1")
    done = subprocess.run([sys.executable, str(tool)], env=env, capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    result = json.loads((tmp_path / "variants_bwd.json").read_text())
    assert result["bitwise"] and all(result["bitwise"].values())
    assert all(len(t) == 1 and isinstance(t[0], float) for t in result["tflops"].values())
    assert "| packed mixed / equal |" in (tmp_path / "variants_bwd.md").read_text()
