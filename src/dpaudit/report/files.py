"""JSON results written atomically (or created only if absent), and plain-text console tables."""

from __future__ import annotations

import errno
import json
import math
import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO

from dpaudit._jsonable import to_jsonable


def write_json(path: str | os.PathLike, obj) -> Path:
    """Write ``obj`` as JSON atomically (temp file + rename): a reader never sees half a file.

    The file gets the permissions an ordinary ``open`` would give (0666 less the umask, e.g.
    0644), so colleagues on a shared cluster can read results next to the plots.

    numpy arrays and scalars, dataclasses with ``to_dict`` and non-finite floats are converted
    (NaN -> "nan", inf -> "inf"; see ``dpaudit._jsonable``).
    """
    return atomic_write(path, _json_writer(obj))


def atomic_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically (temp file + rename), as ``write_json``."""
    return atomic_write(path, lambda fh: fh.write(text))


def atomic_write(path: str | os.PathLike, write: Callable[[IO], object],
                 binary: bool = False) -> Path:
    """``write(fh)`` into a synced temporary file beside ``path``, then renamed onto it: a
    reader never sees half a file; permissions from the umask (``write_json``)."""
    path = Path(path)
    tmp = _written_temp(path, write, binary)
    try:
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def write_new(path: str | os.PathLike, obj) -> Path:
    """Write ``obj`` as JSON to ``path`` only if no file is there: atomically and
    create-if-absent (temp file, then a hard link to ``path``, which fails if ``path`` exists,
    on local file systems and on NFS, with or without locks). ``FileExistsError`` if another
    writer got there first: two writers of one name never overwrite each other. Where the file
    system has no hard links the write falls back to ``write_json`` (a check, then a rename:
    another writer could slip in between) with a warning."""
    path = Path(path)
    tmp = _written_temp(path, _json_writer(obj))
    try:
        try:
            os.link(tmp, path)
        except FileExistsError:
            # NFS may retry a link whose reply was lost and then say EEXIST: ours if same inode
            if not os.path.samefile(tmp, path):
                raise
        except OSError as err:
            if err.errno not in _NO_HARD_LINKS:
                raise
            import logging

            logging.getLogger(__name__).warning(
                "%s: no hard links on this file system (%s); written by rename, which a "
                "second writer of the same name could overwrite", path, err.strerror)
            if path.exists():
                raise FileExistsError(errno.EEXIST, "File exists", str(path)) from None
            os.replace(tmp, path)
            return path
    finally:
        tmp.unlink(missing_ok=True)
    return path


_NO_HARD_LINKS = frozenset({errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EMLINK,
                            errno.ENOSYS})


def _json_writer(obj) -> Callable[[IO], None]:
    def write(fh) -> None:
        json.dump(to_jsonable(obj), fh, indent=2, allow_nan=False)

    return write


def _written_temp(path: Path, write: Callable[[IO], object], binary: bool = False) -> Path:
    """``write(fh)`` into a synced temporary file beside ``path`` (``.<name>.<random>.tmp``,
    UTF-8 text unless ``binary``), with the permissions an ordinary ``open`` would give."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600: use the user's umask instead
        with os.fdopen(fd, "wb" if binary else "w", **({} if binary else {"encoding": "utf-8"})
                       ) as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return Path(tmp)


def _umask() -> int:
    """The process umask: from /proc on Linux (no change of process state, safe with
    threads), else read by setting and restoring it (there is no portable getter)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def p_cell(p, digits: int = 4) -> str:
    """A p-value in a table cell: "3.2e-08", "< 1e-300" where it underflows (a p-value is never
    exactly 0: printed so, it would read as certainty), "-" when there is none."""
    if p is None:
        return "-"
    p = float(p)
    if math.isnan(p):
        return "nan"
    return "< 1e-300" if p < 1e-300 else f"{p:.{digits}g}"


def p_text(p) -> str:
    """A p-value in a sentence: "p = 3.2e-08", "p < 1e-300" where it underflows."""
    cell = p_cell(p, digits=2)
    return f"p {cell}" if cell.startswith("<") else f"p = {cell}"


def cell_text(value, precision: int = 3) -> str:
    """A table cell as the console shows it (floats to ``precision`` places, nan)."""
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.{precision}f}"
    return str(value)


def format_table(
    rows: Sequence[Mapping], columns: Sequence[str] | None = None, precision: int = 3
) -> str:
    """Render dict rows as an aligned plain-text table (numbers right-aligned)."""
    if not rows:
        return "(no rows)"
    cols = list(columns) if columns is not None else list(rows[0].keys())
    cells = [[cell_text(r.get(c, ""), precision) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    numeric = [all(isinstance(r.get(c), (int, float)) for r in rows) for c in cols]

    def line(vals):
        return "  ".join(
            v.rjust(w) if num else v.ljust(w)
            for v, w, num in zip(vals, widths, numeric, strict=True)
        )

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(cols), rule, *(line(r) for r in cells)])
