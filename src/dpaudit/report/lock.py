"""An exclusive lock of an output directory, so two processes never do the same work.

``flock`` on ``<dir>/.dpaudit.lock``: the kernel releases it when its holder exits or is
killed, so a lock can never be left "stale"; the file names its last holder (pid, host, time,
purpose, command), so a refused process says who holds it and a takeover after a crash is
logged. Works on local file systems and on NFS (Linux emulates ``flock`` with POSIX locks
there). This module imports no torch, so a lock is cheap to take.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import socket
import sys
from pathlib import Path

LOCK_FILE = ".dpaudit.lock"

log = logging.getLogger("dpaudit.experiment.multirun")


class DirectoryBusyError(RuntimeError):
    """Another live process holds the directory's lock."""


class DirectoryLock:
    """Exclusive lock of an audit directory (``flock`` on ``.dpaudit.lock``).

    The file holds the holder's pid, host, start time and command, so a refused process can
    say who holds it. The kernel releases the lock when its holder exits or is killed; a lock
    file that still names a holder when the lock is free was left by a dead process and is
    taken over with a log line. Use as a context manager.
    """

    def __init__(self, directory: str | Path, purpose: str = "audit"):
        self.path = Path(directory) / LOCK_FILE
        self.purpose = purpose
        self._fd: int | None = None

    def __enter__(self) -> DirectoryLock:
        try:
            import fcntl
        except ImportError:  # not POSIX: no lock (documented)
            return self
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = _describe_holder(os.pread(fd, 4096, 0))
            os.close(fd)
            raise DirectoryBusyError(
                f"{self.path.parent} is in use by {holder}: wait for it to finish (a second "
                "process would only repeat its runs), or use another output directory"
            ) from None
        previous = os.pread(fd, 4096, 0)
        if previous.strip():
            log.warning(
                "%s: lock left by %s, which is no longer running: taken over",
                self.path,
                _describe_holder(previous),
            )
        info = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "since": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "purpose": self.purpose,
            "command": " ".join(sys.argv)[:300],
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
        os.fsync(fd)
        self._fd = fd
        return self

    def __exit__(self, *exc) -> None:
        if self._fd is None:
            return
        import fcntl

        os.ftruncate(self._fd, 0)  # an empty lock file: released cleanly
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None


def _describe_holder(raw: bytes) -> str:
    try:
        h = json.loads(raw.decode("utf-8"))
        return f"{h['purpose']} pid {h['pid']} on {h['host']} (since {h['since']})"
    except (ValueError, KeyError, TypeError):
        return "another process"
