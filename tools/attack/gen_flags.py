"""Every command's flags with bad values (inf, nan, negative, huge, empty, markup text):
each must be refused with exit 2 before any case runs."""

from __future__ import annotations

from core import BAD_INPUT, Attack, Step, shows

X = "v1[/x]v2"  # a closing tag between letters: a message that lost it shows "v1v2"
BAD_NUMBERS = ["inf", "-inf", "nan", "-1", "0", "1e308", "", X, "99999999999999999999999"]
MARKUP = [X, "v3[red]v4", "v5[[group]]v6", "<img src=x onerror=alert(1)>"]

# A tiny valid run; each attack replaces one of its flags.
RUN_BASE = {"-s": "smoke", "-i": "naive", "-m": "fwd", "--seqlen": "32", "--max-time": "0.05",
            "--min-samples": "3", "--warmup": "0", "-o": "{d}/out"}  # fmt: skip
# --device cpu: without it a machine with no GPU refuses every sweep first (exit 2).
SWEEP_BASE = {"--device": "cpu", "-s": "smoke", "-m": "fwd", "--seqlen": "32",
              "--max-time": "0.05", "--min-samples": "3", "--warmup": "0",
              "-o": "{d}/out"}  # fmt: skip

RUN_FLAGS: dict[str, list[str]] = {
    "--warmup": [*BAD_NUMBERS[:3], "-1", "1e308", "", X],
    "--timeout": ["inf", "nan", "0", "-1", "1e308", ""],
    "--max-time": ["inf", "nan", "0", "-1", "1e308"],
    "--min-samples": ["-1", "0", "1", "99999999999999999999999", "nan", ""],
    "--target-noise": ["nan", "inf", "0", "-0.1", "1"],
    "--seqlen": ["0", "-1", "100000000000000000", "nan", "", X],
    "--batch": ["0", "-3", "9223372036854775807", "18446744073709551616"],
    "--heads": ["0", "-2", "4294967296"],
    "--head-dim": ["0", "-32", "1000000000"],
    "--kv-heads": ["0", "3", "-1"],
    "--seed": ["-1", "nan", "99999999999999999999999"],
    "--gpu": ["-1", "nan", "99999"],
    "--gpus": [X, "nan", "-1", "", "0,0", "99"],
    "--merge-timeout": ["inf", "nan", "-1"],
    "--impl": [X, "v7[red]nope", "", "<script>"],
    "-s": [X, "v8[red]nope[/red]v9", "", "no-such-suite"],
    "-m": ["sideways", X, ""],
    "--dtype": ["fp8", X],
    "--device": ["tpu", X],
    "--tuning-cache": ["{d}/t1[/x]t2/none/c.json", "/proc/x/c.json"],
    "--plugin": ["{d}/p1[/x]none.py", "no_such_module_[red]x", ""],
    "--resume": ["{d}/none", "{d}/r1[/x]r2", "/proc/self"],
}
SWEEP_FLAGS: dict[str, list[str]] = {
    "--block-m": ["0", "-16", "17", "99999999999"],
    "--block-n": ["0", "-16", X],
    "--warps": ["0", "-4", "3"],
    "--stages": ["0", "-1"],
    "--budget-minutes": ["inf", "nan", "-1", "0"],
    "--min-gain": ["nan", "inf", "-5"],
    "--compile-jobs": ["0", "-1", "99999999999"],
    "--warmup": ["inf", "nan"],
    "--timeout": ["inf", "nan"],
    "--max-time": ["inf", "nan"],
    "--resume": ["{d}/none", "{d}/r1[/x]r2", "/proc/self", "{d}/file.txt"],
}
COMPARE_FLAGS: dict[str, list[str]] = {
    "--threshold": ["nan", "inf", "-5%", X, "latency=", "foo=5%", "5%%", "", "1e309%"],
    "--filter": [X, "impl=w1[red]x", "|||", "=", "mode=[", ",,,", "nokey=x"],
    "--fail-on": ["bogus", X],
    "--metric": ["bogus", X],
    "--preset": ["bogus"],
    "--markdown": ["/proc/x/m.md", "{d}", "{d}/file.txt/m.md"],
    "--json": ["/proc/x/m.json", "{d}", "{d}/file.txt/m.json"],
}
REPORT_FLAGS: dict[str, list[str]] = {
    "--baseline": [X, "<script>", ""],
    "--plotlyjs": ["bogus", X],
    "-o": ["/proc/x/r.html", "{d}", "{d}/file.txt/r.html"],
}


def _argv(command: str, base: dict[str, str], flag: str, value: str) -> list[str]:
    if flag == "--resume":  # a resume takes its cases and options from the folder
        return [command, flag, value]
    rest = [x for k, v in base.items() if k != flag for x in (k, v)]
    tail = ["--no-report", "--no-telemetry"] if command == "run" else []
    return [command, *rest, *tail, flag, value]


# Values that may be fine (exit 0, or compare's 1): any exit but a traceback is accepted.
MAYBE_FINE = {("run", "--seed", "-1"), ("run", "--merge-timeout", "inf"),
              ("compare", "--filter", ",,,"), ("compare", "--filter", "|||"),
              ("run", "--gpus", "0,0"), ("run", "--seed", "99999999999999999999999"),
              ("sweep", "--compile-jobs", "0")}  # fmt: skip


def _attack(command: str, flag: str, value: str, argv: list[str], timeout_s: float) -> Attack:
    expect = BAD_INPUT | ({0, 1} if (command, flag, value) in MAYBE_FINE else set())
    # A refusal quotes the value as given: markup in it must not be eaten.
    checks = [shows(value)] if "[" in value and expect == BAD_INPUT else []
    return Attack("flags", f"{command} {flag} {value!r}", [Step(argv, frozenset(expect))],
                  _touch_file, checks=checks, timeout_s=timeout_s)  # fmt: skip


def _touch_file(work) -> None:  # a file where a folder is needed
    (work / "file.txt").write_text("not a folder\n")


def flag_attacks(quick: bool, results: str) -> list[Attack]:
    """`results` is a good results.json for report and compare."""
    a: list[Attack] = []
    for command, base, flags in (("run", RUN_BASE, RUN_FLAGS), ("sweep", SWEEP_BASE, SWEEP_FLAGS)):
        for flag, values in flags.items():
            for v in values[:1] if quick else values:
                a.append(_attack(command, flag, v, _argv(command, base, flag, v), 40))
    for flag, values in COMPARE_FLAGS.items():
        for v in values[:1] if quick else values:
            a.append(_attack("compare", flag, v, ["compare", results, results, flag, v], 60))
    for flag, values in REPORT_FLAGS.items():
        for v in values[:1] if quick else values:
            a.append(_attack("report", flag, v, ["report", results, flag, v], 60))
    for what in [X, "[red]impls", "", "impl"]:
        a.append(Attack("flags", f"list {what!r}", [Step(["list", what], BAD_INPUT)]))
    return a
