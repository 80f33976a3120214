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
            "--heads", "8,16", "--kv-heads", "1, 2", "-i", "naive,sdpa", "-i", "triton"]  # fmt: skip
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
