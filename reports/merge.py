"""Merge results documents into one comparison: the report's one view of the cases.

Runs from different GPUs or nodes merge into one table of cases keyed by (case id, GPU):
each case gets a GPU label, so the same case measured on two cards stays two rows and the
figures draw one line per implementation and GPU. Two runs that measured the same cases on
the same GPU (a before/after on one machine) are told apart by their run names: each
label gets its run's name, 'CPU (runA)', and the runs show side by side. A case twice in
one run (or the same run given twice) keeps the later record.

The records are not reshaped: each merged case holds its `CaseRecord` as read, beside the
label and the index of the run it came from. Every figure and table imports this module;
nothing here imports them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
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


def run_name(doc: ResultsDoc) -> str:
    """A run's name: its output folder's name (the argv's --out or --resume), else when it
    started, else its id."""
    argv = [str(a) for a in doc.run.get("argv") or []]
    for i, arg in enumerate(argv):
        for flag in ("--out", "-o", "--resume"):
            value = arg[len(flag) + 1 :] if arg.startswith(flag + "=") else None
            if arg == flag and i + 1 < len(argv):
                value = argv[i + 1]
            if value:
                return Path(value.rstrip("/")).name or value
    return str(doc.run.get("started") or doc.run.get("id") or "run")


def _side_by_side(docs: list[ResultsDoc], labels: list[list[str]]) -> list[str]:
    """Per doc, the suffix its labels get: ' (run name)' where another run (a different
    run id) measured one of its cases under the same label; else ''."""
    first: dict[tuple[str, str], int] = {}
    clash: set[int] = set()
    for i, (doc, doc_labels) in enumerate(zip(docs, labels, strict=True)):
        for record, label in zip(doc.cases, doc_labels, strict=True):
            j = first.setdefault((record.id, label), i)
            if j != i and (docs[j].run.get("id") is None or
                           docs[j].run.get("id") != doc.run.get("id")):  # fmt: skip
                clash.update((i, j))
    names = [run_name(d) if i in clash else "" for i, d in enumerate(docs)]
    seen: dict[str, int] = {}
    for i, name in enumerate(names):  # two folders of one name: number the later ones
        if name:
            seen[name] = seen.get(name, 0) + 1
            names[i] = name if seen[name] == 1 else f"{name} #{seen[name]}"
    return [f" ({name})" if name else "" for name in names]


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
    doc_labels = []
    for doc, run_label in zip(docs, run_labels(docs), strict=True):
        several = _several_gpus(doc)
        doc_labels.append([_case_label(record, run_label, several) for record in doc.cases])
    suffixes = _side_by_side(docs, doc_labels)
    for run_index, doc in enumerate(docs):
        for record, base in zip(doc.cases, doc_labels[run_index], strict=True):
            label = base + suffixes[run_index]
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
