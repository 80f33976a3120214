"""`fa-bench env`'s telemetry panel: what this machine's GPUs support, and why not."""

from __future__ import annotations

from types import ModuleType

from rich.table import Table
from rich.text import Text

from fa_bench.telemetry.nvml import NvmlUnavailable, load_library
from fa_bench.telemetry.session import TelemetrySession


def support_report(lib: ModuleType | None = None) -> list[dict]:
    """One entry per visible GPU (`TelemetrySession.describe()` plus its index), or a single
    entry with the reason when there is no GPU."""
    import torch

    if not torch.cuda.is_available():
        reason = "no CUDA GPU visible"
        try:
            load_library(lib)
        except NvmlUnavailable as exc:
            reason += f"; {exc}"
        return [{"index": None, "available": False, "reason": reason}]
    report = []
    for i in range(torch.cuda.device_count()):
        uuid = getattr(torch.cuda.get_device_properties(i), "uuid", None)
        session = (
            TelemetrySession.from_uuid(uuid, lib=lib)
            if uuid
            else TelemetrySession.unavailable("torch reports no uuid for this GPU")
        )
        report.append({"index": i, **session.describe()})
    return report


def support_table(report: list[dict]) -> Table:
    t = Table("GPU", "telemetry", "detail", title="telemetry (NVML)")
    for entry in report:
        gpu = "–" if entry.get("index") is None else str(entry["index"])
        if not entry["available"]:
            t.add_row(gpu, "[yellow]unavailable[/]", Text(str(entry["reason"])))  # NVML's words
            continue
        gpm = entry["gpm"]
        t.add_row(
            gpu,
            "[green]yes[/]",
            Text.assemble(
                "GPM (DRAM GB/s, SM, tensor): ", ("ok", "green") if gpm == "ok" else str(gpm)
            ),
        )
        for name, state in entry["readings"].items():
            t.add_row(
                "", "", Text.assemble(f"{name}: ", ("ok", "green") if state == "ok" else str(state))
            )
        peak = entry["gbps_peak_theoretical"]
        t.add_row(
            "",
            "",
            f"theoretical HBM: {peak:.0f} GB/s" if isinstance(peak, float) else Text(str(peak)),
        )
    return t
