"""Hostile suite files: bad TOML, wrong types, unknown keys, absurd values, markup and
HTML in keys and names, empty and enormous grids. Each is `run --suite FILE`; a bad one
must exit 2, a good one run its (one or two tiny) cases."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from core import BAD_INPUT, FAST, RAN, Attack, Step, shows

# Tags between letters, so that a message that lost them (Rich read them) can be told apart.
MARKUP = ["k1[/x]k2", "k3[red]k4[/red]k5", "k6[[group]]k7", "k8[bold", "<script>alert(1)</script>",
          "a|b"]  # fmt: skip

GOOD = """name = "tiny"
description = "one case"
impls = "naive"
modes = "fwd"
dtypes = "fp32"
batch = 1
heads_q = 2
seqlens = 32
head_dims = 16
causal = false
"""


def _with(key: str, value: str) -> str:
    """GOOD with one key replaced (or added)."""
    lines = [ln for ln in GOOD.splitlines() if not ln.startswith(f"{key} =")]
    return "\n".join([*lines, f"{key} = {value}"]) + "\n"


def _writer(text: str | bytes, name: str = "s.toml") -> Callable[[Path], None]:
    def setup(work: Path) -> None:
        path = work / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(text, bytes):
            path.write_bytes(text)
        else:
            path.write_text(text, encoding="utf-8")

    return setup


def _suite(name: str, text: str | bytes, expect: frozenset[int] = BAD_INPUT,
           file: str = "s.toml", timeout_s: float = 60.0) -> Attack:  # fmt: skip
    argv = ["run", "--suite", f"{{d}}/{file}", *FAST, "-o", "{d}/out"]
    keeps = "out" if expect == RAN else None
    return Attack("suite files", name, [Step(argv, expect)], _writer(text, file), keeps,
                  timeout_s=timeout_s)  # fmt: skip


def suite_attacks(quick: bool) -> list[Attack]:
    a = [
        _suite("control: a good suite", GOOD, RAN),
        _suite("empty file", ""),
        _suite("binary", bytes(range(256)) * 4),
        _suite("invalid utf-8", GOOD.encode() + b"\xff\xfe\x80"),
        _suite("unterminated string", 'name = "x\n'),
        _suite("duplicate key", GOOD + 'name = "again"\n'),
        _suite("table then key clash", GOOD + "[name]\nx = 1\n"),
        _suite("group not an array", GOOD + "group = 5\n"),
        _suite("group of strings", GOOD + 'group = ["a", "b"]\n'),
        _suite("empty group table", GOOD + "[[group]]\n", frozenset({0, 1, 2})),
    ]
    wrong = {
        "impls": ["5", "[1, 2]", "{a = 1}", '"nope"', "[]", '[""]'],
        "modes": ['"sideways"', "[]", "1", '["fwd", 2]'],
        "dtypes": ['"fp8"', "true", "[]"],
        "batch": ["0", "-1", '"1"', "1.5", "inf", "nan", "9223372036854775807", "[]", "1e300"],
        "heads_q": ["0", "-2", "3.0", "nan", "4294967296", "[]"],
        "seqlens": ["0", "-64", '"64"', "64.5", "inf", "-inf", "nan", "100000000000000000",
                    "[]", "[[64]]", "true"],
        "head_dims": ["0", "-16", "true", "1e17", "[]", "nan"],
        "causal": ['"yes"', "1", "[]", "[true, 2]"],
        "name": ["5", "[]", '""'],
        "description": ["5", "{x = 1}"],
    }  # fmt: skip
    for key, values in wrong.items():
        for v in values[:2] if quick else values:
            a.append(_suite(f"{key} = {v}", _with(key, v)))
    a += [
        _suite("unknown top-level key", GOOD + "colour = 1\n"),
        _suite("unknown group key", GOOD + "[[group]]\nsqelens = 64\n"),
        _suite("tokens with batch", GOOD + "tokens = 64\n"),
        _suite("hidden not divisible", _with("heads_q", "0").replace("heads_q = 0", "hidden = 33")),
        _suite("heads_kv not a divisor", GOOD + "heads_kv = 3\n"),
        _suite("heads_kv > heads_q", GOOD + "heads_kv = 4\n"),
        _suite("seqlens_q without seqlens_k", _with("seqlens", "1").replace("seqlens = 1",
                                                                          "seqlens_q = 32")),
    ]  # fmt: skip
    for m in MARKUP[:2] if quick else MARKUP:
        folder = f"{m.replace('/', '_')}dir"
        marked = [
            (_suite(f"markup key {m!r}", GOOD + f'"{m}" = 1\n'), m),
            (_suite(f"markup group key {m!r}", GOOD + f'[[group]]\n"{m}" = 1\n'), m),
            (_suite(f"markup impl {m!r}", _with("impls", f'"{m}"')), m),
            (_suite(f"markup group name + bad key {m!r}",
                    GOOD + f'[[group]]\nname = "{m}"\nbatch = -1\n'), m),
            (_suite(f"markup folder {m!r}", "x = ", file=f"{folder}/s.toml"), folder),
        ]  # fmt: skip
        for attack, text in marked:
            attack.checks.append(shows(text))  # the message quotes the data as written
            a.append(attack)
        a.append(_suite(f"markup name {m!r} (valid)", _with("name", f'"{m}"'), RAN))
    a += [
        Attack("suite files", "missing file with markup in its name",
               [Step(["run", "--suite", "{d}/none/n1[/x]n2.toml", *FAST, "-o", "{d}/out"])],
               checks=[shows("n1[/x]n2.toml")]),
        Attack("suite files", "a folder as suite",
               [Step(["run", "--suite", "{d}/dir.toml", *FAST, "-o", "{d}/out"])],
               _writer("", "dir.toml/inner")),
        _suite("empty grid: seqlens = []", _with("seqlens", "[]")),
    ]  # fmt: skip
    big = ", ".join(str(16 * i) for i in range(1, 101))
    # 100 seqlens x 100 head_dims x 3 modes x 3 dtypes x ... : past any sane case limit.
    a.append(_suite("10^5-case grid", _with("seqlens", f"[{big}]")
                    .replace("head_dims = 16", f"head_dims = [{big}]")
                    .replace('modes = "fwd"', 'modes = ["fwd", "bwd", "fwd_bwd"]')
                    .replace('dtypes = "fp32"', 'dtypes = ["fp32", "fp16", "bf16"]'),
                    timeout_s=60))  # fmt: skip
    if not quick:
        a.append(_suite("10^6-case grid", _with("seqlens", f"[{big}]")
                        .replace("head_dims = 16", f"head_dims = [{big}]")
                        .replace("batch = 1", "batch = [" + ", ".join(map(str, range(1, 101)))
                                 + "]"), timeout_s=60))  # fmt: skip
    return a
