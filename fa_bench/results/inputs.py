"""Read any results input: a results.json, a run folder holding one, or a report page.

`fa-bench report` and `fa-bench compare` both take these, so a page shared in chat can be
read back as data. Every path yields a list of checked fa-bench/1 documents, `ResultsDoc`s
(a report page that merged several runs holds several).
"""

from __future__ import annotations

import os
from pathlib import Path

from fa_bench.results.record import ResultsDoc, ResultsError
from fa_bench.results.schema import parse_json

RESULTS_NAME = "results.json"
REPORT_NAME = "report.html"
_HTML_SUFFIXES = (".html", ".htm")


def load_any(path: str | os.PathLike) -> list[ResultsDoc]:
    """The results documents in a results.json, a run folder or a report page.

    A folder is read through its results.json, or its report.html when it has no
    results.json. A file is a report page when its name ends in .html/.htm or its text
    starts with '<'; otherwise it is read as JSON: one document, or a list of them.
    Raises ResultsError with the path in the message.
    """
    p = Path(path)
    try:
        if p.is_dir():
            if (p / RESULTS_NAME).is_file():
                p = p / RESULTS_NAME
            elif (p / REPORT_NAME).is_file():
                p = p / REPORT_NAME
            else:
                raise ResultsError(f"{p}: folder holds neither {RESULTS_NAME} nor {REPORT_NAME}")
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ResultsError(f"{p}: no such file or folder") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ResultsError(f"{p}: cannot read: {exc}") from None
    if p.suffix.lower() in _HTML_SUFFIXES or text.lstrip().startswith("<"):
        # Imported here: the page reader lives with the report builder.
        from fa_bench.reports.embed import extract_results

        return extract_results(text, source=str(p))
    data = parse_json(text, str(p))
    if isinstance(data, list):
        if not data:
            raise ResultsError(f"{p}: an empty list holds no results documents")
        return [ResultsDoc.from_json(doc, source=f"{p} (run {i})") for i, doc in enumerate(data)]
    return [ResultsDoc.from_json(data, source=str(p))]


def load_many(paths: list[str | os.PathLike]) -> list[ResultsDoc]:
    """All documents of several inputs, in order; the first bad input raises."""
    docs: list[ResultsDoc] = []
    for path in paths:
        docs.extend(load_any(path))
    return docs
