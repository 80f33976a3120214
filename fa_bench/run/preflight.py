"""Before a run: which chosen implementations cannot run here, and why.

An implementation that is unavailable on this machine (no CUDA, no cuDNN, an old GPU) or
that rejects every one of its planned cases here would fill the run with `unsupported`
records; the user hears it before the first case instead of as a bare count after the
last (issue 15, item 7).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from fa_bench import registry
from fa_bench.case import Case


@dataclass(frozen=True)
class CannotRun:
    impl: str
    kind: str  # "unavailable": not on this machine at all; "unsupported": none of its cases
    reason: str
    cases: int

    @property
    def line(self) -> str:
        what = "is unavailable here" if self.kind == "unavailable" else "cannot run any case here"
        return (f"{self.impl} {what}: {self.reason}; its {self.cases} case"
                f"{'s' if self.cases != 1 else ''} will be recorded as unsupported")  # fmt: skip


@contextmanager
def _worker_env(device: str) -> Iterator[None]:
    """The worker's TRITON_INTERPRET (run/runner.py sets it on CPU), which `triton`'s case
    check reads: without it the parent would call every CPU triton case unsupported."""
    if device != "cpu":
        yield
        return
    old = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = old


def cannot_run(cases: Sequence[Case], device: str, gpu: int | None = None) -> list[CannotRun]:
    """The chosen implementations that will run none of their cases on `device`."""
    import torch

    where = torch.device(device, gpu) if device == "cuda" and gpu is not None else device
    where = torch.device(where)
    by_impl: dict[str, list[Case]] = {}
    for c in cases:
        by_impl.setdefault(c.impl, []).append(c)
    found = []
    with _worker_env(device):
        for name, planned in by_impl.items():
            impl = registry.get(name)
            try:
                unavailable = impl.unavailable_reason()
                checks = [] if unavailable else planned
                reasons = [impl.unsupported_reason(c, where) for c in checks]
            except Exception:  # a plugin's check that raises: the worker records it per case
                continue
            if unavailable:
                found.append(CannotRun(name, "unavailable", unavailable, len(planned)))
            elif reasons and all(reasons):
                counts = Counter(r for r in reasons if r)
                top, _ = counts.most_common(1)[0]
                more = f" (and {len(counts) - 1} other reasons)" if len(counts) > 1 else ""
                found.append(CannotRun(name, "unsupported", top + more, len(planned)))
    return found
