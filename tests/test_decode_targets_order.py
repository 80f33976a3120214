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


def test_every_target_is_reached_in_the_first_third() -> None:
    order = _run_order("decode_targets_s6.toml")
    shapes = [(c.batch, c.seqlen_k, c.page_size) for c in order]
    first = shapes[:16]  # what call A's step measured (16 cases)
    # the 0.9 x copy misses: batch 8 x 8k and paged batch 64 x 128k, every layout
    for page in (0, 64, 256):
        assert (8, 8192, page) in first and (64, 131072, page) in first
    # batch 1 (0.7 x copy) starts within those 16 cases
    assert any(b == 1 for b, _, _ in first)
    # each shape's implementations back to back (peers timed under the same conditions)
    assert [c.impl for c in order[:4]] == ["triton", "sdpa", "triton", "sdpa"]
    old = [(c.batch, c.seqlen_k) for c in _run_order("decode_targets.toml")[:16]]
    assert all(b == 8 for b, _ in old)  # what the old order measured in that time
