"""Issue 15, the CLI surface a new user meets first (items 6, 8, 9, 10): --version, lists
as repeated flags or comma lists, help without placeholders, one meaning per short flag,
usage errors in one style, JSON for list/env, 80-column logs, written files named."""

from __future__ import annotations

from typing import Any

import pytest
from typer.testing import CliRunner

from fa_bench import cli
from fa_bench.commands.lists import ListFlagError, choice_items, int_items, split_items

runner = CliRunner()


def _capture_run(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Replace run's core: the request the CLI built, nothing run."""
    seen: dict[str, Any] = {}

    def fake(req: Any, **_kw: Any) -> int:
        seen["req"] = req
        return 0

    monkeypatch.setattr(cli, "run_command", fake)
    return seen


# --- lists: the repeated flag and the comma list ------------------------------------------


def test_run_takes_comma_lists_and_repeated_flags_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _capture_run(monkeypatch)
    args = ["run", "--seqlen", "512,1024", "--seqlen", "2048", "-m", "fwd,bwd", "--dtype",
            "fp32", "--dtype", "bf16,fp16", "--head-dim", "64,128", "--batch", "1,2",
            "--heads", "8,16", "--kv-heads", "1, 2", "-i", "naive,sdpa",
            "-i", "triton"]  # fmt: skip
    result = runner.invoke(cli.app, args)
    assert result.exit_code == 0, result.output
    req = seen["req"]
    assert req.seqlens == (512, 1024, 2048)
    assert req.modes == ("fwd", "bwd")
    assert req.dtypes == ("fp32", "bf16", "fp16")
    assert req.head_dims == (64, 128) and req.batch == (1, 2) and req.heads == (8, 16)
    assert req.kv_heads == (1, 2)
    assert req.impls == ("naive", "sdpa", "triton")


def test_plugin_paths_are_not_split_at_commas(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _capture_run(monkeypatch)
    result = runner.invoke(cli.app, ["run", "--plugin", "dir,with,commas/my.py"])
    assert result.exit_code == 0, result.output
    assert seen["req"].plugins == ("dir,with,commas/my.py",)


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--mode", "fwd,sideways"], ["--mode", "'sideways'", "fwd, bwd, fwd_bwd"]),
        (["--dtype", "fp8"], ["--dtype", "'fp8'", "fp32, fp16, bf16"]),
        (["--seqlen", "512,lots"], ["--seqlen", "'lots'", "integer"]),
        (["--heads", "8,,16"], ["--heads", "empty element"]),
    ],
)
def test_bad_list_element_is_exit_2_naming_flag_and_element(
    monkeypatch: pytest.MonkeyPatch, args: list[str], words: list[str]
) -> None:
    _capture_run(monkeypatch)
    result = runner.invoke(cli.app, ["run", *args])
    assert result.exit_code == 2, result.output
    assert result.output.startswith("error: "), result.output
    for word in words:
        assert word in result.output


def test_sweep_takes_comma_lists_too(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}

    def fake(req: Any, **_kw: Any) -> int:
        seen["req"] = req
        return 0

    monkeypatch.setattr(cli, "sweep_command", fake)
    result = runner.invoke(cli.app, ["sweep", "--seqlen", "128,256", "--mode", "fwd"])
    assert result.exit_code == 0, result.output
    assert seen["req"].seqlens == (128, 256) and seen["req"].modes == ("fwd",)


def test_list_helpers() -> None:
    assert split_items("--x", None) == ()
    assert split_items("--x", [" a , b", "c"]) == ("a", "b", "c")
    assert int_items("--x", ["1,-2"]) == (1, -2)
    assert choice_items("--x", ["b"], ["a", "b"]) == ("b",)
    with pytest.raises(ListFlagError, match="--x: 'c' is not one of: a, b"):
        choice_items("--x", ["a,c"], ["a", "b"])
    with pytest.raises(ListFlagError, match="empty element"):
        split_items("--x", ["a,"])


# --- --version ----------------------------------------------------------------------------


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_version_prints_the_version_and_exits_0(flag: str) -> None:
    from fa_bench.commands.surface import version

    result = runner.invoke(cli.app, [flag])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == f"fa-bench {version()}"
    assert version()[:1].isdigit()


def test_version_falls_back_to_the_package_when_not_installed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import importlib.metadata

    import fa_bench
    from fa_bench.commands import surface

    def missing(_name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(_name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    assert surface.version() == fa_bench.__version__


def test_version_is_in_the_help() -> None:
    result = runner.invoke(cli.app, ["--help"], env={"COLUMNS": "200"})
    assert "--version" in result.output and "-V" in result.output


# --- help: no placeholders, one meaning per short flag ------------------------------------


def _commands() -> list[tuple[list[str], Any]]:
    """Every command path with its click command: the root, each command, each subcommand."""
    import typer

    root = typer.main.get_command(cli.app)
    out: list[tuple[list[str], Any]] = []

    def walk(path: list[str], cmd: Any) -> None:
        out.append((path, cmd))
        for name, sub in sorted(getattr(cmd, "commands", {}).items()):
            walk([*path, name], sub)

    walk([], root)
    assert {"run", "sweep", "report", "compare", "list", "env"} <= {p[0] for p, _ in out if p}
    return out


PLACEHOLDER = r"<[A-Za-z][\w\[\]|, .]*>|\{[A-Za-z_]+\}"


def test_no_command_help_shows_type_placeholders() -> None:
    import re

    for path, _cmd in _commands():
        result = runner.invoke(cli.app, [*path, "--help"], env={"COLUMNS": "250"})
        assert result.exit_code == 0, (path, result.output)
        found = re.findall(PLACEHOLDER, result.output)
        assert not found, f"fa-bench {' '.join(path)} --help shows {found}"


def test_each_short_flag_means_one_thing_across_the_cli() -> None:
    meanings: dict[str, set[str]] = {}
    for _path, cmd in _commands():
        for param in cmd.params:
            names = [*getattr(param, "opts", ()), *getattr(param, "secondary_opts", ())]
            longs = [n for n in names if n.startswith("--")]
            for short in (n for n in names if len(n) == 2 and n[0] == "-"):
                meanings.setdefault(short, set()).add(longs[0] if longs else param.name)
    clashes = {s: m for s, m in meanings.items() if len(m) > 1}
    assert not clashes, clashes
    assert meanings["-m"] == {"--mode"}


# --- usage errors: one plain line, exit 2 -------------------------------------------------


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["run", "--device", "gpu"], ["--device", "'gpu'", "'cpu'", "fa-bench run --help"]),
        (["run", "--gpu", "x"], ["--gpu", "'x'", "integer", "fa-bench run --help"]),
        (["run", "--out"], ["--out", "requires an argument", "fa-bench run --help"]),
        (["run", "--bogus"], ["--bogus", "fa-bench run --help"]),
        (["--bogus"], ["--bogus", "fa-bench --help"]),
        (["bogus"], ["bogus", "fa-bench --help"]),
        (["list", "things"], ["'things'", "suites", "impls", "fa-bench list --help"]),
        (["compare", "a"], ["current", "fa-bench compare --help"]),
        (["report", "x", "--plotlyjs", "web"], ["--plotlyjs", "'web'", "inline", "cdn"]),
    ],
)
def test_click_usage_errors_are_one_plain_error_line(args: list[str], words: list[str]) -> None:
    result = runner.invoke(cli.app, args, env={"COLUMNS": "80"})
    assert result.exit_code == 2, result.output
    out = result.output
    assert out.startswith("error: "), out
    assert "╭" not in out and "Usage:" not in out, out
    assert len(out.strip().splitlines()) == 1, out
    for word in words:
        assert word in out, (word, out)


# --- list and env: --json, and 80 columns without a cut value -----------------------------


def test_list_impls_json_comes_from_the_registry() -> None:
    import json

    from fa_bench import registry

    result = runner.invoke(cli.app, ["list", "impls", "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    by_name = {r["name"]: r for r in rows}
    assert set(by_name) >= set(registry.load())
    naive = by_name["naive"]
    assert naive["available"] is True and naive["reason"] is None
    assert "fwd" in naive["modes"] and "cpu" in naive["devices"] and naive["description"]


def test_list_suites_json() -> None:
    import json

    result = runner.invoke(cli.app, ["list", "suites", "--json"])
    assert result.exit_code == 0, result.output
    names = {r["name"] for r in json.loads(result.stdout)}
    assert {"smoke", "standard"} <= names


def test_env_json_has_versions_gpus_and_availability() -> None:
    import json

    result = runner.invoke(cli.app, ["env", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["env"]["torch"] and doc["env"]["python"] and isinstance(doc["env"]["gpus"], list)
    assert isinstance(doc["telemetry"], list)
    assert {"name": "naive", "available": True, "reason": None} in doc["impls"]


def _narrow(monkeypatch: pytest.MonkeyPatch) -> None:
    """A CI log: not a terminal, 80 columns."""
    from rich.console import Console

    monkeypatch.setattr(cli, "console", Console(width=80, force_terminal=False))


@pytest.mark.parametrize("args", [["list", "impls"], ["list", "suites"], ["env"]])
def test_list_and_env_fit_80_columns_without_cutting(
    monkeypatch: pytest.MonkeyPatch, args: list[str]
) -> None:
    from fa_bench import registry
    from fa_bench.suite.expand import builtin_suites

    _narrow(monkeypatch)
    result = runner.invoke(cli.app, args)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert "…" not in result.stdout
    names = builtin_suites() if args[-1] == "suites" else registry.load()
    for name in names:  # each name whole on one line
        assert any(f" {name} " in line for line in lines), name


# --- compare: 80 columns, units that scale, the files it wrote named ----------------------


def _two_runs(tmp_path: Any) -> tuple[Any, Any, list[str]]:
    from test_compare import run_doc, save

    base, cur = run_doc(1, 0.01), run_doc(2, 0.01, scale=1.3)
    ids = [c["id"] for c in base["cases"]]
    return save(tmp_path, "base.json", base), save(tmp_path, "cur.json", cur), ids


def test_compare_at_80_columns_keeps_each_case_id_on_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    from rich.console import Console

    base, cur, ids = _two_runs(tmp_path)
    monkeypatch.setattr(cli, "_wide_console", lambda: Console(width=80, force_terminal=False))
    result = runner.invoke(cli.app, ["compare", str(base), str(cur)])
    assert result.exit_code == 1, result.output  # 30% slower: the gate fails
    lines = result.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert "…" not in result.stdout and "e-0" not in result.stdout
    for case_id in ids:
        assert case_id in lines, case_id  # whole, on a line of its own
    assert " ms → " in result.stdout or " µs → " in result.stdout  # units that scale


def test_compare_names_the_files_it_wrote(tmp_path: Any) -> None:
    base, cur, _ = _two_runs(tmp_path)
    md, js = tmp_path / "summary.md", tmp_path / "verdicts.json"
    args = ["compare", str(base), str(cur), "--markdown", str(md), "--json", str(js)]
    result = runner.invoke(cli.app, args, env={"COLUMNS": "200"})
    assert md.is_file() and js.is_file()
    assert f"Markdown summary: {md}" in result.stdout
    assert f"verdicts (JSON): {js}" in result.stdout


def test_compare_figures_scale_their_units() -> None:
    from fa_bench.compare.core import Metric
    from fa_bench.compare.output import _figure

    assert _figure(Metric.TFLOPS, 2.5e-5) == "25.0 MFLOP/s"
    assert _figure(Metric.LATENCY, 0.0812) == "81.2 µs"
    assert _figure(Metric.GBPS, 0.412) == "412 MB/s"
    assert _figure(Metric.PEAK_MEM, 12.0) == "12.0 MiB"


# --- report: several inputs need --out; the page written is named -------------------------


def _results_files(tmp_path: Any) -> list[Any]:
    import json

    from report_fixture import two_gpu_docs

    paths = []
    for i, doc in enumerate(two_gpu_docs()):
        path = tmp_path / f"r{i}.json"
        path.write_text(json.dumps(doc.to_json()), encoding="utf-8")
        paths.append(path)
    return paths


def test_report_merging_several_inputs_requires_out(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    a, b = _results_files(tmp_path)
    result = runner.invoke(cli.app, ["report", str(a), str(b), "--plotlyjs", "cdn"])
    assert result.exit_code == 2, result.output
    assert result.output.startswith("error: ") and "--out" in result.output
    assert not (tmp_path / "report.html").exists()  # nothing written where nobody asked


def test_report_names_the_page_and_counts_in_words(tmp_path: Any) -> None:
    a, b = _results_files(tmp_path)
    out = tmp_path / "ab.html"
    args = ["report", str(a), str(b), "-o", str(out), "--plotlyjs", "cdn"]
    result = runner.invoke(cli.app, args, env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    assert f"report: {out} (" in result.stdout and "2 runs)" in result.stdout
    single = runner.invoke(cli.app, ["report", str(a), "--plotlyjs", "cdn"],
                           env={"COLUMNS": "300"})  # fmt: skip
    assert single.exit_code == 0, single.output
    assert f"report: {a.with_name('report.html')}" in single.stdout
    assert "1 run)" in single.stdout and "run(s)" not in single.stdout


def test_plural() -> None:
    from fa_bench.words import plural

    assert plural(1, "run") == "1 run" and plural(2, "run") == "2 runs"
    assert plural(1, "entry", "entries") == "1 entry"
    assert plural(0, "entry", "entries") == "0 entries"


def test_compare_fail_on_takes_a_comma_list(tmp_path: Any) -> None:
    base, cur, _ = _two_runs(tmp_path)
    ok = runner.invoke(cli.app, ["compare", str(base), str(base), "--fail-on", "new,missing",
                                 "--fail-on", "ambiguous"])  # fmt: skip
    assert ok.exit_code == 0, ok.output
    bad = runner.invoke(cli.app, ["compare", str(base), str(cur), "--fail-on", "new,worse"])
    assert bad.exit_code == 2, bad.output
    assert bad.output.startswith("error: --fail-on: 'worse' is not one of: slower, status")


def test_counted_nouns_in_messages_agree_with_their_count(tmp_path: Any) -> None:
    from fa_bench.results.files import JournalScan

    one = JournalScan(bad=[(3, "not JSON")]).warning(tmp_path / "journal.jsonl")
    assert one is not None and "skipped 1 unreadable line (" in one and "(s)" not in one
    two = JournalScan(bad=[(3, "x"), (5, "y")]).warning(tmp_path / "journal.jsonl")
    assert two is not None and "skipped 2 unreadable lines (" in two


def test_env_gpu_table_keeps_name_and_uuid_whole_at_80_columns() -> None:
    from rich.console import Console

    from fa_bench.commands import info

    gpu = {"index": 0, "name": "NVIDIA H200", "uuid": "GPU-1f2e3d4c-5b6a-7980-a1b2-c3d4e5f60718",
           "memory_bytes": 150 * 2**30, "sm_count": 132, "compute_capability": "9.0",
           "l2_bytes": 60 * 2**20}  # fmt: skip
    env = {"hostname": "node-1", "torch": "2.13.0", "gpus": [gpu, {**gpu, "index": 1}]}
    doc = {"env": env, "telemetry": [{"index": None, "available": False, "reason": "no NVML"}],
           "impls": [{"name": "sdpa-cudnn", "available": True, "reason": None}]}  # fmt: skip
    console = Console(width=80, force_terminal=False, record=True)
    info.print_env(console, doc)
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "…" not in text
    assert text.count(gpu["uuid"]) == 2 and text.count("NVIDIA H200") == 2


def test_a_closed_pipe_is_a_quiet_exit_not_an_internal_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from fa_bench.commands import info

    def closed(*_a: Any, **_kw: Any) -> None:
        raise BrokenPipeError(32, "Broken pipe")  # `fa-bench list suites | head -1`

    monkeypatch.setattr(info, "print_suites", closed)
    result = runner.invoke(cli.app, ["list", "suites"])
    assert result.exit_code == 1
    assert "internal error" not in result.output
