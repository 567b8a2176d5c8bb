"""Exclusive locks on files that name their holder: an output directory's (``DirectoryLock``)
and a multi-run audit's per-run claims (``FileLock``), so two processes never do the same work.

``flock`` on the lock file (``<dir>/.dpaudit.lock``, ``runs/.claims/run_<r>.lock``): the
kernel releases it when its holder exits or is killed, so a lock can never be left "stale";
the file names its last holder (pid, host, time, purpose, command), so a refused process says
who holds it and a takeover after a crash is logged. This module imports no torch, so a lock is
cheap to take.

Not every file system gives working locks. On NFS, Linux emulates ``flock`` with POSIX locks
when the server's lock manager answers; without one ``flock`` fails (``ENOLCK``), and a
``nolock`` mount grants every lock locally, so processes on two hosts both "hold" it. A lock
that fails for any reason but "held by another" raises ``LocksUnavailableError`` (never read as
"busy"), and ``check_exclusive`` probes, before any work, that a second process cannot take a
lock this one holds. A probe on one host cannot see a ``nolock`` mount's cross-host gap: the
callers also write their results with ``files.write_new`` (create-if-absent), so two holders of
one "lock" are caught at the write, never silently merged.
"""

from __future__ import annotations

import datetime
import errno
import json
import logging
import os
import socket
import subprocess
import sys
from pathlib import Path

LOCK_FILE = ".dpaudit.lock"

log = logging.getLogger(__name__)


# flock's errors that mean "another process holds it"; any other error means no working lock
_BUSY = frozenset({errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES})


class DirectoryBusyError(RuntimeError):
    """Another live process holds the directory's lock."""


class LocksUnavailableError(RuntimeError):
    """The file system gives no working exclusive lock here (``reason`` says what failed)."""

    def __init__(self, directory: str | Path, reason: str):
        self.directory = Path(directory)
        self.reason = reason
        super().__init__(f"{directory}: the file system gives no working locks ({reason})")


class FileLock:
    """Exclusive ``flock`` on one lock file that names its holder (module doc).

    ``wait=False``: a held lock raises ``DirectoryBusyError`` naming the holder; ``wait=True``
    blocks until it is free (for short critical sections). ``try_take`` returns None instead
    of raising. Use as a context manager.
    """

    def __init__(self, path: str | Path, purpose: str, wait: bool = False):
        self.path = Path(path)
        self.purpose = purpose
        self.wait = wait
        self._fd: int | None = None

    def try_take(self) -> FileLock | None:
        """Take the lock if it is free: self (held; release with ``release``) or None."""
        try:
            return self.__enter__()
        except DirectoryBusyError:
            return None

    def __enter__(self) -> FileLock:
        if self._fd is not None:  # already held (``try_take`` then ``with``)
            return self
        try:
            import fcntl
        except ImportError:  # not POSIX: no lock (documented)
            return self
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if self.wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            if err.errno not in _BUSY:  # ENOLCK, EOPNOTSUPP, ...: not "held by another"
                os.close(fd)
                raise LocksUnavailableError(
                    self.path.parent, f"flock on {self.path.name}: {err.strerror or err}"
                ) from err
            holder = _describe_holder(os.pread(fd, 4096, 0))
            os.close(fd)
            raise DirectoryBusyError(
                f"{self.path.parent} is in use by {holder}: wait for it to finish, or use "
                "another output directory"
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

    def release(self) -> None:
        """Give the lock back, leaving an empty lock file (released cleanly)."""
        if self._fd is None:
            return
        import fcntl

        os.ftruncate(self._fd, 0)
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None

    def __exit__(self, *exc) -> None:
        self.release()


class DirectoryLock(FileLock):
    """Exclusive lock of an audit directory (``flock`` on ``<dir>/.dpaudit.lock``).

    The file holds the holder's pid, host, start time and command, so a refused process can
    say who holds it. The kernel releases the lock when its holder exits or is killed; a lock
    file that still names a holder when the lock is free was left by a dead process and is
    taken over with a log line. ``wait=True`` waits for the holder instead of refusing.
    """

    def __init__(self, directory: str | Path, purpose: str = "audit", wait: bool = False):
        super().__init__(Path(directory) / LOCK_FILE, purpose, wait)


# The probe's second process: try the lock without waiting; say "taken", "busy" or the errno.
_PROBE = """
import errno, fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    print("taken")
except OSError as err:
    print("busy" if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES) else
          "error " + (errno.errorcode.get(err.errno) or str(err.errno)))
"""


def check_exclusive(directory: str | Path) -> None:
    """Check that ``directory`` gives working exclusive locks: this process takes a lock on a
    probe file and a second process (started from this interpreter, with its environment) must
    find it held. Raises ``LocksUnavailableError`` saying what failed; costs one short process
    start. Without ``fcntl`` (not POSIX) there are no locks at all, also refused."""
    directory = Path(directory)
    try:
        import fcntl  # noqa: F401
    except ImportError:
        raise LocksUnavailableError(directory, "no fcntl on this platform") from None
    probe = directory / f".dpaudit.probe.{socket.gethostname()}.{os.getpid()}.lock"
    try:
        with FileLock(probe, "lock probe"):
            answer = subprocess.run(
                [sys.executable, "-c", _PROBE, str(probe)],
                capture_output=True, text=True, check=False,
            )
    finally:
        probe.unlink(missing_ok=True)
    said = answer.stdout.strip()
    if said == "busy":
        return
    if said == "taken":
        raise LocksUnavailableError(
            directory, "a second process took a lock this one holds: locks do not exclude")
    raise LocksUnavailableError(
        directory, f"the probe's second process said {said or answer.stderr.strip()[-200:]!r}")


def _describe_holder(raw: bytes) -> str:
    try:
        h = json.loads(raw.decode("utf-8"))
        return f"{h['purpose']} pid {h['pid']} on {h['host']} (since {h['since']})"
    except (ValueError, KeyError, TypeError):
        return "another process"
