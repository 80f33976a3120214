"""Hostile files: results files for `report` and `compare`, journals and plan.json for
`--resume`, and output paths nobody can write. They start from a good run folder (`base`,
made once by attack.py) and break one thing each."""

from __future__ import annotations

import copy
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from core import BAD_INPUT, FAST, RAN, Attack, Step, shows

HOSTILE = "[/x] [red]r[/red] [[group]] <img src=x onerror=alert(1)> </script> a|b"
HTML_BAD = ("<img src=x onerror", "</script><script")


def _raw_html(names: tuple[str, ...]) -> Callable[[Path, str], list[str]]:
    """A check: none of the files `names` (in the work folder) holds raw injected HTML."""

    def check(work: Path, _output: str) -> list[str]:
        found = []
        for name in names:
            try:
                text = (work / name).read_text(errors="replace")
            except OSError:
                continue
            found += [f"{name} holds raw {bad!r}" for bad in HTML_BAD if bad in text]
        return found

    return check


def _no_tmp(name: str) -> Callable[[Path, str], list[str]]:
    def check(work: Path, _output: str) -> list[str]:
        left = [p.name for p in work.glob(name + "*.tmp")] + [
            p.name for p in work.glob(name + ".tmp*")
        ]
        return [f"left behind: {', '.join(sorted(set(left)))}"] if left else []

    return check


# ---- results files --------------------------------------------------------------------


def _doc_writer(doc: object | bytes) -> Callable[[Path], None]:
    def setup(work: Path) -> None:
        p = work / "r.json"
        p.write_bytes(doc if isinstance(doc, bytes) else json.dumps(doc).encode())

    return setup


def _pair(name: str, doc: object | bytes, base_json: str, expect: frozenset[int],
          commands: tuple[str, ...] = ("report", "compare")) -> list[Attack]:  # fmt: skip
    out = []
    for command in commands:
        if command == "report":
            argv = ["report", "{d}/r.json", "-o", "{d}/r.html", "--plotlyjs", "cdn"]
            ok = expect | ({0} if expect != BAD_INPUT else set())
        else:
            argv = ["compare", base_json, "{d}/r.json", "--markdown", "{d}/m.md"]
            ok = expect | ({0, 1} if expect != BAD_INPUT else set())
        out.append(Attack("results files", f"{command}: {name}", [Step(argv, frozenset(ok))],
                          _doc_writer(doc), checks=[_raw_html(("r.html", "m.md"))]))  # fmt: skip
    return out


def _wrong_type(value: object) -> object:
    # A null string field (backend, derived) gets an object: a string would be valid there.
    return {"nested": [HOSTILE]} if value is None or isinstance(value, str) else HOSTILE


def results_attacks(quick: bool, base_json: str) -> list[Attack]:
    doc = json.loads(Path(base_json).read_text())
    raw = Path(base_json).read_bytes()
    a: list[Attack] = []
    a += _pair("binary file", bytes(range(256)) * 64, base_json, BAD_INPUT)
    for frac in (0.1, 0.5, 0.999) if not quick else (0.5,):
        a += _pair(f"truncated at {frac:.1%}", raw[: int(len(raw) * frac)], base_json, BAD_INPUT)
    a += _pair("deeply nested list", b"[" * 200000 + b"]" * 200000, base_json, BAD_INPUT)
    nested = json.dumps({**doc, "cases": "@"}).replace('"@"', "[" * 5000 + "]" * 5000).encode()
    a += _pair("cases nested 5000 deep", nested, base_json, BAD_INPUT)
    for top, value in [("run", "x"), ("env", 5), ("cases", {}), ("cases", [1]), ("schema", "other"),
                       ("cases", None), ("run", None)]:  # fmt: skip
        d = copy.deepcopy(doc)
        d[top] = value
        a += _pair(f"{top} = {value!r}", d, base_json, BAD_INPUT)
    for top in ("cases", "schema") if not quick else ("cases",):
        d = copy.deepcopy(doc)
        del d[top]
        a += _pair(f"no {top}", d, base_json, BAD_INPUT)
    d = copy.deepcopy(doc)
    d["run"]["suites"] = "abc"
    a += _pair("run.suites a string", d, base_json, BAD_INPUT)
    for doc_value in ([], None, "s", 3):
        a += _pair(f"document {doc_value!r}", doc_value, base_json, BAD_INPUT)
    keys = list(doc["cases"][0])
    # One command per mutation, alternating: both read files through load_results.
    for i, key in enumerate(keys):
        one, other = (("report",), ("compare",))[:: 1 if i % 2 else -1]
        d = copy.deepcopy(doc)
        d["cases"][0][key] = _wrong_type(d["cases"][0][key])
        a += _pair(f"case 0 {key} of a wrong type", d, base_json, BAD_INPUT, one)
        d = copy.deepcopy(doc)
        if i % 2:
            del d["cases"][1][key]
        else:
            d["cases"][2][key] = None
        how = "without" if i % 2 else "null:"
        a += _pair(f"case {1 if i % 2 else 2} {how} {key}", d, base_json, BAD_INPUT | RAN, other)
    for sub, value in [("median", "fast"), ("median", None), ("samples", ["a", "b"]), ("n", "3"),
                       ("samples", "1,2"), ("stdev", [1])]:  # fmt: skip
        d = copy.deepcopy(doc)
        d["cases"][0]["latency_ms"][sub] = value
        a += _pair(f"latency_ms.{sub} = {value!r}", d, base_json, BAD_INPUT)
    d = copy.deepcopy(doc)
    d["cases"][0]["impl"] = 7
    a += _pair("impl an int", d, base_json, BAD_INPUT)
    # Valid files with hostile text: they must load, and nothing may reach a page raw.
    d = copy.deepcopy(doc)
    for c in d["cases"]:
        c["impl"], c["error"], c["status"] = HOSTILE, HOSTILE, "error"
        c["backend"] = HOSTILE
    a += _pair("hostile impl, error and backend text", d, base_json, RAN)
    d = copy.deepcopy(doc)
    d["run"]["argv"] = ["fa-bench", HOSTILE]
    d["env"]["hostname"] = HOSTILE
    a += _pair("hostile run and env text", d, base_json, RAN)
    # Nothing comparable: compare must not pass the gate.
    d = copy.deepcopy(doc)
    for c in d["cases"]:
        c["status"], c["latency_ms"], c["error"] = "error", None, "x"
        c["tflops"] = c["gbps_model"] = None
    a.append(Attack("results files", "compare: no usable latency on either side",
                    [Step(["compare", "{d}/r.json", "{d}/r.json"], BAD_INPUT)],
                    _doc_writer(d)))  # fmt: skip
    return a


# ---- journals and plan.json for --resume ----------------------------------------------


def _interrupted_copy(base: Path, edit: Callable[[Path], None]) -> Callable[[Path], None]:
    """Copy the base run folder to work/out as an interrupted run (no results yet), then
    break it with `edit`."""

    def setup(work: Path) -> None:
        out = work / "out"
        shutil.copytree(base, out)
        for name in ("results.json", "results.csv", "report.html", ".lock", "run.lock"):
            (out / name).unlink(missing_ok=True)
        edit(out)

    return setup


def _journal_edit(fn: Callable[[bytes], bytes]) -> Callable[[Path], None]:
    def edit(out: Path) -> None:
        j = out / "journal.jsonl"
        j.write_bytes(fn(j.read_bytes()))

    return edit


def _insert(line: bytes, where: str) -> Callable[[bytes], bytes]:
    def fn(data: bytes) -> bytes:
        lines = data.splitlines(keepends=True)
        at = {"start": 0, "middle": len(lines) // 2, "end": len(lines)}[where]
        return b"".join([*lines[:at], line + b"\n", *lines[at:]])

    return fn


def _resume_twice(name: str, base: Path, edit: Callable[[Path], None],
                  expect: frozenset[int] = frozenset({0}), keeps: str | None = "out"
                  ) -> Attack:  # fmt: skip
    steps = [Step(["run", "--resume", "{d}/out"], expect), Step(["run", "--resume", "{d}/out"],
                                                                expect)]  # fmt: skip
    return Attack("journals", name, steps, _interrupted_copy(base, edit), keeps=keeps)


def journal_attacks(quick: bool, base: Path) -> list[Attack]:
    lines = (base / "journal.jsonl").read_bytes().splitlines(keepends=True)
    last = len(lines[-1])
    first = json.loads(lines[0])
    a: list[Attack] = []
    cuts = [1, 2, 37, 300, last // 2, last - 1, last + 11, last + len(lines[-2]) // 3]
    for k in cuts[:3] if quick else cuts:
        a.append(_resume_twice(f"last {k} bytes cut", base, _journal_edit(lambda b, k=k: b[:-k])))
    for frac in (0.23, 0.61) if not quick else ():
        a.append(_resume_twice(f"cut at {frac:.0%} of the file", base,
                               _journal_edit(lambda b, f=frac: b[: int(len(b) * f)])))  # fmt: skip
    unknown = dict(first, status="exploded")
    stranger = dict(first, id="naive/fwd/fp32/b9-hq9-hkv9-sq9-sk9-d9/full", seqlen_q=9)
    hostile = dict(first, error=HOSTILE, status="error")
    garbage: list[tuple[str, bytes]] = [
        ("an object of no record", b'{"bar": [2]}'), ("a list", b"[3, 4, 5]"), ("null", b"null"),
        ("a number", b"17"), ("a string", b'"journal"'), ("NUL bytes", b"\x00" * 40),
        ("invalid utf-8", b"\xff\xfe\xfd{"), ("a blank line", b"   "),
        ("unknown status", json.dumps(unknown).encode()),
        ("a case not in the plan", json.dumps(stranger).encode()),
        ("a record with hostile error text", json.dumps(hostile).encode()),
        ("a 2 MB line", b'{"id": "' + b"x" * 2_000_000 + b'"}'),
    ]  # fmt: skip
    for i, (what, line) in enumerate(garbage[:3] if quick else garbage):
        where = ("start", "middle", "end")[i % 3]
        ok = frozenset({0, 1}) if "hostile" in what else frozenset({0})
        a.append(_resume_twice(f"garbage line ({what}) at the {where}", base,
                               _journal_edit(_insert(line, where)), ok))  # fmt: skip
    a.append(_resume_twice("a record twice", base, _journal_edit(lambda b: b + b.splitlines(
        keepends=True)[0])))  # fmt: skip
    err = dict(first, status="error", error="later failure", latency_ms=None)
    a.append(_resume_twice("a case ok then error", base,
                           _journal_edit(lambda b: b + json.dumps(err).encode() + b"\n"),
                           frozenset({0, 1})))  # fmt: skip
    a.append(_resume_twice("no journal", base, lambda o: (o / "journal.jsonl").unlink()))
    a.append(_resume_twice("empty journal", base, _journal_edit(lambda b: b"")))
    if not quick:
        a.append(_resume_twice("journal is a folder", base, lambda o: (
            (o / "journal.jsonl").unlink(), (o / "journal.jsonl").mkdir())[-1],
            frozenset({2}), keeps=None))  # fmt: skip

    # plan.json broken: the resume must refuse it (exit 2), not crash.
    def plan_edit(fn: Callable[[dict], object]) -> Callable[[Path], None]:
        def edit(out: Path) -> None:
            p = out / "plan.json"
            p.write_text(json.dumps(fn(json.loads(p.read_text()))))

        return edit

    for what, fn in [("run null", lambda d: {**d, "run": None}),
                     ("no cases", lambda d: {k: v for k, v in d.items() if k != "cases"}),
                     ("cases a string", lambda d: {**d, "cases": "x"}),
                     ("a case with seqlen -1", lambda d: {**d, "cases": [
                         {**d["cases"][0], "seqlen_q": -1}, *d["cases"][1:]]}),
                     ("a list", lambda d: [d])]:  # fmt: skip
        a.append(Attack("journals", f"plan.json: {what}", [Step(["run", "--resume", "{d}/out"])],
                        _interrupted_copy(base, plan_edit(fn))))  # fmt: skip
    a.append(
        Attack(
            "journals",
            "plan.json: binary",
            [Step(["run", "--resume", "{d}/out"])],
            _interrupted_copy(base, lambda o: (o / "plan.json").write_bytes(b"\x89\x00")),
        )
    )
    return a


# ---- output paths ---------------------------------------------------------------------


def _paths_setup(work: Path) -> None:
    (work / "file.txt").write_text("a file\n")
    ro = work / "ro"
    ro.mkdir()
    ro.chmod(0o555)  # root ignores it: on root the run may succeed (exit 0)
    (work / "dir").mkdir()
    (work / "dir" / "x").write_text("not empty")
    os.mkfifo(work / "fifo")
    (work / "[" / "x]").mkdir(parents=True)  # "[/x]" as a path: a folder "[" and "x]"
    (work / "[" / "x]" / "file.txt").write_text("a file whose folder is markup\n")


def path_attacks(quick: bool, base_json: str) -> list[Attack]:
    run = ["run", "-s", "smoke", "-i", "naive", "-m", "fwd", "--seqlen", "32", "--no-causal",
           *FAST]  # fmt: skip
    sweep = ["sweep", "--device", "cpu", "-s", "smoke", "-m", "fwd", "--seqlen", "32",
             "--max-time", "0.05"]  # fmt: skip
    # Never a device file: a page written by rename replaces /dev/full with a regular file.
    bad = ["{d}/file.txt", "{d}/file.txt/sub", "/proc/x", "/sys/x", "{d}/[/x]/file.txt/y",
           "{d}/fifo"]  # fmt: skip
    a: list[Attack] = []
    for p in bad[:2] if quick else bad:
        marked = [shows(p)] if "[/x]" in p else []
        for argv in (run, sweep):
            a.append(Attack("output paths", f"{argv[0]} -o {p}", [Step([*argv, "-o", p])],
                            _paths_setup, checks=list(marked)))  # fmt: skip
    a.append(
        Attack(
            "output paths",
            "run -o read-only folder (chmod 555)",
            [Step([*run, "-o", "{d}/ro/out"], BAD_INPUT | {0})],
            _paths_setup,
        )
    )
    a.append(
        Attack(
            "output paths",
            "run -o a non-empty folder that is no run",
            [Step([*run, "-o", "{d}/dir"], BAD_INPUT | {0})],
            _paths_setup,
        )
    )
    a.append(Attack("output paths", "default ./fa-bench-out is a file", [Step(run)],
                    lambda w: (w / "fa-bench-out").write_text("a file")))  # fmt: skip
    # {d}/fifo stands for a device file (as root, a page renamed over /dev/full replaced it).
    for p in ["{d}/dir", "/proc/x/r.html", "{d}/file.txt/r.html", "{d}/[/x]/file.txt/r.html",
              "{d}/fifo"]:  # fmt: skip
        a.append(Attack("output paths", f"report -o {p}",
                        [Step(["report", base_json, "-o", p, "--plotlyjs", "cdn"])],
                        _paths_setup, checks=[_no_tmp("dir"), *([shows(p)] if "[" in p
                                                                 else [])]))  # fmt: skip
    return a
