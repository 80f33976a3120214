"""Merge results documents into one comparison: the report's one view of the cases.

Runs from different GPUs or nodes merge into one table of cases keyed by (case id, GPU):
each case gets a GPU label, so the same case measured on two cards stays two rows and the
figures draw one line per implementation and GPU. A case measured twice on the same GPU
keeps the later run's record (inputs are read in the order given).

The records are not reshaped: each merged case holds its `CaseRecord` as read, beside the
label and the index of the run it came from. Every figure and table imports this module;
nothing here imports them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TypeVar

from fa_bench.errors import UsageError
from fa_bench.results.record import CaseRecord, ResultsDoc

K = TypeVar("K")
_DEFAULT_BASELINES = ("sdpa", "sdpa-cudnn", "sdpa-flash", "naive")


class ReportError(UsageError, ValueError):
    """Bad input for a report (an unknown baseline, no cases): maps to exit code 2."""


@dataclass(frozen=True)
class MergedCase:
    """One case of the comparison: its record, unchanged, the label of the GPU it ran on
    and the index of its run among the merged documents."""

    record: CaseRecord
    gpu: str
    run: int


@dataclass
class Merged:
    """The docs as given, and their cases, each with its GPU label and run index."""

    docs: list[ResultsDoc]
    cases: list[MergedCase]
    gpus: list[str]
    replaced: int = 0
    impls: list[str] = field(default_factory=list)
    label_doc: dict[str, int] = field(default_factory=dict)  # GPU label -> its run's index

    def labelled_docs(self) -> list[tuple[ResultsDoc, str]]:
        """(results document, GPU label) for every GPU label, in order."""
        return [(self.docs[self.label_doc[label]], label) for label in self.gpus]


def group_by(
    cases: Iterable[MergedCase], key: Callable[[MergedCase], K]
) -> dict[K, list[MergedCase]]:
    """Cases by key, each list in the cases' order, the keys in order of first appearance:
    one pass, where a scan of all cases per key would make a figure quadratic."""
    out: dict[K, list[MergedCase]] = {}
    for c in cases:
        out.setdefault(key(c), []).append(c)
    return out


def gpu_label(doc: ResultsDoc) -> str:
    """What the run ran on: the GPU's name, or 'CPU' for a CPU run."""
    if doc.env.get("gpu_name"):
        return str(doc.env["gpu_name"])
    gpus = doc.env.get("gpus") or []
    if gpus and doc.run.get("device") != "cpu":
        return str(gpus[0].get("name") or "GPU")
    return "CPU"


def run_labels(docs: list[ResultsDoc]) -> list[str]:
    """GPU labels, with the host added where two hosts have the same kind of GPU, so a
    merge of two nodes keeps both."""
    base = [gpu_label(d) for d in docs]
    hosts: dict[str, set[str]] = {}
    for label, doc in zip(base, docs, strict=True):
        hosts.setdefault(label, set()).add(str(doc.env.get("hostname")))
    return [
        f"{label} @ {doc.env.get('hostname')}" if len(hosts[label]) > 1 else label
        for label, doc in zip(base, docs, strict=True)
    ]


def _case_label(record: CaseRecord, run_label: str, several_gpus: bool) -> str:
    """A run over several GPUs (`--gpus`, torchrun) tags each case with its own GPU and
    host: those cases keep apart, labelled 'NAME #index @ host'."""
    gpu = record.gpu
    if not several_gpus or gpu is None:
        return run_label
    label = f"{gpu.name or run_label} #{gpu.index}"
    return f"{label} @ {record.host}" if record.host else label


def _several_gpus(doc: ResultsDoc) -> bool:
    seen = {(c.host, c.gpu.index, c.gpu.uuid) for c in doc.cases if c.gpu is not None}
    return len(seen) > 1


def merge(docs: list[ResultsDoc]) -> Merged:
    if not docs:
        raise ReportError("no results documents to report on")
    by_key: dict[tuple[str, str], MergedCase] = {}
    replaced = 0
    labels: list[str] = []
    label_doc: dict[str, int] = {}
    for run_index, (doc, run_label) in enumerate(zip(docs, run_labels(docs), strict=True)):
        several = _several_gpus(doc)
        for record in doc.cases:
            label = _case_label(record, run_label, several)
            labels.append(label)
            label_doc.setdefault(label, run_index)
            key = (record.id, label)
            replaced += key in by_key
            # A replaced key keeps its first position, as a dict update does.
            by_key[key] = MergedCase(record, label, run_index)
    cases = list(by_key.values())
    if not cases:
        raise ReportError("the results hold no cases")
    gpus = list(dict.fromkeys(labels))
    impls = list(dict.fromkeys(c.record.impl for c in cases))
    return Merged(
        docs=docs, cases=cases, gpus=gpus, replaced=replaced, impls=impls, label_doc=label_doc
    )


def choose_baseline(merged: Merged, requested: str | None) -> str:
    if requested is not None:
        if requested not in merged.impls:
            valid = ", ".join(merged.impls)
            raise ReportError(f"--baseline {requested!r} is not in the results (present: {valid})")
        return requested
    for name in _DEFAULT_BASELINES:
        if name in merged.impls:
            return name
    return merged.impls[0]
