"""``dpaudit-aggregate DIR``: re-evaluate a multi-run audit directory, or summarise a sweep.

* A multi-run audit directory (it has ``runs/`` and ``settings.json``): pool every verified
  run record (never a run twice, never one from other settings, never a corrupt or edited
  one), recompute the bounds and rewrite ``results.json`` and the plots. Runs still missing are
  reported, not invented.
* A Hydra sweep directory (``dpaudit -m ...``): collect every job's ``results.json`` into
  ``sweep_summary.json`` (with each job's settings and the provenance of the summary) and a
  table; jobs without results (unfinished) are listed as pending. ``--html`` also writes
  ``sweep.html``: the table with the verdicts coloured, the swept setting against epsilon and
  sigma_upper, and links to each job's ``report.html``.

``dpaudit-aggregate --status DIR`` prints the progress of a multi-run audit or a Figure 3
directory instead (runs done, in training by which worker, waiting, runs per minute, time
left), from any shell, while its workers run; it evaluates nothing.

Every user error (missing directory, no runs, a one-run directory, corrupt files, mismatched
settings, a directory in use) is one line on stderr and exit status 2, never a traceback.
The work is ``dpaudit.experiment.collect`` (``reaggregate``, ``collect_sweep``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dpaudit.experiment.collect import collect_sweep, reaggregate, write_sweep_page
from dpaudit.experiment.trainings.engine import directory_status, progress_line
from dpaudit.experiment.trainings.multirun import (
    RUNS_DIR,
    SETTINGS_FILE,
    DirectoryBusyError,
    audit_status,
    status_line,
)
from dpaudit.report.lock import LocksUnavailableError

EXIT_USER_ERROR = 2


def main(argv: list[str] | None = None) -> None:
    """Console entry point ``dpaudit-aggregate DIR`` (exit 2 with one line on a user error)."""
    parser = argparse.ArgumentParser(prog="dpaudit-aggregate", description=__doc__.split("\n")[0])
    parser.add_argument("directory", type=Path, help="multi-run audit or Hydra sweep directory")
    parser.add_argument("--html", action="store_true",
                        help="a sweep: also write sweep.html (jobs, verdicts, the swept "
                        "setting's plot, links to each job's report.html)")
    parser.add_argument("--status", action="store_true",
                        help="print the progress of a multi-run audit or Figure 3 directory "
                        "(evaluates nothing)")
    args = parser.parse_args(argv)
    d = args.directory
    try:
        if not d.exists():
            raise ValueError(f"{d} does not exist")
        if not d.is_dir():
            raise ValueError(f"{d} is not a directory")
        if args.status and (d / SETTINGS_FILE).exists():
            print(status_line(audit_status(d)))
        elif args.status:  # Figure 3 (or any directory of the many-trainings engine)
            status = directory_status(d)
            print(progress_line(status, status["result"]))
        elif (d / RUNS_DIR).is_dir() or (d / SETTINGS_FILE).exists():
            reaggregate(d)
        else:
            summary = collect_sweep(d)
            if args.html:
                print(f"page: {write_sweep_page(summary)}")
            if summary["unreadable"]:
                bad = "; ".join(summary["unreadable"].values())
                raise ValueError(f"{len(summary['unreadable'])} job(s) left out: {bad}")
    except (ValueError, DirectoryBusyError, LocksUnavailableError, OSError) as err:
        print(f"dpaudit-aggregate: error: {err}", file=sys.stderr)
        raise SystemExit(EXIT_USER_ERROR) from None


if __name__ == "__main__":
    main()
