"""The worker subprocess: runs cases sent by the runner, one JSON line per message.

Started by fa_bench.run.runner as `python -m fa_bench.run.worker ARGS_JSON`, ARGS_JSON
holding the run's RunOptions whole ({"options": ..., "plugin_path": ...}). The protocol goes
over the original stdout; anything an implementation prints is sent to stderr instead so
it cannot corrupt the protocol. Messages out: {"op": "ready", "env": ...} once (or
{"op": "plugin_error", "message": ...} and exit 2), then {"op": "result", "result": ...}
per case. Messages in: {"op": "run", "case": ...}, with an
optional "options" object passed to the implementation's builder (a `fa-bench sweep` config).
"""

from __future__ import annotations

import json
import os
import sys
from typing import TYPE_CHECKING

from fa_bench.run.lifeline import Lifeline, quit_quietly

if TYPE_CHECKING:
    from fa_bench.results.record import CaseRecord


def _protocol_stream():
    """Keep the real stdout for the protocol; point fd 1 (and sys.stdout) at stderr."""
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return proto


def main(argv: list[str] | None = None) -> int:
    args = json.loads((argv if argv is not None else sys.argv[1:])[0])
    # First, before torch's import: a runner that dies from here on takes the worker along.
    lifeline = Lifeline(args.get("parent_pid")).start()
    proto = _protocol_stream()

    import torch

    from fa_bench import registry
    from fa_bench.case import Case
    from fa_bench.env import collect_env, cpu_threads
    from fa_bench.run.execute import ExecOptions, run_case
    from fa_bench.run.runner import RunOptions
    from fa_bench.run.timing import worker_threads
    from fa_bench.telemetry.session import open_session

    options = RunOptions.from_dict(args["options"])
    threads = worker_threads(options.device, options.cpu_threads)
    if threads is not None:  # before any torch work: OpenMP keeps its first pool size
        torch.set_num_threads(threads)
    try:
        # Module plugins are found in the caller's folder (appended to sys.path: fa_bench
        # is imported already and cannot be shadowed).
        registry.load(options.plugins, search=args.get("plugin_path"))
    except registry.PluginError as exc:
        # Told to the runner, which stops the run (exit 2): every case would fail alike.
        print(f"error: {exc}", file=sys.stderr, flush=True)
        proto.write(json.dumps({"op": "plugin_error", "message": str(exc)}) + "\n")
        return 2
    device = torch.device(options.worker_device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    # What execute needs of the options, with the NVML session opened once for all cases.
    session = open_session(device, enabled=options.telemetry)
    opts = ExecOptions(
        timing=options.timing,
        seed=options.seed,
        check_accuracy=options.check_accuracy,
        telemetry=session,
    )
    env = {**collect_env(device), **cpu_threads()}
    # Before the first case: a device copy calibrates NVML's GB/s against bytes / time.
    env["telemetry"] = {**session.describe(), "calibration": session.calibrate(device)}
    proto.write(json.dumps({"op": "ready", "env": env}) + "\n")
    for line in lifeline.messages():
        msg = json.loads(line)
        if msg.get("op") == "exit":
            break
        case = Case.from_dict(msg["case"])
        record = run_case(case, device, opts, impl_options=msg.get("options"))
        proto.write(result_line(record))
    return 0


def result_line(record: CaseRecord) -> str:
    """The protocol line of one record. JSON has no NaN or infinity: a non-finite float
    (an accuracy error of a NaN output) is written as null, the rule of results.json and
    the journal (fa_bench.results.files.sanitize); the accuracy object keeps each
    tensor's count of non-finite values, so nothing is lost."""
    from fa_bench.results.files import sanitize

    result = sanitize(record.to_json())
    return json.dumps({"op": "result", "result": result}, allow_nan=False) + "\n"


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:  # the runner went away mid-write: nobody to tell, no traceback
        quit_quietly()
