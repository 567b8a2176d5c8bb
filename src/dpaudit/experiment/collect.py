"""The work behind ``dpaudit-aggregate`` (``dpaudit.tasks.aggregate``, whose docstring says
what each kind of directory gets): ``reaggregate`` pools the verified run records of a
multi-run audit directory and rewrites its report; ``collect_sweep`` summarises the jobs of a
Hydra sweep. A user error (missing directory, no runs, a one-run directory, corrupt files,
mismatched settings, a directory in use) raises ValueError, ``DirectoryBusyError`` or OSError.
"""

from __future__ import annotations

import contextlib
import json
import logging
from pathlib import Path

from dpaudit.experiment.audit import audit_split, evaluate, write_report
from dpaudit.experiment.plan import plan_audit
from dpaudit.experiment.trainings.multirun import (
    RUNS_DIR,
    DirectoryLock,
    aggregate,
    load_settings,
)
from dpaudit.report import format_table, write_json
from dpaudit.report.lock import LocksUnavailableError
from dpaudit.report.provenance import SCHEMA_VERSION, provenance
from dpaudit.report.results import AuditResult

log = logging.getLogger(__name__)


def reaggregate(directory: str | Path) -> dict:
    """Re-evaluate the multi-run audit in ``directory`` from the run records on disk (under
    the directory's lock; where the file system has no working locks, without it, said in a
    warning: the run files it reads are immutable, only the report is rewritten)."""
    out = Path(directory)
    with _directory_lock(out):
        settings = load_settings(out)
        plan = plan_audit(settings)
        run = aggregate(out, settings)
        missing = sorted(set(range(settings.audit.runs)) - set(run.runs))
        extra = {"runs_done": len(run.runs), "runs_missing": missing}
        split = audit_split(plan, run)  # the scores of the verdict's rung
        result = evaluate(settings, run, extra, plan, split).to_dict()
        write_report(result, split, run, out, plan)
    if missing:
        print(f"{len(missing)} of {settings.audit.runs} runs missing: rerun the audit to add them")
    return result


def _directory_lock(out: Path) -> contextlib.AbstractContextManager:
    lock = DirectoryLock(out, "dpaudit-aggregate")
    try:
        return lock.__enter__()
    except LocksUnavailableError as err:
        log.warning("%s: re-evaluating without the directory's lock (a worker evaluating at "
                    "the same moment would also rewrite the report)", err)
        return contextlib.nullcontext()


def write_sweep_page(summary: dict) -> Path:
    """``sweep.html`` in the sweep directory (``report.html.sweep_page``): the jobs' table and
    the plot of the swept setting (the first override whose numeric value differs between
    jobs) against epsilon and sigma_upper, also saved as ``sweep.png``."""
    from dpaudit.report.files import atomic_text
    from dpaudit.report.html import sweep_page
    from dpaudit.report.plots import plot_sweep

    root = Path(summary["directory"])
    rows = summary["jobs"]
    key = swept_setting([r["overrides"] for r in rows])
    plot = None
    if key is not None:
        for r in rows:
            r["x"] = _numeric(_override_values(r["overrides"]).get(key))
        plot = plot_sweep(rows, key, root / "sweep.png", title=str(root.name))
        for r in rows:
            r.pop("x", None)
    return atomic_text(root / "sweep.html", sweep_page(summary, plot, key))


def swept_setting(overrides: list[str]) -> str | None:
    """The first override key whose numeric value differs between the jobs, or None."""
    parsed = [_override_values(o) for o in overrides]
    for key in (parsed[0] if parsed else {}):
        values = [_numeric(p.get(key)) for p in parsed]
        if all(v is not None for v in values) and len(set(values)) > 1:
            return key
    return None


def _override_values(overrides: str) -> dict[str, str]:
    return dict(item.split("=", 1) for item in overrides.split() if "=" in item)


def _numeric(text) -> float | None:
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def _overrides(job: Path) -> str:
    path = job / ".hydra" / "overrides.yaml"
    if not path.exists():
        return ""
    lines = [ln.strip().removeprefix("- ").strip() for ln in path.read_text().splitlines()]
    return " ".join(ln for ln in lines if ln)


def _read_results(path: Path) -> dict:
    """The results file's dictionary: an audit's (with a verdict) or another task's (with its
    ``task`` name); anything else is a ValueError naming the file."""
    try:
        res = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise ValueError(f"{path}: not a readable results file ({err})") from err
    if not isinstance(res, dict):
        raise ValueError(f"{path}: not a dpaudit results file")
    if not isinstance(res.get("verdict"), dict) and not isinstance(res.get("task"), str):
        raise ValueError(f"{path}: not a dpaudit results file (no verdict, no task name)")
    return res


def _configured_sigma(res: dict):
    """The noise multiplier the job was configured with (the claim's sigma)."""
    dp = (res.get("settings") or {}).get("dp") or {}
    return dp.get("noise_multiplier", float("nan"))


def collect_sweep(directory: str | Path) -> dict:
    """Summarise every job of a sweep directory; write ``sweep_summary.json``.

    Jobs without ``results.json`` are listed as pending, jobs whose ``results.json`` cannot be
    read as ``unreadable`` (with the reason); the summary is written either way.
    """
    root = Path(directory)
    jobs = sorted(
        (p for p in root.iterdir() if p.is_dir() and (p / ".hydra").exists()),
        key=lambda p: (len(p.name), p.name),
    )
    if not jobs:
        if (root / "results.json").exists():
            raise ValueError(
                f"{root} is a one-run audit (results.json, no {RUNS_DIR}/ or sweep jobs): "
                f"nothing to aggregate, its result is {root / 'results.json'}"
            )
        raise ValueError(
            f"{root} is neither a multi-run audit (no {RUNS_DIR}/) nor a Hydra sweep "
            "(no job directories with .hydra/)"
        )
    rows, pending, unreadable, settings, other = [], [], {}, {}, {}
    for job in jobs:
        res_path = job / "results.json"
        if not res_path.exists() and (job / "figure3.json").exists():
            other[job.name] = "figure3"  # Figure 3 writes its own file
            continue
        if not res_path.exists():
            pending.append(job.name)
            continue
        try:
            res = _read_results(res_path)
        except ValueError as err:
            unreadable[job.name] = str(err)
            continue
        if not isinstance(res.get("verdict"), dict):  # another task's results (stats_demo, ...)
            other[job.name] = res["task"]
            continue
        try:
            typed = AuditResult.from_dict(res)  # any schema this release reads
        except (ValueError, TypeError) as err:
            unreadable[job.name] = f"{res_path}: {err}"
            continue
        v = typed.verdict
        settings[job.name] = typed.settings
        rows.append(
            {
                "job": job.name,
                "overrides": _overrides(job),
                "status": v.status,
                "eps_certified": v.best_lower_bound,
                "eps_estimate": v.best_estimate,
                "eps_claimed": v.claimed_epsilon,
                "sigma_configured": _configured_sigma(res),
                "sigma_upper": v.sigma_upper,
                "privacy_bug": v.privacy_bug,
            }
        )
    summary = {
        "schema_version": SCHEMA_VERSION,
        "directory": str(root),
        "jobs": rows,
        "pending": pending,
        "unreadable": unreadable,
        "other_tasks": other,  # jobs of other tasks (no verdict to summarise): job -> task
        "settings": settings,  # each job's full resolved settings, from its results.json
        "provenance": provenance(),
    }
    write_json(root / "sweep_summary.json", summary)
    shown = [{**r, "privacy_bug": "YES" if r["privacy_bug"] else "no"} for r in rows]
    print(format_table(shown) if rows else "(no finished audits)")
    if other:
        print("not audits (no verdict): " + ", ".join(f"{j} ({t})" for j, t in other.items()))
    if pending:
        print(f"pending (no results.json yet): {', '.join(pending)}")
    return summary
