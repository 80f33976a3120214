"""How the command line looks to a new user: the version, the help's placeholders and
click's own usage errors in the same plain `error:` style as ours.

Typer (0.29) shows every option's Python type in angle brackets (`<bool>` beside a flag,
`<list[str]>`) and a required argument in braces (`{results}`); a bad flag value comes in a
Rich box with click's wording, while our own mistakes are one `error:` line. cli.py's group
calls these so every command, present or future, gets the same treatment.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Sequence
from pathlib import Path
from typing import Any, get_args

import typer
from typer.core import TyperArgument

# a value's Python type → the help's placeholder (click's words, shorter)
_TYPE_NAMES = {int: "INT", float: "NUMBER", str: "TEXT", Path: "PATH", bool: "BOOL"}


def version() -> str:
    """The installed distribution's version; the package's own when run from a checkout
    that is not installed."""
    try:
        return importlib.metadata.version("fa-bench")
    except importlib.metadata.PackageNotFoundError:
        from fa_bench import __version__

        return __version__


def print_version(value: bool) -> None:
    """--version's callback: `fa-bench <version>` on stdout, exit 0."""
    if value:
        typer.echo(f"fa-bench {version()}")
        raise typer.Exit(0)


def _placeholder(param: Any) -> str:
    """A plain placeholder for a parameter's value: '' for a flag, the choices for a closed
    one, else the type's name in capitals (as click writes them)."""
    if getattr(param, "is_flag", False) or getattr(param, "count", False):
        return ""
    desc = getattr(param, "type_descriptor", None)  # Typer's own view of the annotation
    choices = getattr(desc, "choices", None)
    many = bool(getattr(desc, "is_list", False))
    if choices:
        label = "|".join(str(getattr(c, "value", c)) for c in choices)
        return f"{label}[,...]" if many else label
    kind = getattr(desc, "annotation", str)
    if many and get_args(kind):
        kind = get_args(kind)[0]
    return _TYPE_NAMES.get(kind, getattr(kind, "__name__", "VALUE").upper())


class _PlainArgument(TyperArgument):
    """A positional argument shown as click shows one: `RESULTS...`, its type in capitals."""

    def display_type_rich(self, ctx: Any) -> str | None:
        return _placeholder(self)

    def _usage_display_name(self) -> str:
        name = (self.metavar or self.name or "arg").upper()
        name = name if self.required else f"[{name}]"
        return f"{name}..." if self.nargs != 1 else name


def tidy_params(params: Sequence[Any]) -> None:
    """Give every option without a metavar a plain one and every argument the plain
    display (idempotent: called each time the params are asked for)."""
    for param in params:
        if isinstance(param, TyperArgument):
            if type(param) is TyperArgument:  # only the plain class: a subclass keeps its own
                param.__class__ = _PlainArgument
        elif param.metavar is None:
            param.metavar = _placeholder(param)


def is_usage_error(exc: BaseException) -> bool:
    """A click usage error (bad value, unknown option, missing value or argument), from
    click or the copy Typer vendors (typer._click); not 'no arguments: show the help'."""
    names = {(c.__module__.split(".")[0], c.__name__) for c in type(exc).__mro__}
    if any(name == "NoArgsIsHelpError" for _, name in names):
        return False
    return ("click", "UsageError") in names or ("typer", "UsageError") in names


# pydantic's error types (Typer 0.29 coerces values with it) → what the value is not
_NOT_A = {
    "int_parsing": "an integer",
    "int_from_float": "an integer",
    "float_parsing": "a number",
    "bool_parsing": "true or false",
}


def _flag(exc: Any) -> str:
    param = getattr(exc, "param", None)
    opts = [o for o in getattr(param, "opts", ()) if o.startswith("--")]
    return opts[0] if opts else str(getattr(param, "name", "value"))


def _value_message(exc: Any) -> str | None:
    """A bad value's message from the pydantic error behind Typer's BadParameter, in our
    words: the flag, the value and what it must be (never 'Input should be ...')."""
    cause = exc.__cause__
    errors = getattr(cause, "errors", None)
    if not callable(errors) or getattr(exc, "param", None) is None:
        return None
    first = errors()[0]
    kind, value = first.get("type", ""), first.get("input")
    msg = str(first.get("msg", "")).removeprefix("Value error, ").rstrip(".")
    if kind in _NOT_A:
        return f"{_flag(exc)}: {value!r} is not {_NOT_A[kind]}"
    if kind == "value_error":  # Typer's choice check: "'x' is not one of 'a', 'b'"
        return f"{_flag(exc)}: {msg}"
    return f"{_flag(exc)}: {value!r}: {msg.replace('Input should be', 'must be', 1)}"


def usage_error_message(exc: Any, command: str | None = None) -> str:
    """click's usage error as one plain line, and where to look: `--device: 'gpu' is not
    one of 'auto', 'cuda', 'cpu'; try 'fa-bench run --help'`. `command`: the subcommand
    being parsed, for errors that carry no context."""
    message = _value_message(exc)
    if message is None:
        message = " ".join(str(exc.format_message()).split()).rstrip(".")
        message = message[:1].lower() + message[1:]
    words, ctx = [], getattr(exc, "ctx", None)
    while ctx is not None:
        words.append(ctx.info_name or "")
        ctx = ctx.parent
    path = ["fa-bench", *reversed(words[:-1])]  # the root's own name may be anything
    if len(path) == 1 and command:
        path.append(command)
    return f"{message}; try '{' '.join(path)} --help'"
