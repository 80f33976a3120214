"""The runner: sends cases to a worker subprocess, enforces a per-case timeout, journals.

One worker process runs the cases one after another (compile caches and the CUDA context
are reused). When a case hangs, the worker is killed and the case is recorded as
`timeout`; when the worker dies (segfault, CUDA fatal error, os._exit) the case is an
`error` with the exit status and the tail of the worker's stderr; a fresh worker takes
the next case. After any `error` on a GPU the worker is replaced too, because a CUDA
error can leave the context unusable. Every result is journaled as it arrives.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from fa_bench.case import Case, Status
from fa_bench.errors import UsageError
from fa_bench.results.files import append_journal, read_journal
from fa_bench.results.record import CaseRecord, GpuRef, Placement
from fa_bench.run.timing import TimingConfig, worker_threads
from fa_bench.sweep import tuning
from fa_bench.words import plural

WORKER_LOG = "worker.log"
WORKER_LOG_MAX = 16 << 20  # worker.log is cut back to its tail past this, at a worker start
WORKER_LOG_KEEP = 1 << 20


@dataclass(frozen=True)
class RunOptions:
    device: str = "cpu"  # "cpu" or "cuda"
    gpu: int | None = None  # physical GPU index, pinned with CUDA_VISIBLE_DEVICES
    timing: TimingConfig = field(default_factory=TimingConfig)
    timeout_s: float = 600.0
    startup_timeout_s: float = 300.0
    seed: int = 0
    plugins: tuple[str, ...] = ()
    check_accuracy: bool = True
    telemetry: bool = True  # NVML telemetry per case where the GPU supports it
    # Tuning cache for the worker (fa_bench.sweep.tuning): a path or "off"; None keeps the
    # caller's $FA_BENCH_TUNING_CACHE / default location.
    tuning_cache: str | None = None
    # Where module plugins are found: the folder the run was started from (the worker runs
    # in the output folder, a resume may start anywhere). None: no module plugin.
    plugin_dir: str | None = None
    # Threads of the worker's torch and OpenMP (--cpu-threads); None: run.timing's
    # worker_threads default (1 on the CPU, torch's own on a GPU).
    cpu_threads: int | None = None

    def to_dict(self) -> dict:
        """The JSON form: results.json's run.options, plan.json, the worker's argument."""
        d = asdict(self)
        d["plugins"] = list(self.plugins)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> RunOptions:
        d = dict(d)
        d["timing"] = TimingConfig(**d.get("timing", {}))
        d["plugins"] = tuple(d.get("plugins", ()))
        return cls(**d)

    @property
    def worker_device(self) -> str:
        """The torch device inside the worker, which sees only its pinned GPU, as cuda:0."""
        return "cpu" if self.device == "cpu" else "cuda:0"


def trim_log(path: Path, limit: int = WORKER_LOG_MAX, keep: int = WORKER_LOG_KEEP) -> None:
    """Past `limit` bytes, cut the log to its last `keep` bytes (from a line start), so a
    worker that floods stderr cannot fill the disk over many restarts; the tail is what
    explains the latest failure. Checked when a worker starts."""
    try:
        if path.stat().st_size <= limit:
            return
        with open(path, "rb") as f:
            f.seek(-keep, os.SEEK_END)
            tail = f.read()
        tail = tail[tail.find(b"\n") + 1 :] if b"\n" in tail else tail
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(b"[fa-bench: worker.log cut to its last %d bytes]\n" % len(tail) + tail)
        os.replace(tmp, path)
    except OSError:
        pass  # a log that cannot be trimmed is no reason to stop the run


class WorkerError(RuntimeError):
    pass


class WorkerTimeout(WorkerError):
    pass


class WorkerPluginError(UsageError, RuntimeError):
    """The worker could not import a plugin: every case would fail the same way, so the
    run stops (exit 2) instead of recording an error per case."""


class Worker:
    """One `python -m fa_bench.run.worker` process speaking JSON lines."""

    def __init__(self, opts: RunOptions, workdir: Path) -> None:
        env = dict(os.environ)
        env[tuning.ENV_VAR] = tuning.pin(opts.tuning_cache)
        if opts.device == "cpu":
            env["TRITON_INTERPRET"] = "1"  # our Triton kernels run in the interpreter on CPU
            # Fixed glibc malloc thresholds: with the adaptive defaults, whether the N x N
            # buffers of naive/sdpa-math come from fresh pages is decided per process, and
            # the same case timed 1.3x-2.8x apart from one run to the next.
            env.setdefault("MALLOC_MMAP_THRESHOLD_", str(64 << 20))
            env.setdefault("MALLOC_TRIM_THRESHOLD_", str(256 << 20))
        elif opts.gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = _visible_device(opts.gpu)
        threads = worker_threads(opts.device, opts.cpu_threads)
        if threads is not None:
            # OpenMP sizes its pool when it starts, before the worker's set_num_threads.
            env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
        # The options whole; plugin_path is where the caller stood (a plugin given as a
        # bare module name is found there), since the worker runs in the output folder.
        # parent_pid: the worker exits when this process dies (fa_bench.run.lifeline).
        args = {
            "options": opts.to_dict(),
            "plugin_path": opts.plugin_dir or os.getcwd(),
            "parent_pid": os.getpid(),
        }
        self.log_path = Path(workdir) / WORKER_LOG
        trim_log(self.log_path)
        self._log = open(self.log_path, "ab")
        self._log_start = self._log.tell()
        # cwd is the output folder, so a source checkout's fa_bench/ in the caller's
        # directory cannot shadow the installed package inside the worker.
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "fa_bench.run.worker", json.dumps(args)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            cwd=workdir,
            env=env,
            text=True,
            start_new_session=True,  # Ctrl-C reaches the runner, which stops the worker
        )
        if self.proc.stdin is None or self.proc.stdout is None:  # PIPE gives both
            raise WorkerError("worker started without its protocol pipes")
        self._stdin, self._stdout = self.proc.stdin, self.proc.stdout
        self._lines: queue.Queue[str | None] = queue.Queue()
        self.stop: threading.Event | None = None
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self._stdout:
            self._lines.put(line)
        self._lines.put(None)

    def _next(self, timeout: float) -> dict:
        # Wait in short slices so a stop request (Ctrl-C in a multi-GPU run, whose
        # threads never see the signal themselves) ends the wait promptly.
        deadline = time.monotonic() + timeout
        while True:
            if self.stop is not None and self.stop.is_set():
                raise KeyboardInterrupt
            try:
                line = self._lines.get(timeout=min(0.5, max(0.0, deadline - time.monotonic())))
                break
            except queue.Empty:
                if time.monotonic() >= deadline:
                    raise WorkerTimeout(f"no answer within {timeout:g} s") from None
        if line is None:
            self.proc.wait(timeout=10)
            raise WorkerError(self._death_message())
        return json.loads(line)

    def _death_message(self) -> str:
        code = self.proc.returncode
        if code is not None and code < 0:
            how = f"killed by {signal.Signals(-code).name}"
        else:
            how = f"exited with status {code}"
        tail = self.stderr_tail()
        return f"worker process {how}" + (f"; stderr: {tail}" if tail else "")

    def stderr_tail(self, limit: int = 1500) -> str:
        self._log.flush()
        with open(self.log_path, "rb") as f:
            f.seek(self._log_start)
            text = f.read().decode("utf-8", "replace").strip()
        return text[-limit:]

    def wait_ready(self, timeout: float) -> dict:
        msg = self._next(timeout)
        if msg.get("op") == "plugin_error":
            raise WorkerPluginError(
                f"in the worker: {msg.get('message')}; the run stopped before its next case "
                f"(see {self.log_path})"
            )
        if msg.get("op") != "ready":
            raise WorkerError(f"unexpected first message from worker: {msg}")
        return msg["env"]

    def run(self, case: Case, timeout: float, options: dict | None = None) -> CaseRecord:
        """`options` reach the implementation's builder (a kernel config from a sweep)."""
        msg: dict = {"op": "run", "case": case.to_dict()}
        if options is not None:
            msg["options"] = options
        try:
            self._stdin.write(json.dumps(msg) + "\n")
            self._stdin.flush()
        except (BrokenPipeError, OSError):
            self.proc.wait(timeout=10)
            raise WorkerError(self._death_message()) from None
        return CaseRecord.from_json(self._next(timeout)["result"], f"worker result for {case.id}")

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self._stdin.write(json.dumps({"op": "exit"}) + "\n")
                self._stdin.flush()
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.kill()
        self._log.close()

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
        if not self._log.closed:
            self._log.close()


def _visible_device(gpu: int) -> str:
    """Index `gpu` among the devices this process may see (honours CUDA_VISIBLE_DEVICES)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        ids = [s.strip() for s in visible.split(",") if s.strip()]
        if gpu >= len(ids):
            raise ValueError(f"--gpu {gpu}: only {plural(len(ids), 'GPU')} visible ({visible})")
        return ids[gpu]
    return str(gpu)


def _placement(opts: RunOptions, env: dict | None, wall_s: float) -> Placement:
    """Host and GPU of a record: the worker sees only its pinned GPU, as its device 0."""
    env = env or {}
    gpus = env.get("gpus") or []
    gpu = None
    if opts.device != "cpu":
        seen = gpus[0] if gpus else {}
        gpu = GpuRef(index=opts.gpu or 0, uuid=seen.get("uuid"), name=seen.get("name"))
    return Placement(wall_s=wall_s, host=env.get("hostname") or socket.gethostname(), gpu=gpu)


class CaseRunner:
    """Runs cases on one worker: starts it when needed, replaces it after a crash, a
    timeout or (on a GPU, where a CUDA error can leave the context unusable) an error,
    and gives up starting it after two failed starts in a row. Every outcome is a
    record; worker trouble never raises out of `run`."""

    def __init__(self, opts: RunOptions, out_dir: Path, stop: threading.Event | None = None):
        self.opts, self.out_dir, self.stop = opts, out_dir, stop
        self.worker: Worker | None = None
        self.env: dict | None = None
        self.failed_starts = 0
        self.device_label = "cpu" if opts.device == "cpu" else f"cuda:{opts.gpu or 0}"

    def run(self, case: Case, options: dict | None = None) -> CaseRecord:
        """The case's record, with its placement (`wall_s`, `host`, `gpu`) filled in."""
        t0 = time.perf_counter()
        record = self._attempt(case, options)
        record.placement = _placement(self.opts, self.env, round(time.perf_counter() - t0, 3))
        if record.status is Status.ERROR and self.opts.device != "cpu":
            self.close()
        return record

    def _attempt(self, case: Case, options: dict | None) -> CaseRecord:
        if self.worker is None and self.failed_starts >= 2:
            return self._failed(
                case, Status.ERROR, "worker could not start (twice); see worker.log"
            )
        ready = self.worker is not None
        try:
            if self.worker is None:
                self.worker = Worker(self.opts, self.out_dir)
                self.worker.stop = self.stop
                self.env = self.worker.wait_ready(self.opts.startup_timeout_s)
                ready, self.failed_starts = True, 0
            return self.worker.run(case, self.opts.timeout_s, options)
        except WorkerError as exc:
            self.close(kill=True)
            if not ready:
                self.failed_starts += 1
                return self._failed(case, Status.ERROR, f"worker failed to start: {exc}")
            if isinstance(exc, WorkerTimeout):
                return self._failed(case, Status.TIMEOUT, f"case timed out ({exc})")
            return self._failed(case, Status.ERROR, str(exc))

    def _failed(self, case: Case, status: Status, message: str) -> CaseRecord:
        return CaseRecord.failed(case, status, message, self.device_label)

    def close(self, kill: bool = False) -> None:
        if self.worker is not None:
            self.worker.kill() if kill else self.worker.close()
            self.worker = None


ProgressFn = Callable[[str, Case, CaseRecord | None], None]


class RunStopped(KeyboardInterrupt):
    """A KeyboardInterrupt out of `execute` that carries the worker's env: an interrupted
    run's results.json still says what it ran on (its versions, GPUs, copy bandwidth)."""

    def __init__(self, env: dict | None):
        super().__init__()
        self.env = env


def execute(
    cases: Sequence[Case],
    out_dir: Path,
    opts: RunOptions,
    on_event: ProgressFn | None = None,
    stop: threading.Event | None = None,
) -> dict | None:
    """Run every case not yet in the journal of `out_dir`; return the worker's env.

    `on_event("start", case, None)` before and `on_event("done", case, record)` after
    each case. A KeyboardInterrupt (or `stop` being set, from another thread) stops the
    worker and propagates as KeyboardInterrupt; the journal keeps everything measured.
    """
    done = {r.id for r in read_journal(out_dir)}
    runner = CaseRunner(opts, out_dir, stop)
    try:
        for case in (c for c in cases if c.id not in done):
            if stop is not None and stop.is_set():
                raise KeyboardInterrupt
            if on_event:
                on_event("start", case, None)
            record = runner.run(case)
            append_journal(out_dir, record)
            if on_event:
                on_event("done", case, record)
    except KeyboardInterrupt as exc:
        raise RunStopped(runner.env) from exc
    finally:
        runner.close(kill=sys.exc_info()[0] is not None)
    return runner.env
