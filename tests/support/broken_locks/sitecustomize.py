"""A file system whose locks do not work, for every process started with this folder on
PYTHONPATH (the tests of shared directories): ``DPAUDIT_TEST_FLOCK=enolck`` makes ``flock``
fail with ENOLCK (NFS without a lock manager), ``always`` makes it succeed without excluding
anyone (a ``nolock`` mount seen from two hosts). Test support only; never installed."""

import errno
import fcntl
import os

_MODE = os.environ.get("DPAUDIT_TEST_FLOCK")


def _enolck(fd, operation):
    raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))


def _always(fd, operation):
    return None


if _MODE == "enolck":
    fcntl.flock = _enolck
elif _MODE == "always":
    fcntl.flock = _always
