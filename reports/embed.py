"""Results data embedded in a report page, so a shared page can be read back.

A page holds one `<script type="application/json" id="fa-bench-results">` element whose
text is a JSON list of results documents (one per merged run), each exactly as
`ResultsDoc.to_json` writes it to results.json. `<`, `>` and `&` are
written as \\u escapes, so no string from the data can close the element or inject
markup; `json.loads` turns them back.
"""

from __future__ import annotations

import json
import re

from fa_bench.results.record import ResultsDoc, ResultsError
from fa_bench.results.schema import parse_json

SCRIPT_ID = "fa-bench-results"
_PATTERN = re.compile(
    r'<script type="application/json" id="' + SCRIPT_ID + r'">(.*?)</script>', re.S
)


def embed_json(docs: list[ResultsDoc]) -> str:
    data = [doc.to_json() for doc in docs]
    text = json.dumps(data, allow_nan=False, separators=(",", ":"))
    text = text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    return f'<script type="application/json" id="{SCRIPT_ID}">{text}</script>'


def extract_results(html: str, *, source: str = "report") -> list[ResultsDoc]:
    """The results documents embedded in a report page, checked as results.json is."""
    found = _PATTERN.search(html)
    if not found:
        raise ResultsError(f"{source}: no embedded fa-bench results (not an fa-bench report?)")
    docs = parse_json(found.group(1), f"{source}: embedded results")
    if not isinstance(docs, list) or not docs:
        raise ResultsError(f"{source}: embedded results must be a non-empty list of documents")
    return [ResultsDoc.from_json(doc, source=f"{source} (run {i})") for i, doc in enumerate(docs)]
