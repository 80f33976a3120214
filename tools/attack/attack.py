"""Throw a few hundred hostile inputs and faults at the installed `fa-bench` and count
what gets through: Python tracebacks, lost cases and unexpected exit codes.

    python tools/attack/attack.py --json attack.json            # everything, a few minutes
    python tools/attack/attack.py --json a.json --quick         # a sample, for the test
    python tools/attack/attack.py --json a.json --category flags --category journals

Each input runs `fa-bench --debug ...` in a subprocess (CPU, tiny suites, fast timing) in a
fresh folder, with a time-out; `--workers` run at once. The summary table has one row per
category; the JSON holds every input, its command lines, exit codes and findings.
Expected outcomes: bad input exits 2; a run whose cases fail exits 0/1 with every case
recorded; an interrupted run, resumed, ends with every planned case exactly once.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict
from pathlib import Path

from core import FAST, Attack, Outcome, run_attack
from gen_faults import fault_attacks, interrupt_attacks
from gen_files import journal_attacks, path_attacks, results_attacks
from gen_flags import flag_attacks
from gen_suites import suite_attacks

CATEGORIES = ("suite files", "flags", "output paths", "results files", "journals",
              "fault plugins", "interrupts", "concurrency")  # fmt: skip
BASE_RUN = ["run", "-s", "smoke", "-i", "naive", "-i", "sdpa", "-m", "fwd", "--seqlen", "32",
            *FAST]  # fmt: skip


def make_base(root: Path, exe: list[str]) -> Path:
    """A good run folder (6 cases) for the file and journal attacks."""
    out = root / "base"
    proc = subprocess.run([*exe, *BASE_RUN, "-o", str(out)], capture_output=True, text=True)
    if proc.returncode != 0 or not (out / "results.json").is_file():
        sys.exit(f"attack: the base run failed (exit {proc.returncode}):\n{proc.stdout}"
                 f"{proc.stderr}")  # fmt: skip
    return out


# Inputs per category: the default keeps a run to minutes on 2 cores; --all runs every one.
DEFAULT = {"suite files": 45, "flags": 55, "results files": 45}
QUICK = dict.fromkeys(CATEGORIES, 3)


def build(quick: bool, base: Path, wanted: Iterable[str], everything: bool = False
          ) -> list[Attack]:  # fmt: skip
    results = str(base / "results.json")
    every = [*suite_attacks(quick), *flag_attacks(quick, results), *path_attacks(quick, results),
             *results_attacks(quick, results), *journal_attacks(quick, base),
             *fault_attacks(quick), *interrupt_attacks(quick, base)]  # fmt: skip
    wanted = set(wanted)
    chosen = [a for a in every if not wanted or a.category in wanted]
    caps = QUICK if quick else ({} if everything else DEFAULT)
    return [a for cat in CATEGORIES
            for a in _spread([x for x in chosen if x.category == cat], caps.get(cat))]  # fmt: skip


def _spread(items: list[Attack], n: int | None) -> list[Attack]:
    """n of the items, evenly spaced over the list (which is grouped by kind of input)."""
    if n is None or len(items) <= n:
        return items
    return [items[i * (len(items) - 1) // (n - 1)] for i in range(n)]


def run_all(attacks: list[Attack], root: Path, exe: list[str], workers: int,
            progress: bool = True) -> list[Outcome]:  # fmt: skip
    outcomes: list[Outcome] = []
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = {pool.submit(run_attack, a, root / f"{i:04d}", exe): a
                   for i, a in enumerate(attacks)}  # fmt: skip
        for n, fut in enumerate(as_completed(futures), 1):
            a = futures[fut]
            try:
                o = fut.result()
            except Exception as exc:  # the harness's own failure: keep it as a finding
                o = Outcome(a.category, a.name, [], [], findings=[f"harness: {exc!r}"])
            outcomes.append(o)
            if progress:
                mark = "ok " if o.clean else "BAD"
                print(f"[{n}/{len(attacks)}] {mark} {o.category}: {o.name} "
                      f"{o.exit_codes} {o.seconds}s", file=sys.stderr, flush=True)  # fmt: skip
    order = {(a.category, a.name): i for i, a in enumerate(attacks)}
    return sorted(outcomes, key=lambda o: order.get((o.category, o.name), 0))


def summarize(outcomes: list[Outcome]) -> list[dict]:
    """One row per category: inputs, tracebacks, lost cases, unexpected exits, findings."""
    rows = []
    for cat in [*CATEGORIES, *sorted({o.category for o in outcomes} - set(CATEGORIES))]:
        mine = [o for o in outcomes if o.category == cat]
        if not mine:
            continue
        rows.append({"category": cat, "inputs": len(mine),
                     "tracebacks": sum(1 for o in mine if o.tracebacks),
                     "lost_cases": sum(o.lost for o in mine),
                     "unexpected_exits": sum(1 for o in mine if o.unexpected),
                     "other_findings": sum(1 for o in mine if o.findings)})  # fmt: skip
    keys = ("inputs", "tracebacks", "lost_cases", "unexpected_exits", "other_findings")
    rows.append({"category": "total", **{k: sum(r[k] for r in rows) for k in keys}})
    return rows


def print_summary(rows: list[dict], outcomes: list[Outcome], seconds: float) -> None:
    head = ("category", "inputs", "tracebacks", "lost cases", "unexpected exits", "findings")
    widths = (14, 7, 11, 11, 17, 9)
    line = "  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True))
    print(line)
    print("-" * len(line))
    for r in rows:
        cells = (r["category"], r["inputs"], r["tracebacks"], r["lost_cases"],
                 r["unexpected_exits"], r["other_findings"])  # fmt: skip
        print("  ".join(str(c).ljust(w) for c, w in zip(cells, widths, strict=True)))
    bad = [o for o in outcomes if not o.clean]
    if bad:
        print(f"\n{len(bad)} inputs with findings:")
    for o in bad:
        what = [
            *(["traceback"] if o.tracebacks else []),
            *([f"{o.lost} cases lost"] if o.lost else []),
            *o.unexpected,
            *o.findings,
        ]
        print(f"  {o.category}: {o.name}: {'; '.join(what)}")
    print(f"\n{rows[-1]['inputs']} inputs in {seconds:.0f} s")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", required=True, type=Path, help="where to write every outcome")
    p.add_argument("--quick", action="store_true", help="a small sample of each category")
    p.add_argument("--all", action="store_true", help="every input (about 500; slow)")
    p.add_argument("--category", action="append", default=[], choices=CATEGORIES)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--exe", default="fa-bench", help="the fa-bench command to attack")
    p.add_argument("--keep", action="store_true", help="keep the work folders")
    p.add_argument("--limit", type=int, default=0, help="run only the first N inputs")
    args = p.parse_args(argv)
    exe = [args.exe, "--debug"]  # --debug: an internal error shows its traceback
    root = Path(tempfile.mkdtemp(prefix="fa-bench-attack-"))
    start = time.monotonic()
    try:
        base = make_base(root, exe)
        attacks = build(args.quick, base, args.category, args.all)
        if args.limit:
            attacks = attacks[: args.limit]
        outcomes = run_all(attacks, root, exe, args.workers)
    finally:
        if not args.keep:
            for ro in root.glob("*/ro"):
                ro.chmod(0o755)
            shutil.rmtree(root, ignore_errors=True)
    seconds = time.monotonic() - start
    rows = summarize(outcomes)
    print_summary(rows, outcomes, seconds)
    args.json.write_text(
        json.dumps(
            {
                "command": ["python", *sys.argv],
                "summary": rows,
                "seconds": round(seconds, 1),
                "outcomes": [asdict(o) for o in outcomes],
            },
            indent=1,
        )
    )
    if args.keep:
        print(f"work folders: {root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
