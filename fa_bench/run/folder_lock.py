"""One writer per run folder: an exclusive `fcntl.flock` on `run.lock` in the folder.

`run`, `run --resume` and `sweep` hold it for the whole run, so two of them can never
journal the same cases into one folder. The holder writes its PID into the file, and a
second one is refused (exit 2) naming it. The kernel releases a flock when its process
ends however it ends (a crash, SIGKILL), so a stale file never blocks a later run; the
file itself is left in place (removing it would let a waiting opener lock a deleted one).
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from types import TracebackType

from fa_bench.errors import UsageError

LOCK = "run.lock"


class FolderBusy(UsageError):
    """Another fa-bench process holds the folder's lock (exit 2)."""


class FolderLock:
    """`with FolderLock(folder, "--out"):` (or `acquire()` ... `release()`) creates the
    folder if needed and holds its lock."""

    def __init__(self, folder: Path, flag: str = "--out") -> None:
        self.folder, self.flag = Path(folder), flag
        self._fd: int | None = None

    def __enter__(self) -> FolderLock:
        return self.acquire()

    def acquire(self) -> FolderLock:
        path = self.folder / LOCK
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise FolderBusy(f"{self.flag} {self.folder}: cannot lock {path}: {exc}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "unknown"
            os.close(fd)
            raise FolderBusy(
                f"{self.flag} {self.folder}: in use by another fa-bench process (PID "
                f"{holder}, per {path}); wait for it to end or stop it, then try again"
            ) from None
        # Only the holder writes, so truncating and writing cannot race another writer.
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the last descriptor releases the flock
            self._fd = None

    def __del__(self) -> None:  # an early return or an exception: release with the object
        self.release()
