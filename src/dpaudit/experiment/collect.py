"""``dpaudit-aggregate``: re-evaluate a multi-run audit directory, or summarise a sweep.

* A multi-run audit directory (it has ``runs/`` and ``settings.json``): pool every finished
  run record (never a run twice, never one from other settings), recompute the bounds and
  rewrite ``results.json`` and the plots. Runs still missing are reported, not invented.
* A Hydra sweep directory (``dpaudit -m ...``): collect every job's ``results.json`` into
  ``sweep_summary.json`` and a table; jobs without results (unfinished) are listed as pending.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from dpaudit.experiment.audit import evaluate
from dpaudit.experiment.multirun import RUNS_DIR, SETTINGS_FILE, aggregate
from dpaudit.experiment.report import write_report
from dpaudit.experiment.settings import AuditSettings
from dpaudit.report import format_table, write_json


def reaggregate(directory: str | Path) -> dict:
    """Re-evaluate the multi-run audit in ``directory`` from the run records on disk."""
    out = Path(directory)
    settings_path = out / SETTINGS_FILE
    if not settings_path.exists():
        raise ValueError(f"{out} has no {SETTINGS_FILE}: not a multi-run audit directory")
    settings = AuditSettings.from_mappings(**json.loads(settings_path.read_text()))
    run = aggregate(out, settings)
    missing = sorted(set(range(settings.audit.runs)) - set(run.runs))
    result = evaluate(settings, run, {"runs_done": len(run.runs), "runs_missing": missing})
    write_report(result, run, out, settings)
    if missing:
        print(f"{len(missing)} of {settings.audit.runs} runs missing: rerun the audit to add them")
    return result


def _overrides(job: Path) -> str:
    path = job / ".hydra" / "overrides.yaml"
    if not path.exists():
        return ""
    lines = [ln.strip().removeprefix("- ").strip() for ln in path.read_text().splitlines()]
    return " ".join(ln for ln in lines if ln)


def collect_sweep(directory: str | Path) -> dict:
    """Summarise every job of a sweep directory; write ``sweep_summary.json``."""
    root = Path(directory)
    jobs = sorted(
        (p for p in root.iterdir() if p.is_dir() and (p / ".hydra").exists()),
        key=lambda p: (len(p.name), p.name),
    )
    if not jobs:
        raise ValueError(f"{root} holds no Hydra job directories")
    rows, pending = [], []
    for job in jobs:
        res_path = job / "results.json"
        if not res_path.exists():
            pending.append(job.name)
            continue
        res = json.loads(res_path.read_text())
        v = res.get("verdict", {})
        rows.append(
            {
                "job": job.name,
                "overrides": _overrides(job),
                "status": v.get("status", "privacy_bug" if v.get("privacy_bug") else "?"),
                "eps_certified": v.get("best_lower_bound", float("nan")),
                "eps_estimate": v.get("best_estimate", float("nan")),
                "eps_claimed": v.get("claimed_epsilon", v.get("upper_bound", float("nan"))),
                "sigma_upper": v.get("sigma_upper", float("nan")),
                "privacy_bug": "YES" if v.get("privacy_bug") else "no",
            }
        )
    summary = {"directory": str(root), "jobs": rows, "pending": pending}
    write_json(root / "sweep_summary.json", summary)
    print(format_table(rows) if rows else "(no finished jobs)")
    if pending:
        print(f"pending (no results.json yet): {', '.join(pending)}")
    return summary


def main(argv: list[str] | None = None) -> None:
    """Console entry point ``dpaudit-aggregate DIR``."""
    parser = argparse.ArgumentParser(prog="dpaudit-aggregate", description=__doc__.split("\n")[0])
    parser.add_argument("directory", type=Path, help="multi-run audit or Hydra sweep directory")
    args = parser.parse_args(argv)
    if not args.directory.is_dir():
        parser.error(f"{args.directory} is not a directory")
    if (args.directory / RUNS_DIR).is_dir():
        reaggregate(args.directory)
    else:
        collect_sweep(args.directory)


if __name__ == "__main__":
    main()
