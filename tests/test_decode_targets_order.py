"""tools/gpu/decode_targets_s6.toml (issue 20, session 6): the same 48 cases (the same
case ids) as decode_targets.toml, in the order `fa-bench run` times them, with every
bandwidth target's nearest shapes early: in session 6's call A the old order reached 16
of 48 cases in its step and never batch 1."""

from __future__ import annotations

from pathlib import Path

from fa_bench import registry
from fa_bench.commands.run_plan import interleave_impls
from fa_bench.suite.expand import load_suite

TOOLS = Path(__file__).resolve().parent.parent / "tools" / "gpu"


def _run_order(name: str) -> list:
    registry.load()
    return interleave_impls(load_suite(TOOLS / name).cases)


def test_the_same_cases_as_the_old_targets() -> None:
    new, old = _run_order("decode_targets_s6.toml"), _run_order("decode_targets.toml")
    assert len(new) == 48 and sorted(c.id for c in new) == sorted(c.id for c in old)


def test_every_target_is_reached_in_the_first_half() -> None:
    order = _run_order("decode_targets_s6.toml")
    shapes = [(c.batch, c.seqlen_k, c.page_size) for c in order]
    # batch 8 x 8k (nearest the 0.9 x copy line) first, every layout
    assert {s for s in shapes[:6]} == {(8, 8192, page) for page in (0, 64, 256)}
    # then batch 1 (0.7 x copy), all of it within the first 18 cases (call A's step
    # measured 16, call C's 8)
    assert {b for b, _, _ in shapes[6:18]} == {1}
    # then batch 64 x 128k (0.9 x copy), every layout, within the first 24
    assert {s for s in shapes[18:24]} == {(64, 131072, page) for page in (0, 64, 256)}
    # each shape's implementations back to back (peers timed under the same conditions)
    assert [c.impl for c in order[:4]] == ["triton", "sdpa", "triton", "sdpa"]
    old = [(c.batch, c.seqlen_k) for c in _run_order("decode_targets.toml")[:16]]
    assert all(b == 8 for b, _ in old)  # what the old order measured in that time
