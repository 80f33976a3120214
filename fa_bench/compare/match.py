"""Which cases of two runs belong together: keys (id, GPU), `--filter`, and the
environment differences shown above every comparison."""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass

from fa_bench.errors import UsageError
from fa_bench.results.record import CaseRecord, ResultsDoc


class CompareError(UsageError, ValueError):
    """Unusable input or options: `fa-bench compare` exits 2 with this message."""


def index_cases(docs: Sequence[ResultsDoc], by_gpu: bool) -> dict[str, CaseRecord]:
    """Cases of all documents by key (`GPU name: id` when by_gpu). A case in several
    merged runs keeps the last one (the documents are in the order given)."""
    out: dict[str, CaseRecord] = {}
    for doc in docs:
        gpu = doc.env.get("gpu_name")
        for record in doc.cases:
            out[f"{gpu}: {record.id}" if by_gpu and gpu else record.id] = record
    return out


def gpu_names(docs: Sequence[ResultsDoc]) -> set[str | None]:
    return {d.env.get("gpu_name") for d in docs}


ENV_KEYS = ("gpu_name", "driver", "cuda", "cudnn", "torch", "triton", "python", "fa_bench")


@dataclass(frozen=True)
class EnvDiff:
    key: str
    base: str
    current: str


def side_value(docs: Sequence[ResultsDoc], key: str) -> str:
    values = sorted({str(d.env.get(key)) for d in docs})
    return ", ".join("CPU" if v == "None" and key == "gpu_name" else v for v in values)


def env_diffs(base_docs: Sequence[ResultsDoc], cur_docs: Sequence[ResultsDoc]) -> list[EnvDiff]:
    """Environment keys that differ between the two sides (GPU model first)."""
    diffs = []
    for key in ENV_KEYS:
        b, c = side_value(base_docs, key), side_value(cur_docs, key)
        if b != c:
            diffs.append(EnvDiff(key, b, c))
    return diffs


FILTER_KEYS = ("id", "impl", "mode", "dtype", "batch", "heads_q", "heads_kv", "seqlen_q",
               "seqlen_k", "head_dim", "causal", "status", "device", "window_left",
               "window_right", "alibi", "softcap", "varlen")  # fmt: skip


@dataclass(frozen=True)
class CaseFilter:
    """`key=glob[|glob...]` terms joined by commas, all of which must hold; a term without
    '=' is a glob on the case id. Example: `impl=triton|sdpa-cudnn,mode=fwd,seqlen_q=4096`."""

    text: str
    terms: tuple[tuple[str, tuple[str, ...]], ...]

    @classmethod
    def parse(cls, text: str) -> CaseFilter:
        terms = []
        for raw in (t.strip() for t in text.split(",")):
            if not raw:
                continue
            key, _, pattern = raw.partition("=") if "=" in raw else ("id", "", raw)
            key = key.strip()
            if key not in FILTER_KEYS:
                raise CompareError(
                    f"--filter {text!r}: unknown key {key!r} (valid: {', '.join(FILTER_KEYS)})"
                )
            terms.append((key, tuple(p.strip() for p in pattern.split("|"))))
        if not terms:
            raise CompareError(f"--filter {text!r}: no term (write key=pattern, e.g. impl=triton)")
        return cls(text, tuple(terms))

    def matches(self, record: CaseRecord) -> bool:
        # From the case, not its dict: a dense case's dict leaves out the variant fields.
        fields = {"id": record.id, "status": record.status.value, "device": record.device}
        for key, patterns in self.terms:
            value = fields[key] if key in fields else getattr(record.case, key)
            text = str(value).lower() if isinstance(value, bool) else str(value)
            text = f"{value:g}" if isinstance(value, float) else text  # softcap=50, not 50.0
            if not any(fnmatch.fnmatchcase(text, p) for p in patterns):
                return False
        return True
