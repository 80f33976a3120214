"""Results embedded in a page survive the round trip and cannot break out of the page."""

from __future__ import annotations

import pytest

from fa_bench.reports.embed import embed_json, extract_results
from fa_bench.results.record import ResultsDoc, ResultsError


def doc(name: str) -> ResultsDoc:
    return ResultsDoc(run={"id": "r", "suites": [{"name": name}]}, env={"hostname": "h"}, cases=[])


def test_round_trip_with_hostile_strings() -> None:
    evil = "</script><script>alert(1)</script>&amp;"
    html = "<html><body>" + embed_json([doc(evil), doc("b")]) + "</body></html>"
    assert html.count("</script>") == 1  # only the element's own end tag
    back = extract_results(html)
    assert back[0].run["suites"][0]["name"] == evil
    assert len(back) == 2


def test_not_a_report() -> None:
    with pytest.raises(ResultsError, match="no embedded fa-bench results"):
        extract_results("<html></html>", source="page.html")
