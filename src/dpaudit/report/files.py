"""JSON results written atomically, and plain-text console tables."""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from dpaudit._jsonable import to_jsonable


def write_json(path: str | os.PathLike, obj) -> Path:
    """Write ``obj`` as JSON atomically (temp file + rename): a reader never sees half a file.

    The file gets the permissions an ordinary ``open`` would give (0666 less the umask, e.g.
    0644), so colleagues on a shared cluster can read results next to the plots.

    numpy arrays and scalars, dataclasses with ``to_dict`` and non-finite floats are converted
    (NaN -> "nan", inf -> "inf"; see ``dpaudit._jsonable``).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600: use the user's umask instead
        with os.fdopen(fd, "w") as fh:
            json.dump(to_jsonable(obj), fh, indent=2, allow_nan=False)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


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


def _cell(value, precision: int) -> str:
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
    cells = [[_cell(r.get(c, ""), precision) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    numeric = [all(isinstance(r.get(c), (int, float)) for r in rows) for c in cols]

    def line(vals):
        return "  ".join(
            v.rjust(w) if num else v.ljust(w)
            for v, w, num in zip(vals, widths, numeric, strict=True)
        )

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(cols), rule, *(line(r) for r in cells)])
