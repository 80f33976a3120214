"""Issue 16, items 3, 12 and 13: text from the data is shown as written in every output.

Square brackets must not be read as Rich markup (a closing tag must neither vanish nor raise
MarkupError), Markdown cells must not carry HTML or Markdown into a pull-request comment,
the report's plotly text is escaped exactly once, and `report -o FOLDER` leaves nothing.
"""

from __future__ import annotations

import io
import json
import os
import re
from pathlib import Path

import markupsafe
import pytest
from report_fixture import _env, _run, document, make_case
from rich.console import Console
from typer.testing import CliRunner

import fa_bench.cli as cli
from fa_bench import registry
from fa_bench.case import Case, DType, Mode, Status
from fa_bench.compare.core import compare_docs
from fa_bench.compare.output import markdown, terminal, to_json
from fa_bench.console import RunProgress, failures_table, summary_table
from fa_bench.errors import print_error
from fa_bench.reports.build import render, write_report
from fa_bench.results.record import ResultsDoc

runner = CliRunner()

# Rich tags of every kind (closing, bare closing, doubled, styled, a link, an escaped one),
# and a trailing backslash, which rich.markup.escape doubles.
HOSTILE = ["zz[/q]", "[/]", "[[squad]]", "[blue]b[/blue]", "[italic]i", "[link=http://e]l",
           "\\[dim]", "end\\"]  # fmt: skip
TEXT = " ".join(HOSTILE)
IMPL = "odd[/impl][green]"  # a plugin's implementation name is data too


def _console() -> Console:
    return Console(file=io.StringIO(), width=400, color_system=None, soft_wrap=True)


def _shown(console: Console) -> str:
    return console.file.getvalue()  # type: ignore[attr-defined]


def _flat(text: str) -> str:
    """Table cells fold and pad; compare the text with its whitespace squeezed out."""
    return re.sub(r"[\s│┃|]+", "", text)


def _case(impl: str = IMPL, seqlen: int = 48) -> Case:
    return Case(impl=impl, mode=Mode.FWD, dtype=DType.FP32, batch=1, heads_q=2, heads_kv=2,
                seqlen_q=seqlen, seqlen_k=seqlen, head_dim=16, causal=False)  # fmt: skip


def _doc(impl: str, error: str, status: str = "error", **run: object) -> ResultsDoc:
    cases = [make_case(impl, 1024, median=2.0), make_case(impl, 2048, status, error=error)]
    return document({**_run("r"), **run}, _env('GPU [/g] "quoted" & co', "host", 80), cases)


# --- the terminal: errors, progress lines, tables ------------------------------------------


@pytest.mark.parametrize("text", HOSTILE)
def test_print_error_shows_the_message_as_written(text: str) -> None:
    console = _console()
    assert print_error(console, f"--out /tmp/{text}: bad", 2) == 2
    print_error(console, f"suite key {text}")  # the text last: a trailing backslash too
    assert _shown(console) == f"error: --out /tmp/{text}: bad\nerror: suite key {text}\n"


def test_progress_lines_and_tables_show_impl_names_and_errors_as_written() -> None:
    console = _console()
    case = _case()
    with RunProgress(console, total=2) as progress:
        progress.start(case)  # the description column: a case label
        progress.done(case, Status.ERROR, f"RuntimeError: {TEXT}\nsecond line")
        progress.done(_case(seqlen=64), Status.OK, None, warnings=[f"clock {TEXT}"])
    shown = _shown(console)
    assert f"error {case.label}: RuntimeError: {TEXT}" in shown
    assert f"telemetry {_case(seqlen=64).label}: clock {TEXT}" in shown

    doc = _doc(IMPL, f"RuntimeError: {TEXT}")
    for table in (summary_table(doc.cases), failures_table(doc.cases)):
        console = _console()
        console.print(table)
        assert IMPL in _shown(console)
    assert _flat(TEXT) in _flat(_shown(console))  # the failures table's message
    grouped = _console()  # over 40 cases: grouped by implementation
    grouped.print(summary_table(doc.cases * 21))
    assert IMPL in _shown(grouped)


def test_cli_errors_name_paths_keys_and_filters_as_written(tmp_path: Path) -> None:
    suite = tmp_path / "s[" / "x][[g]].toml"  # a path holding `[/x]`
    suite.parent.mkdir()
    suite.write_text('name = "s"\ndescription = "d"\nimpls = ["naive"]\n"[red]k[/q]" = 1\n')
    r = runner.invoke(cli.app, ["run", "--device", "cpu", "--suite", str(suite)])
    assert r.exit_code == 2, r.output
    assert "[red]k[/q]" in r.output and "Traceback" not in r.output
    assert f"{tmp_path}/s[/x][[g]].toml" in r.output.replace("\n", "")

    missing = tmp_path / "gone[/r]" / "[[run]]"
    r = runner.invoke(cli.app, ["run", "--resume", str(missing)])
    assert r.exit_code == 2 and "gone[/r]" in r.output and "[[run]]" in r.output, r.output

    r = runner.invoke(cli.app, ["report", str(tmp_path / "in[/p]put.json")])
    assert r.exit_code == 2 and "in[/p]put.json" in r.output, r.output

    base = tmp_path / "b[[base]].json"
    base.write_text(json.dumps(_doc("sdpa", "x").to_json()))
    r = runner.invoke(cli.app, ["compare", str(base), str(base), "--filter", "[/f]key=1"])
    assert r.exit_code == 2 and "[/f]key" in r.output, r.output
    r = runner.invoke(cli.app, ["compare", str(base), str(base), "--filter", "id=[bold]n[/]*"])
    assert r.exit_code == 2 and "[bold]n[/]*" in r.output, r.output


def test_an_internal_error_with_brackets_is_shown_once(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*args: object, **kwargs: object) -> int:
        raise RuntimeError("state [/s] and [[x]]")

    monkeypatch.setattr(cli, "run_command", boom)
    r = runner.invoke(cli.app, ["run"])
    assert r.exit_code == 1
    assert "RuntimeError: state [/s] and [[x]]" in r.output and "\\[" not in r.output


def _impl(name: str, description: str, why: str | None) -> registry.Impl:
    return registry.Impl(name=name, builder=lambda *a: None, description=description,
                         modes=frozenset(Mode), dtypes=frozenset(DType),
                         devices=frozenset({"cpu", "[/dev]"}),
                         availability=lambda: why)  # fmt: skip


def test_list_and_env_show_plugin_text_as_written(monkeypatch: pytest.MonkeyPatch) -> None:
    impls = {IMPL: _impl(IMPL, "uses [bold]x[/bold]", "needs [/lib]"),
             "plain": _impl("plain", "[[doubled]]", None)}  # fmt: skip
    monkeypatch.setattr(registry, "load", lambda plugins=(): impls)
    monkeypatch.setattr(cli, "console", Console(width=300))  # one line per table row
    r = runner.invoke(cli.app, ["list", "impls"])
    assert r.exit_code == 0, r.output
    out = _flat(r.output)
    for text in (IMPL, "uses[bold]x[/bold]", "[[doubled]]", "[/dev]"):
        assert _flat(text) in out
    monkeypatch.setattr("fa_bench.env.collect_env", lambda: {"gpus": [], "hostname": "[/h]"})
    r = runner.invoke(cli.app, ["env"])
    assert r.exit_code == 0, r.output
    assert "[/h]" in r.output and _flat("no: needs [/lib]") in _flat(r.output)


# --- compare: terminal, Markdown, JSON ------------------------------------------------------


def _comparison(impl: str, error: str):
    base, cur = _doc(impl, error="", status="ok"), _doc(impl, error)
    return compare_docs([base], [cur])


def test_compare_terminal_shows_case_ids_and_reasons_as_written() -> None:
    cmp = _comparison(IMPL, f"oom {TEXT}")
    console = _console()
    console.print(terminal(cmp))
    shown = _flat(_shown(console))
    assert _flat(IMPL) in shown and _flat(TEXT) in shown


HTML = '<svg onload="alert(2)"> </details> a|b & `tick` ![px](http://t/p.png) $x$'


def test_compare_markdown_cells_escape_html_markdown_and_pipes() -> None:
    impl = "im|p<b>`"
    cmp = _comparison(impl, HTML)
    text = markdown(cmp, baseline="base<i>.json", current="cur|rent.json")
    body = text.split("</details>")  # ours may close a <details>, the data must not
    assert len(body) <= 2
    outside_code = re.sub(r"(?<!`)(`+)(?!`).+?(?<!`)\1(?!`)", "", text)  # CommonMark spans
    assert "<svg" not in outside_code and "<b>" not in outside_code
    assert "<i>" not in outside_code and "<" not in outside_code.replace("p < alpha", "")
    assert '&lt;svg onload="alert\\(2\\)"&gt;' in text
    assert "&amp;" in text and "\\!\\[px\\]" in text and "\\$x\\$" in text
    for line in text.splitlines():
        if line.startswith("| ") and impl.split("|")[0] in line:
            # every row keeps its six columns: no unescaped pipe inside a cell
            assert len(re.findall(r"(?<!\\)\|", line)) == 7, line
            assert "| ``im\\|p<b>`/fwd/" in line  # a code span: shown as typed
    # the JSON stays the raw data
    doc = json.loads(to_json(cmp, baseline=["b"], current=["c"]))
    reasons = " ".join(r["reason"] for r in doc["cases"])
    assert HTML.split(" ")[0] in reasons and any(r["key"].startswith(impl) for r in doc["cases"])


# --- the report -----------------------------------------------------------------------------


_PLOTLY_ENTITIES = {"mu": "μ", "amp": "&", "lt": "<", "gt": ">", "nbsp": "\xa0", "times": "×",
                    "plusmn": "±", "deg": "°"}  # fmt: skip


def _as_plotly_shows(text: str) -> str:
    """plotly.js's convertEntities (svg_text_utils): the named entities above and numeric
    ones are decoded, anything else (`&quot;`) is left as typed."""

    def one(m: re.Match) -> str:
        inner = m.group(1)
        if inner.startswith("#"):
            return chr(int(inner[2:], 16) if inner[1] == "x" else int(inner[1:]))
        return _PLOTLY_ENTITIES.get(inner, m.group(0))

    return re.sub(r"&(#\d+|#x[\da-fA-F]+|[a-z]+);", one, text)


def test_report_legends_show_quotes_and_ampersands_once() -> None:
    impl = "ker\"nel's & <co> &quot;"
    page = render([_doc(impl, 'bad "value" & <tag>')], plotlyjs="cdn")
    found = re.search(r'id="fa-bench-figures">(.*?)</script>', page, re.S)
    assert found
    specs = json.loads(found.group(1))
    names = {t.get("name") for spec in specs.values() for t in spec["data"] if t.get("name")}
    assert impl in {_as_plotly_shows(n) for n in names}, names
    assert all("<" not in n for n in names)  # no tag from the data reaches plotly
    hovers = [h for spec in specs.values() for t in spec["data"] for h in t.get("text") or []
              if isinstance(h, str) and "bad" in h]  # fmt: skip
    assert hovers and all('bad "value" & <tag>' in _as_plotly_shows(h) for h in hovers)
    assert "<tag>" not in json.dumps(specs)
    head = page.split('id="fa-bench-results"')[0]  # the page's own HTML: escaped once too
    once = str(markupsafe.escape(impl))
    assert once in head and str(markupsafe.escape(once)) not in page


def test_the_speedup_hover_cannot_read_a_baseline_name_as_a_template() -> None:
    base = 'ref %{y} "v2" & co'
    cases = [make_case(impl, n, median=m) for impl, m in ((base, 2.0), ("fast", 1.0))
             for n in (1024, 2048)]  # fmt: skip
    doc = document(_run("r"), _env("GPU", "host", 80), cases)
    page = render([doc], baseline=base, plotlyjs="cdn")
    found = re.search(r'id="fa-bench-figures">(.*?)</script>', page, re.S)
    assert found
    (trace,) = [t for t in json.loads(found.group(1))["speedup"]["data"] if "hovertemplate" in t]
    assert "ref" not in trace["hovertemplate"] and "%{meta}" in trace["hovertemplate"]
    assert _as_plotly_shows(trace["meta"]) == base
    assert trace["colorbar"]["title"]["text"] == "× %{meta}" and "ref" not in trace["name"]


def test_report_to_a_folder_leaves_no_temp_file(tmp_path: Path) -> None:
    results = tmp_path / "run.json"
    results.write_text(json.dumps(_doc("sdpa", "x").to_json()))
    target = tmp_path / "pages"
    target.mkdir()
    r = runner.invoke(cli.app, ["report", str(results), "-o", str(target)])
    assert r.exit_code == 2 and str(target) in r.output, r.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pages", "run.json"]
    assert list(target.iterdir()) == []


def test_a_failed_page_write_removes_its_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full_disk(src: object, dst: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("fa_bench.reports.build.os.replace", full_disk)
    with pytest.raises(OSError):
        write_report([_doc("sdpa", "x")], tmp_path / "r.html", plotlyjs="cdn")
    assert list(tmp_path.iterdir()) == []


# --- end to end: a plugin whose name and exception text hold tags ---------------------------

PLUGIN = """
from fa_bench import registry


@registry.register("tag[/t]er", description="[u]d[/u]", devices=("cpu",))
def build(case, q, k, v):
    def fn(q, k, v):
        raise ValueError("kernel [/k] [magenta]m [[pair]] \\\\")

    return fn
"""


@pytest.mark.slow
def test_a_plugin_raising_tagged_text_is_a_recorded_error(tmp_path: Path) -> None:
    plugin = tmp_path / "markup_e2e_plugin.py"
    plugin.write_text(PLUGIN)
    out = tmp_path / "o[" / "o]ut"  # a path holding `[/o]`
    args = ["run", "--device", "cpu", "--plugin", str(plugin), "-i", "tag[/t]er", "-m", "fwd",
            "--dtype", "fp32", "--seqlen", "16", "--head-dim", "16", "--batch", "1",
            "--heads", "1", "--no-causal", "--out", str(out), "--max-time", "0.05",
            "--min-samples", "3", "--no-report"]  # fmt: skip
    r = runner.invoke(cli.app, args)
    assert r.exit_code == 1, r.output  # a failed case, not a crash
    assert "internal error" not in r.output and "MarkupError" not in r.output
    assert _flat("kernel [/k] [magenta]m [[pair]] \\") in _flat(r.output)  # progress, table
    cases = json.loads((out / "results.json").read_text())["cases"]
    assert cases and {c["impl"] for c in cases} == {"tag[/t]er"}
    assert all(c["status"] == "error" for c in cases)
    assert all("kernel [/k] [magenta]m [[pair]] \\" in c["error"] for c in cases)


def test_report_onto_a_fifo_is_refused_and_the_fifo_kept(tmp_path: Path) -> None:
    results = tmp_path / "run.json"
    results.write_text(json.dumps(_doc("sdpa", "x").to_json()))
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    r = runner.invoke(cli.app, ["report", str(results), "-o", str(pipe)])
    assert r.exit_code == 2 and "not a regular file" in r.output, r.output
    assert pipe.is_fifo()
