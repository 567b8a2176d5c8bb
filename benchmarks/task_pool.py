"""Running a benchmark's audits: one function over a list of tasks, in worker processes or in
this one, timed, with the machine's load beside it (shared by the scripts that print tables of
audits: bug_zoo, data_rate_zoo, premises, user_claim)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor


def run_tasks(one: Callable, tasks: Sequence, jobs: int) -> tuple[list, float, tuple | None]:
    """``one`` over ``tasks`` in task order, in ``jobs`` processes (1: in this one). Returns
    the rows, the wall seconds they took and the load average after them (None where the
    platform has none)."""
    t0 = time.perf_counter()
    if jobs > 1:
        with ProcessPoolExecutor(jobs) as pool:
            rows = list(pool.map(one, tasks))
    else:
        rows = [one(t) for t in tasks]
    wall = time.perf_counter() - t0
    return rows, wall, (os.getloadavg() if hasattr(os, "getloadavg") else None)
