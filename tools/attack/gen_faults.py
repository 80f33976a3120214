"""Faults: implementations that misbehave (a plugin written into the work folder),
plugins that fail at import, signals at several moments followed by `--resume`, two
writers on one run folder, and resource limits (file size, address space)."""

from __future__ import annotations

import json
import resource
import shutil
import signal
from collections.abc import Callable
from pathlib import Path

from core import BAD_INPUT, FAST, RAN, Attack, Step

FAULTS = """
import ctypes, os, sys, time
import torch
from fa_bench.registry import register

def _ok(q, k, v, causal):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)

def _fn(body):
    def builder(case, q, k, v):
        def fn(q, k, v):
            return body(case, q, k, v)
        return fn
    return builder

class Nasty(Exception):
    def __str__(self):
        raise ValueError("[/x] str() of this exception fails")

def _stdout_garbage(case, q, k, v):
    print('{"id": "naive/fwd/fp32/b1-hq2-hkv2-sq32-sk32-d32/full", "status": "ok"}')
    print("[/x] \\x00 garbage \\xff", flush=True)
    os.write(1, b"\\xff\\xfe not json\\n")
    return _ok(q, k, v, case.causal)

def _stderr_flood(case, q, k, v):
    os.write(2, b"[/x] flood " * 200000)
    return _ok(q, k, v, case.causal)

BODIES = {
    "crash": lambda c, q, k, v: os._exit(17),
    "abort": lambda c, q, k, v: os.abort(),
    "segfault": lambda c, q, k, v: ctypes.string_at(0),
    "hang": lambda c, q, k, v: time.sleep(10**6),
    "raise-markup": lambda c, q, k, v: (_ for _ in ()).throw(
        RuntimeError("[/x] closing tag [red]red[/red] [[group]] <script>alert(1)</script>")),
    "raise-unprintable": lambda c, q, k, v: (_ for _ in ()).throw(Nasty()),
    "nan": lambda c, q, k, v: torch.full_like(q, float("nan")),
    "inf": lambda c, q, k, v: torch.full_like(q, float("inf")),
    "wrong": lambda c, q, k, v: q * 3.0,
    "stdout-garbage": _stdout_garbage,
    "stderr-flood": _stderr_flood,
    "wrong-shape": lambda c, q, k, v: q[..., :1],
    "int-output": lambda c, q, k, v: torch.zeros(q.shape, dtype=torch.int32),
    "cpu-oom-text": lambda c, q, k, v: (_ for _ in ()).throw(RuntimeError(
        "[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate "
        "memory: you tried to allocate 123456789012 bytes. Error code 12")),
    "memory-error": lambda c, q, k, v: (_ for _ in ()).throw(MemoryError()),
    "sys-exit": lambda c, q, k, v: sys.exit(0),
    "keyboard-interrupt": lambda c, q, k, v: (_ for _ in ()).throw(KeyboardInterrupt()),
    "returns-tuple": lambda c, q, k, v: (_ok(q, k, v, c.causal), 1),
}
for _name, _body in BODIES.items():
    register("atk-" + _name, description="[/x] " + _name)(_fn(_body))

@register("atk-none", description="builder returns None")
def _none(case, q, k, v):
    return None

@register("atk-not-callable", description="builder returns 42")
def _forty_two(case, q, k, v):
    return 42

@register("atk-prepare-raise", description="raises while preparing")
def _prepare_raise(case, q, k, v):
    raise RuntimeError("[bold]prepare failed[/] [/x]")
"""
# The status each fault must end in ("error" covers crash, abort and friends).
STATUS = {"nan": {"mismatch"}, "inf": {"mismatch"}, "wrong": {"mismatch"},
          "hang": {"timeout"}, "cpu-oom-text": {"oom"}, "memory-error": {"oom", "error"},
          "stdout-garbage": {"ok"}, "stderr-flood": {"ok"},
          "wrong-shape": {"error", "mismatch"}, "int-output": {"error", "mismatch"}}  # fmt: skip


def _write(name: str, text: str) -> Callable[[Path], None]:
    def setup(work: Path) -> None:
        (work / name).write_text(text)

    return setup


def _status_check(impl: str, allowed: set[str]) -> Callable[[Path, str], list[str]]:
    def check(work: Path, _output: str) -> list[str]:
        try:
            cases = json.loads((work / "out" / "results.json").read_text())["cases"]
        except (OSError, ValueError, KeyError):
            return []  # counted as lost cases already
        got = {c.get("status") for c in cases if c.get("impl") == impl}
        wrong = got - allowed
        return [f"{impl}: status {sorted(wrong)}, expected {sorted(allowed)}"] if wrong else []

    return check


def _journal_unique(work: Path, _output: str) -> list[str]:
    ids = []
    for line in (work / "out" / "journal.jsonl").read_bytes().splitlines():
        try:
            ids.append(json.loads(line)["id"])
        except (ValueError, KeyError, TypeError):
            pass
    dup = len(ids) - len(set(ids))
    return [f"journal holds {dup} duplicate case lines (two writers)"] if dup else []


def fault_attacks(quick: bool) -> list[Attack]:
    a: list[Attack] = []
    base = ["run", "-s", "smoke", "-m", "fwd", "--seqlen", "32", "--no-causal", "--plugin",
            "{d}/faults.py", "--timeout", "3", *FAST, "-o", "{d}/out", "-i", "naive"]  # fmt: skip
    names = [*eval_names(), "none", "not-callable", "prepare-raise"]
    # Three faults a run (a run per fault costs a worker start-up each): 7 runs.
    groups = [names[i : i + 3] for i in range(0, len(names), 3)]
    for group in groups[:1] if quick else groups:
        impls = [f"atk-{n}" for n in group]
        checks = [_status_check(f"atk-{n}", STATUS.get(n, {"error"})) for n in group]
        a.append(
            Attack(
                "fault plugins",
                " + ".join(impls),
                [Step([*base, *[x for i in impls for x in ("-i", i)]], RAN)],
                _write("faults.py", FAULTS),
                keeps="out",
                checks=[*checks, _status_check("naive", {"ok"})],
                timeout_s=90,
            )
        )
    a.append(Attack("fault plugins", "all faults in one run, then --resume",
                    [Step([*base, *[x for n in names if n != "hang" for x in ("-i", f"atk-{n}")]],
                          RAN), Step(["run", "--resume", "{d}/out"], RAN)],
                    _write("faults.py", FAULTS), keeps="out", timeout_s=120))  # fmt: skip
    bad_plugins = {
        "syntax error": "def f(:\n",
        "raises at import": "raise RuntimeError('[/x] import [red]failed')\n",
        "missing dependency": "import no_such_dependency_xyz\n",
        "duplicate name": "from fa_bench.registry import register\n"
                          "@register('naive', description='x')\ndef f(case, q, k, v):\n"
                          "    return lambda q, k, v: q\n",
        "bad mode": "from fa_bench.registry import register\nfrom fa_bench.case import Mode\n"
                    "@register('atk-m', description='x', modes=('sideways',))\n"
                    "def f(case, q, k, v):\n    return lambda q, k, v: q\n",
        "sys.exit at import": "import sys\nsys.exit(3)\n",
        "binary": "\x00\x01\x02",
    }  # fmt: skip
    for what, text in bad_plugins.items():
        for cmd in (["run", "-s", "smoke", "-i", "naive", "-m", "fwd", "--seqlen", "32",
                     *FAST, "-o", "{d}/out"], ["list", "impls"], ["env"]):  # fmt: skip
            if cmd[0] == "env" and what not in ("syntax error", "raises at import"):
                continue  # env loads plugins as list does
            a.append(Attack("fault plugins", f"{cmd[0]}: plugin {what}",
                            [Step([*cmd, "--plugin", "{d}/[p].py"], BAD_INPUT)],
                            _write("[p].py", text)))  # fmt: skip
    # --resume must refuse a plugin file changed since the run began.
    a.append(Attack("fault plugins", "--resume after the plugin file changed",
                    [Step([*base, "-i", "atk-wrong"], RAN),
                     Step(["run", "--resume", "{d}/out"], BAD_INPUT, action=_append_plugin)],
                    _write("faults.py", FAULTS)))  # fmt: skip
    return a


def _append_plugin(work: Path) -> None:
    with open(work / "faults.py", "a") as f:
        f.write("\nprint('changed after the run began')\n")


def eval_names() -> list[str]:
    return [
        "crash",
        "abort",
        "segfault",
        "hang",
        "raise-markup",
        "raise-unprintable",
        "nan",
        "inf",
        "wrong",
        "stdout-garbage",
        "stderr-flood",
        "wrong-shape",
        "int-output",
        "cpu-oom-text",
        "memory-error",
        "sys-exit",
        "keyboard-interrupt",
        "returns-tuple",
    ]


# ---- interrupts, two writers, limits --------------------------------------------------

INTERRUPTED = frozenset({0, 1, 130, 143, -2, -15, -9, 137})
RUN12 = ["run", "-s", "smoke", "-i", "naive", "-i", "sdpa", "-m", "fwd", "-m", "bwd",
         "--seqlen", "32", *FAST, "-o", "{d}/out"]  # fmt: skip


def interrupt_attacks(quick: bool, base: Path) -> list[Attack]:
    scenarios = [
        ("SIGINT after 1 case", [("journal:1", signal.SIGINT)]),
        ("SIGINT after 5 cases", [("journal:5", signal.SIGINT)]),
        ("SIGTERM after 2 cases", [("journal:2", signal.SIGTERM)]),
        ("SIGKILL after 3 cases", [("journal:3", signal.SIGKILL)]),
        ("SIGINT while planning (0.4 s)", [("0.4", signal.SIGINT)]),
        ("SIGTERM at start-up (1.2 s)", [("1.2", signal.SIGTERM)]),
        ("SIGINT x3 after 2 cases", [("journal:2", signal.SIGINT)] * 3),
        ("SIGINT then SIGTERM", [("journal:3", signal.SIGINT), ("journal:3", signal.SIGTERM)]),
    ]
    a: list[Attack] = []
    for what, sigs in scenarios[:2] if quick else scenarios:
        # Stopped before plan.json is written, there is nothing to resume (exit 2); once it
        # is, the lost-case count says whether the resume finished the run.
        early = frozenset({0, 2}) if sigs[0][0][0].isdigit() else frozenset({0})
        steps = [Step(RUN12, INTERRUPTED, signals=list(sigs)),
                 Step(["run", "--resume", "{d}/out"], early)]  # fmt: skip
        a.append(Attack("interrupts", f"{what}, then --resume", steps, keeps="out"))
    steps = [Step(RUN12, INTERRUPTED, signals=[("journal:2", signal.SIGINT)]),
             Step(["run", "--resume", "{d}/out"], INTERRUPTED, signals=[("journal:5",
                                                                          signal.SIGTERM)]),
             Step(["run", "--resume", "{d}/out"], frozenset({0}))]  # fmt: skip
    a.append(Attack("interrupts", "interrupted resume, then --resume", steps, keeps="out"))

    def cut(work: Path) -> None:  # the base folder as a run stopped after 2 cases
        out = work / "out"
        shutil.copytree(base, out)
        for name in ("results.json", "results.csv", "report.html"):
            (out / name).unlink(missing_ok=True)
        j = out / "journal.jsonl"
        j.write_bytes(b"".join(j.read_bytes().splitlines(keepends=True)[:2]))

    either = frozenset({0, 2})
    for n in (2, 3) if not quick else (2,):
        steps = [
            Step(["run", "--resume", "{d}/out"], either, background=True) for _ in range(n - 1)
        ] + [Step(["run", "--resume", "{d}/out"], either)]
        a.append(Attack("concurrency", f"{n} x --resume of one folder at once", steps, cut,
                        keeps="out", checks=[_journal_unique, _one_winner]))  # fmt: skip
    a.append(
        Attack(
            "concurrency",
            "run -o onto a folder a resume is writing",
            [Step(["run", "--resume", "{d}/out"], either, background=True), Step(RUN12, either)],
            cut,
            keeps="out",
            checks=[_journal_unique],
        )
    )
    # A write error (file size limit: EFBIG, as a full disk gives ENOSPC) then --resume.
    fsize = resource.RLIMIT_FSIZE
    a.append(
        Attack(
            "interrupts",
            "file size limit mid-run, then --resume",
            [
                Step(RUN12, frozenset({1, 2, 74}), limits={fsize: 12_000}),
                Step(["run", "--resume", "{d}/out"], frozenset({0})),
            ],
            keeps="out",
        )
    )
    if not quick:
        a.append(Attack("interrupts", "CPU out of memory (address-space limit)",
                        [Step(["run", "-i", "naive", "-s", "smoke", "--seqlen", "24576", "-m",
                               "fwd", "--no-causal", "--heads", "2", *FAST, "-o", "{d}/out"],
                              RAN, limits={resource.RLIMIT_AS: 3_500_000_000})],
                        keeps="out", checks=[_status_check("naive", {"oom"})],
                        timeout_s=90))  # fmt: skip
    return a


def _one_winner(work: Path, output: str) -> list[str]:
    return [] if "PID" in output or "pid" in output else ["no writer was refused (no lock)"]
