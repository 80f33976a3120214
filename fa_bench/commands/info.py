"""`fa-bench list` and `fa-bench env`: what is installed and what this machine can run.

Each command builds its data once (`impl_rows`, `suite_rows`, `env_doc`), then prints it
either as JSON (`--json`, on stdout, for scripts) or as tables made from the same rows, so
anything another part adds to the rows (a plugin's origin, a peer's version) shows in both.
Tables fit 80 columns without cutting a value: in a narrow console (a CI log is 80
columns wide) the implementations are two columns, name and details, and no cell is ever
shortened with an ellipsis (a long word folds onto the next line instead).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from rich.console import Console
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from fa_bench.case import DType, Mode

WIDE = 120  # columns from which `list impls` is one row per implementation

# env keys shown elsewhere (the GPU table) or meaningless outside a run
_ENV_SKIP = {"gpus", "device"}


def print_json(data: object) -> None:
    """JSON on stdout as is: no Rich markup, highlighting or wrapping to cut it."""
    print(json.dumps(data, indent=2, default=str))


def _table(*headers: str, **kw: Any) -> Table:
    """A table whose cells fold a word too long for their column instead of cutting it."""
    t = Table(**kw)
    for h in headers:
        t.add_column(h, overflow="fold")
    return t


# --- list suites -------------------------------------------------------------------------


def suite_rows() -> list[dict[str, str]]:
    from fa_bench.suite.expand import builtin_suites

    return [{"name": n, "description": d} for n, d in builtin_suites().items()]


def print_suites(console: Console, rows: list[dict[str, str]]) -> None:
    t = _table("suite", "description")
    t.columns[0].no_wrap = True
    for row in rows:
        t.add_row(Text(row["name"]), Text(row["description"]))  # data, not Rich markup
    console.print(t)


# --- list impls --------------------------------------------------------------------------


def impl_rows(impls: Mapping[str, Any], broken: Iterable[Any] = ()) -> list[dict[str, Any]]:
    """One row per implementation (and per installed package plugin that failed to load):
    what it runs, where it comes from, and whether it can run here (with the reason)."""
    rows = []
    for name, im in impls.items():
        why = im.unavailable_reason()
        rows.append({
            "name": name,
            "modes": [m.value for m in Mode if m in im.modes],
            "dtypes": [d.value for d in DType if d in im.dtypes],
            "devices": sorted(im.devices),
            "origin": getattr(im, "source", None) or getattr(im, "origin", None),
            "description": im.description,
            "available": why is None,
            "reason": why,
        })  # fmt: skip
    for p in broken:  # its implementations are unknown: the package's own row
        rows.append({"name": p.name, "modes": [], "dtypes": [], "devices": [],
                     "origin": p.label, "description": "", "available": False,
                     "reason": p.error})  # fmt: skip
    return rows


def _availability(row: Mapping[str, Any]) -> Text:
    if row["available"]:
        return Text("yes", "green")
    return Text.assemble(("no", "yellow"), f": {row['reason']}")


def _description(row: Mapping[str, Any]) -> Text:
    text = Text(row["description"])
    if not row["available"]:
        text.append_text(Text.assemble(" (", ("unavailable", "yellow"), f": {row['reason']})"))
    return text


def print_impls(console: Console, rows: list[dict[str, Any]]) -> None:
    """Wide: one row per implementation. Narrow (a CI log): name, then its details."""
    if console.width >= WIDE:
        t = _table("impl", "modes", "dtypes", "devices", "origin", "description")
        for r in rows:
            t.add_row(
                Text(r["name"]),
                Text(", ".join(r["modes"]) or "–"),
                Text(", ".join(r["dtypes"]) or "–"),
                Text(", ".join(r["devices"]) or "–"),
                Text(r["origin"] or "–"),
                _description(r),
            )  # data, never markup; fmt: skip
    else:
        t = _table("impl", "details", show_lines=True)
        for r in rows:
            details = Text("\n").join([
                _description(r),
                Text(f"modes: {', '.join(r['modes']) or '–'}; "
                     f"dtypes: {', '.join(r['dtypes']) or '–'}; "
                     f"devices: {', '.join(r['devices']) or '–'}"),
                Text(f"origin: {r['origin'] or '–'}"),
            ])  # fmt: skip
            t.add_row(Text(r["name"]), details)
    t.columns[0].no_wrap = True  # a name is never split or cut
    console.print(t)


# --- env ---------------------------------------------------------------------------------


def env_doc(impls: Mapping[str, Any], broken: Iterable[Any] = ()) -> dict[str, Any]:
    """This machine: collect_env()'s versions and GPUs, NVML telemetry support per GPU,
    and which implementations can run here."""
    from fa_bench.env import collect_env
    from fa_bench.telemetry.env import support_report

    return {
        "env": collect_env(),
        "telemetry": support_report(),
        "impls": [
            {"name": r["name"], "available": r["available"], "reason": r["reason"]}
            for r in impl_rows(impls, broken)
        ],
    }


def _env_rows(info: Mapping[str, Any]) -> Iterable[tuple[str, str]]:
    """Every key collect_env() gives (so a new one shows without a change here); a
    mapping (the peers' package versions) as one row per entry."""
    from fa_bench.env import cudnn_version

    for key, value in info.items():
        if key in _ENV_SKIP or (key == "driver_note" and not value):
            continue
        key = "driver note" if key == "driver_note" else key
        if isinstance(value, Mapping):
            for sub, v in value.items():
                yield str(sub), "not installed" if v is None else str(v)
        elif key == "cudnn" and value is not None:
            yield key, cudnn_version(value)
        else:
            yield key, "–" if value is None else str(value)


def print_env(console: Console, doc: Mapping[str, Any]) -> None:
    from fa_bench.telemetry.env import support_table

    info = doc["env"]
    t = _table("", "", show_header=False, box=None)
    t.columns[0].no_wrap = True
    for key, value in _env_rows(info):
        t.add_row(Text(key), Text(value))
    console.print(Panel(t, title="environment"))
    if info["gpus"]:
        _print_gpus(console, info["gpus"])
    else:
        console.print("[yellow]No CUDA GPU visible: runs use the CPU (not GPU performance).[/]")
    console.print(support_table(doc["telemetry"]))
    a = _table("impl", "available here", title="implementations")
    a.columns[0].no_wrap = True
    for row in doc["impls"]:
        a.add_row(Text(row["name"]), _availability(row))
    console.print(a)


def _print_gpus(console: Console, gpus: list[dict[str, Any]]) -> None:
    """One table row per GPU from WIDE columns; in a narrower console (a CI log) two lines
    per GPU, so its 40-character uuid is never folded or cut."""
    figures = []
    for d in gpus:
        mem_gib, l2_mib = d["memory_bytes"] / 2**30, (d["l2_bytes"] or 0) / 2**20
        figures.append((str(d["index"]), str(d["name"]), str(d["uuid"]), f"{mem_gib:.1f}",
                        str(d["sm_count"]), str(d["compute_capability"]),
                        f"{l2_mib:.0f}"))  # fmt: skip
    if console.width >= WIDE:
        g = _table("index", "name", "uuid", "memory GiB", "SMs", "capability", "L2 MiB",
                   title="GPUs")  # fmt: skip
        for row in figures:
            g.add_row(*(Text(cell) for cell in row))
        console.print(g)
        return
    console.print(Text("GPUs", style="bold"))
    for index, name, uuid, mem, sms, cc, l2 in figures:
        console.print(Text(f"GPU {index}: {name}, {mem} GiB, {sms} SMs, compute capability "
                           f"{cc}, L2 {l2} MiB"))  # fmt: skip
        console.print(Text(f"  {uuid}"), soft_wrap=True)
