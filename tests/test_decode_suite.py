"""The built-in `decode` suite (issue 20), redesigned in session 5 as a covering design:
the baseline grid (bf16, Sq 1, equal lengths, 32/8 heads: batch 1/8/64/256 x contexts
1k-128k x contiguous and 16/64/256 pages, within memory) with triton, sdpa and fa4; one
axis at a time around it at representative shapes; flex and naive at three shapes. Every
axis value issue 20 names is kept, and every case kept from the old cross product keeps
its id, dict, models and size (the old file, below, still expands to the digests
test_variant_cases.py held for it)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from fa_bench import models
from fa_bench.case import Mode
from fa_bench.commands.run_plan import interleave_impls
from fa_bench.run.limits import tensor_bytes
from fa_bench.suite.expand import Overrides, load_suite

KNOWN = ("naive", "sdpa", "sdpa-math", "flex", "triton", "fa4")
SHIPPED = ("triton", "sdpa", "fa4")
PEERS = ("flex", "naive")

# suites/decode.toml before session 5: the cross product (1280 shapes x 5 impls).
OLD_TOML = Path(__file__).with_name("test_decode_suite_old.toml")
OLD_DIGESTS = (6400, "9934ca529ddd641a", "48f44320ed1a2c78")


def _digest(lines: list[str]) -> str:
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]


def _row(c) -> str:
    return (json.dumps(c.to_dict(), sort_keys=True)
            + f" {models.case_flops(c)} {models.case_bytes(c)} {tensor_bytes(c)}")  # fmt: skip


def _shape(c) -> tuple:
    return (c.dtype.value, c.batch, c.heads_q, c.seqlen_q, c.seqlen_k, c.page_size, c.ctx_spread)


def test_every_case_kept_from_the_cross_product_is_unchanged() -> None:
    old = load_suite(OLD_TOML).cases
    ids, rows = [c.id for c in old], [_row(c) for c in old]
    assert (len(ids), _digest(ids), _digest(rows)) == OLD_DIGESTS
    new = load_suite("decode").cases
    assert len({c.id for c in new}) == len(new) == 240
    old_rows = dict(zip(ids, rows, strict=True))
    kept = [c for c in new if c.id in old_rows]
    assert len(kept) == 154 and all(old_rows[c.id] == _row(c) for c in kept)
    # the new cases: the 8k contexts (the issue's target threshold), absent before
    assert {c.seqlen_k for c in new if c.id not in old_rows} == {8192}


def test_the_baseline_grid_is_complete_within_memory() -> None:
    cases = load_suite("decode", known_impls=KNOWN).cases
    assert {c.mode for c in cases} == {Mode.DECODE} and all(c.causal for c in cases)
    base = {(c.impl, c.batch, c.seqlen_k, c.page_size) for c in cases
            if _shape(c)[:4] == ("bf16", c.batch, 32, 1) and c.ctx_spread == 1.0}  # fmt: skip
    contexts = {1: (1024, 8192, 32768, 131072), 8: (1024, 8192, 32768, 131072),
                64: (1024, 8192, 32768, 131072), 256: (1024, 8192, 32768)}  # fmt: skip
    for impl in SHIPPED:
        want = {(impl, b, sk, p) for b, sks in contexts.items() for sk in sks
                for p in (0, 16, 64, 256)}  # fmt: skip
        assert {x for x in base if x[0] == impl} == want
    # the size rule: K+V in 2 bytes at most 100 GiB; 256 x 128k (128 GiB) is out
    cache = max(c.batch * c.seqlen_k * c.heads_kv * c.head_dim * 2 * 2 for c in cases)
    assert cache / 2**30 == 32
    assert all(c.heads_kv == 8 and c.head_dim == 128 for c in cases)


def test_the_one_axis_groups_vary_one_axis_at_representative_shapes() -> None:
    cases = [c for c in load_suite("decode", known_impls=KNOWN).cases if c.impl == "triton"]
    baseline = ("bf16", 32, 1, 1.0)
    off = [c for c in cases if (c.dtype.value, c.heads_q, c.seqlen_q, c.ctx_spread) != baseline]
    varied = {}
    for c in off:
        axes = [c.dtype.value != "bf16", c.heads_q != 32, c.seqlen_q != 1, c.ctx_spread != 1.0]
        assert sum(axes) == 1, c.id  # exactly one axis off the baseline
        varied.setdefault(("fp16", "heads64", "sq4", "ragged")[axes.index(True)], set()).add(
            (c.batch, c.seqlen_k, c.page_size)
        )
    rep = {(1, 32768, 0), (1, 32768, 64), (8, 8192, 0), (8, 8192, 64)}
    ragged = {(8, 8192, 0), (8, 8192, 64), (64, 8192, 0), (64, 8192, 64)}
    assert varied == {"fp16": rep, "heads64": rep, "sq4": rep, "ragged": ragged}
    assert {c.ctx_spread for c in off} == {1.0, 0.25} and {c.seqlen_q for c in off} == {1, 4}


def test_every_axis_value_of_issue_20_is_in_the_suite() -> None:
    cases = load_suite("decode", known_impls=KNOWN).cases
    assert {(c.heads_q, c.heads_kv) for c in cases} == {(32, 8), (64, 8)}
    assert {c.batch for c in cases} == {1, 8, 64, 256}
    assert min(c.seqlen_k for c in cases) == 1024 and max(c.seqlen_k for c in cases) == 131072
    assert {c.page_size for c in cases} == {0, 16, 64, 256}
    assert {c.seqlen_q for c in cases} == {1, 4} and {c.ctx_spread for c in cases} == {1.0, 0.25}
    assert {c.dtype.value for c in cases} == {"bf16", "fp16"}
    assert {c.impl for c in cases} == {*SHIPPED, *PEERS}


def test_the_slower_peers_run_three_shapes_beside_ours() -> None:
    cases = load_suite("decode", known_impls=KNOWN).cases
    peers = {(c.impl, c.batch, c.seqlen_k, c.page_size) for c in cases if c.impl in PEERS}
    shapes = {(1, 32768), (8, 8192), (64, 8192)}
    assert peers == {(i, b, sk, p) for i in PEERS for b, sk in shapes for p in (0, 64)}
    ours = {_shape(c) for c in cases if c.impl == "triton"}
    assert all(_shape(c) in ours for c in cases if c.impl in PEERS)


def test_the_targets_come_first_in_the_run_order() -> None:
    order = interleave_impls(load_suite("decode", known_impls=KNOWN).cases)
    shapes = list(dict.fromkeys(_shape(c) for c in order))
    # the first 36 shapes: batch 1, 8, 64 at 8k, 32k, 128k, every layout, bf16 Sq 1 equal
    first = shapes[:36]
    assert {(s[1], s[4]) for s in first} == {(b, sk) for b in (1, 8, 64)
                                              for sk in (8192, 32768, 131072)}  # fmt: skip
    assert shapes[-12:] == [s for s in shapes if s[1] == 256]  # batch 256 last
    # a shape's implementations back to back, the peers beside ours
    b1 = [c.impl for c in order if _shape(c) == ("bf16", 1, 32, 1, 32768, 0, 1.0)]
    assert b1 == ["triton", "sdpa", "fa4", "flex", "naive"]


def test_the_decode_suite_at_cpu_sizes() -> None:
    """The override set docs/suites.md gives for a CPU run: a few dozen tiny cases."""
    ov = Overrides(dtypes=("fp32",), heads=(4,), kv_heads=(2,), head_dims=(32,), batch=(3,),
                   seqlens_k=(80,), page_sizes=(0, 16))  # fmt: skip
    cases = load_suite("decode", ov, known_impls=KNOWN).cases
    # triton/sdpa/fa4 x 2 pages x (Sq 1 equal, Sq 4, ragged); flex/naive x 2 pages; the
    # heads and dtype groups fold into the baseline under the overrides
    assert len(cases) == 3 * 2 * 3 + 2 * 2 == 22
    assert max(tensor_bytes(c) for c in cases) < 2**20


def test_the_gpu_targets_file_is_the_suite_where_the_issue_sets_a_target() -> None:
    """tools/gpu/decode_targets.toml (the last GPU call's run): cases of the suite, with the
    same ids, at every shape of its baseline where issue 20 sets a bandwidth target."""
    path = Path(__file__).parents[1] / "tools" / "gpu" / "decode_targets.toml"
    targets = load_suite(path, known_impls=KNOWN).cases
    suite = {c.id for c in load_suite("decode", known_impls=KNOWN).cases}
    assert len(targets) == 48 and all(c.id in suite for c in targets)
    shapes = {(c.batch, c.seqlen_k, c.page_size) for c in targets}
    kv64 = {(b, sk, p) for b in (8, 64) for sk in (8192, 32768, 131072) for p in (0, 64, 256)}
    b1 = {(1, sk, p) for sk in (32768, 131072) for p in (0, 64, 256)}
    assert shapes == kv64 | b1 and {c.impl for c in targets} == {"triton", "sdpa"}
    first = interleave_impls(targets)[0]
    assert (first.batch, first.seqlen_k, first.page_size) == (8, 8192, 0)
