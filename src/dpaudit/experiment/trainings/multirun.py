"""Multi-run audits (the fixed-target game of seed 001): R trainings, one membership bit each.

Each run r trains with the same data split, initial model and canaries (``settings.seed``)
and its own sampling / noise seed; all its canaries share one bit b_r ~ Bernoulli(inclusion).
Runs are independent jobs: each writes ``runs/run_<r>.json`` (r zero-padded) atomically,
with its white-box records compacted (``capture.records_io``: O(steps x tensors) numbers;
files written before dpaudit kept them have none and are read as before). The pooled record
carries the records of one run, the lowest-numbered that has them (``WHITE_BOX_RUN``).

A run file describes and checks itself: it carries the settings' fingerprint, the full resolved
settings, the provenance block (versions, git revision, time, device) and a ``checksum``
(sha256 of its canonical JSON without that key). Reading a run file verifies the checksum, that
it holds the run its name says, and that its membership bit is the one ``run_bit`` recomputes
from the seed. A file that fails (truncated, garbage, ``{}``, not UTF-8, edited by hand, made
with other settings) is named in one line; the audit sets it aside in ``runs/quarantine/``
(never deleted) and redoes the run, ``dpaudit-aggregate`` refuses to pool it.

An interrupted audit resumes by skipping the valid runs already on disk, and several workers
may share its directory: the runs go through the many-trainings engine (``engine``: per-run
claims, a directory lock held for moments, the last worker evaluates).
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import logging
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dpaudit import seeds
from dpaudit._jsonable import to_jsonable
from dpaudit.experiment.plan import (
    AuditPlan,
    membership_counts,
    plan_audit,
    recorded_threat_model,
)
from dpaudit.experiment.settings import AuditSettings
from dpaudit.experiment.trainings.engine import (
    RUNS_DIR,
    ManyTrainings,
    WorkerDone,
    progress,
    progress_line,
    run_all,
    run_number,
    run_path,
)
from dpaudit.experiment.trainings.run import (
    PreparedRun,
    RunRecord,
    audit_run,
    prepare_run,
)
from dpaudit.report import write_json, write_new
from dpaudit.report.lock import LOCK_FILE, DirectoryBusyError, DirectoryLock
from dpaudit.report.provenance import SCHEMA_VERSION, provenance

__all__ = [
    "LOCK_FILE",
    "DirectoryBusyError",
    "DirectoryLock",
    "RunFileError",
    "WorkerDone",
    "aggregate",
    "audit_status",
    "read_run",
    "run_multi",
]

SETTINGS_FILE = "settings.json"
WHITE_BOX_RUN = (
    "every run is a training with the same claim, so the premises of the training data's "
    "epsilon hold, or fail, per training: the white-box checks and the training data's upper "
    "side are those of one run, the lowest-numbered whose file keeps its records (chosen "
    "before any record is judged, so its checks keep their levels; the other runs' records "
    "stay in their files)")
QUARANTINE_DIR = "quarantine"

log = logging.getLogger(__name__)


class RunFileError(ValueError):
    """A run file that is not a valid run record of this audit (``path``, ``reason``)."""

    def __init__(self, path: str | Path, reason: str):
        self.path, self.reason = Path(path), reason
        super().__init__(f"{path}: {reason}")


def fingerprint(settings: AuditSettings) -> str:
    """Hash of everything that defines a run's distribution (not progress or device)."""
    d = settings.to_dict()
    d.pop("progress", None)
    d.pop("device", None)
    # evaluation choices, how many runs to make, and which worker makes them
    skip = ("methods", "confidence", "refutation_level", "runs", "worker", "workers",
            "coordination", "threat_model")
    d["audit"] = {k: v for k, v in d["audit"].items() if k not in skip}
    if d["model"].get("init", "random") == "random":  # as before model.init existed
        for k in ("init", "pretrain_epochs", "pretrain_lr", "pretrain_batch_size"):
            d["model"].pop(k, None)
    if not d["canary"].get("options"):  # empty: as before canary.options existed
        d["canary"].pop("options", None)
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]


def checksum(payload: dict) -> str:
    """``sha256:<hex>`` of ``payload``'s canonical JSON (sorted keys, no spaces), without the
    ``checksum`` key itself: any change of a value, a bit or a score changes it."""
    body = {k: v for k, v in payload.items() if k != "checksum"}
    text = json.dumps(to_jsonable(body), sort_keys=True, separators=(",", ":"), allow_nan=False)
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class RunIdentity:
    """What a run file must match to belong to an audit, made once from its settings: the
    settings' ``fingerprint``, the seed and inclusion its membership bits are drawn from, and
    the number of canaries per run."""

    fingerprint: str
    seed: int
    inclusion: float
    count: int


def run_identity(settings: AuditSettings | RunIdentity) -> RunIdentity:
    """The ``RunIdentity`` of ``settings`` (a ``RunIdentity`` is returned as it is)."""
    if isinstance(settings, RunIdentity):
        return settings
    return RunIdentity(fingerprint(settings), settings.seed, settings.audit.inclusion,
                       settings.canary.count)


def run_bit(settings: AuditSettings | RunIdentity, r: int) -> bool:
    """Membership bit of run r: a seeded Bernoulli(inclusion) draw, independent of order."""
    ident = run_identity(settings)
    return seeds.run_bit(ident.seed, r, ident.inclusion)


def run_one(
    settings: AuditSettings, out: Path, r: int, prepared: dict[bool, PreparedRun] | None = None,
    plan: AuditPlan | None = None,
) -> Path:
    """Train run r and write its self-checking record (skips the work if a file exists).

    ``prepared`` is a cache, membership bit -> ``PreparedRun``, shared by the runs of one
    audit: the data, initial model, canaries and scores are set up once per bit, not once
    per run (the records are the same either way). ``plan``: the settings' ``AuditPlan``
    (built here when not given); the settings themselves go into the file.
    """
    path = run_path(out, r)
    if path.exists():
        return path
    plan = plan_audit(settings) if plan is None else plan
    bit = seeds.run_bit(plan.seed, r, plan.judging.inclusion)
    membership = np.full(plan.canary.count, bit)
    cache = {} if prepared is None else prepared
    if bit not in cache:
        cache[bit] = prepare_run(plan, membership, warn=not cache)  # one warning per audit
    record = audit_run(
        plan.quiet(),  # one bar: the audit's, over its runs
        run_seed=seeds.run_seed(plan.seed, r),
        membership=membership,
        prepared=cache[bit],
        per_step=False,  # the scores are pooled across runs; the white-box records are kept
    )
    record = dataclasses.replace(
        record, candidate_scores=None, run=r, bit=int(bit), fingerprint=fingerprint(settings)
    )
    payload = to_jsonable(record.to_dict())
    payload["schema_version"] = SCHEMA_VERSION
    payload["settings"] = to_jsonable(settings.to_dict())
    payload["provenance"] = provenance(str(plan.device))
    payload["worker"] = {"index": settings.audit.worker, "pid": os.getpid(),
                         "host": socket.gethostname()}  # who trained it (sharded audits)
    payload["checksum"] = checksum(payload)
    return write_new(path, payload)  # never over another worker's file (engine: FileExistsError)


def read_run(path: str | Path, settings: AuditSettings | RunIdentity | None = None
             ) -> RunRecord:
    """The verified run record in ``path``; a ``RunFileError`` (a ValueError) names the file
    and what is wrong with it.

    Checks: UTF-8 JSON object, the keys of a run record, the checksum, the run number against
    the file name, one membership bit for all canaries and one score per canary; with
    ``settings`` (or their ``RunIdentity``) also the settings fingerprint, the canary count
    and the bit recomputed from the seed (``run_bit``).
    """
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise RunFileError(path, f"cannot be read ({err.strerror})") from err
    if not raw.strip():
        raise RunFileError(path, "is empty (a write that never finished?)")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise RunFileError(
            path, f"is not UTF-8 text (byte 0x{raw[err.start]:02x} at offset {err.start})"
        ) from err
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise RunFileError(
            path,
            f"is not valid JSON ({err.msg}: line {err.lineno}, column {err.colno}; truncated?)",
        ) from err
    if not isinstance(data, dict):
        raise RunFileError(path, f"holds a JSON {type(data).__name__}, not a run record")
    if not data:
        raise RunFileError(path, "holds an empty JSON object {}")
    try:
        record = RunRecord.from_dict(data)
    except (TypeError, ValueError) as err:
        raise RunFileError(path, str(err)) from err
    if record.run is None or record.fingerprint is None or record.bit is None:
        raise RunFileError(path, "run record lacks its run number, bit or settings fingerprint")
    if "checksum" not in data:
        raise RunFileError(path, "has no checksum (written by hand or by dpaudit before 0.2?)")
    if data["checksum"] != checksum(data):
        raise RunFileError(path, "checksum mismatch: the file was changed after it was written")
    number = run_number(path)
    if number is not None and number != record.run:
        raise RunFileError(path, f"holds run {record.run}, not run {number}")
    if any(int(m) != record.bit for m in record.membership):
        raise RunFileError(path, f"membership {record.membership} disagrees with bit {record.bit}")
    for name, s in record.scores.items():
        if len(s) != len(record.membership):
            raise RunFileError(
                path, f"{len(s)} {name} scores for {len(record.membership)} canaries"
            )
    if settings is not None:
        ident = run_identity(settings)
        want = ident.fingerprint
        if record.fingerprint != want:
            raise RunFileError(
                path,
                f"made with other settings (fingerprint {record.fingerprint}, this audit {want})",
            )
        if bool(record.bit) != run_bit(ident, record.run):
            raise RunFileError(
                path,
                f"membership bit {record.bit} is not the bit seed {ident.seed} gives run "
                f"{record.run} ({int(run_bit(ident, record.run))})",
            )
        if len(record.membership) != ident.count:
            raise RunFileError(
                path, f"{len(record.membership)} canaries, the settings say {ident.count}"
            )
    return record


def scan_runs(
    out: str | Path, settings: AuditSettings | RunIdentity | None = None
) -> tuple[dict[int, RunRecord], list[RunFileError]]:
    """Every run file under ``out/runs``: the valid records by run number, and the errors."""
    settings = None if settings is None else run_identity(settings)
    good: dict[int, RunRecord] = {}
    bad: list[RunFileError] = []
    for f in sorted(Path(out, RUNS_DIR).glob("run_*.json")):
        try:
            rec = read_run(f, settings)
        except RunFileError as err:
            bad.append(err)
            continue
        if rec.run in good:
            bad.append(RunFileError(f, f"run {rec.run} is already in another file"))
            continue
        good[rec.run] = rec
    return good, bad


def quarantine(path: str | Path) -> Path:
    """Move ``path`` to ``quarantine/<name>.<UTC time>`` beside it (never deleted)."""
    path = Path(path)
    dest_dir = path.parent / QUARANTINE_DIR
    dest_dir.mkdir(exist_ok=True)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
    dest, i = dest_dir / f"{path.name}.{stamp}", 1
    while dest.exists():
        dest, i = dest_dir / f"{path.name}.{stamp}.{i}", i + 1
    os.rename(path, dest)
    return dest


def load_settings(out: str | Path) -> AuditSettings:
    """The settings saved in ``out/settings.json``; a ValueError names the file if unreadable."""
    path = Path(out, SETTINGS_FILE)
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
        if isinstance(data, dict) and "settings" in data and "provenance" in data:
            data = data["settings"]  # schema 2: settings beside provenance and fingerprint
        if not isinstance(data, dict):
            raise ValueError(f"a JSON {type(data).__name__}, not the settings")
        return AuditSettings.from_mappings(**data)
    except FileNotFoundError:
        raise ValueError(f"{out} has no {SETTINGS_FILE}: not a multi-run audit directory") from None
    except (OSError, UnicodeDecodeError, ValueError, TypeError) as err:
        raise ValueError(f"{path}: not readable audit settings ({err})") from err


def save_settings(out: str | Path, settings: AuditSettings, new: bool = False,
                  device: str | None = None) -> Path:
    """Write ``settings.json``: the full resolved settings, fingerprint and provenance
    (``device``: the audit's, resolved from the settings when not given). ``new``: only if
    no such file exists (``FileExistsError`` otherwise)."""
    return (write_new if new else write_json)(
        Path(out, SETTINGS_FILE),
        {
            "schema_version": SCHEMA_VERSION,
            "fingerprint": fingerprint(settings),
            "settings": settings.to_dict(),
            "provenance": provenance(device or str(plan_audit(settings).device)),
        },
    )


def _check_settings(settings: AuditSettings, out: Path, device: str | None = None) -> None:
    """Save ``settings.json``, or refuse a directory that holds another audit's. The file is
    created only if absent, so workers starting together without locks agree on one."""
    saved = Path(out, SETTINGS_FILE)
    if not saved.exists():
        try:
            save_settings(out, settings, new=True, device=device)
            return
        except FileExistsError:
            pass  # a peer saved it first: compare with it
    try:
        old = load_settings(out)
    except ValueError as err:
        dest = quarantine(saved)
        log.warning("%s; moved to %s and written anew", err, dest)
        save_settings(out, settings, device=device)
        return
    if fingerprint(old) != fingerprint(settings):
        raise ValueError(f"{out} holds a multi-run audit with other settings: use a fresh one")


def _tidy(out: Path, ident: RunIdentity, only: set[int] | None = None
          ) -> dict[int, RunRecord]:
    """Set aside invalid run files (moved to quarantine, their runs redone); the valid
    records by run number. ``only``: set aside only the files of these runs (a static
    worker's share; the others belong to other workers)."""
    good, bad = scan_runs(out, ident)
    for err in bad:
        if only is not None and run_number(err.path) not in only:
            continue
        dest = quarantine(err.path)
        log.warning("%s; moved to %s, the run will be redone", err, dest)
    return good


def run_multi(settings: AuditSettings, out: Path,
              finish: Callable[[RunRecord], object] | None = None,
              plan: AuditPlan | None = None) -> object:
    """Train the runs of ``settings.audit.runs`` that are neither on disk nor in training by
    another worker (``engine.run_all``: any number of workers may share ``out``); once every
    run is done, return the pooled record (with ``finish``: ``finish(record)``, called while
    this worker holds the evaluation's claim, so no other worker writes its report at the same
    time), or ``WorkerDone`` when another worker evaluates. A directory holding other
    settings is refused; invalid run files are set aside and their runs redone. ``plan``: the
    settings' ``AuditPlan`` when the caller made it already."""
    out = Path(out)
    plan = plan_audit(settings) if plan is None else plan
    a, ident = settings.audit, run_identity(settings)
    membership_counts(plan)  # a draw without both kinds of run is refused before any file
    prepared: dict[bool, PreparedRun] = {}
    job = ManyTrainings(
        out=out,
        runs=a.runs,
        setup=lambda: _check_settings(settings, out, str(plan.device)),
        train=lambda r: run_one(settings, out, r, prepared, plan),
        tidy=lambda only: set(_tidy(out, ident, only)),
        worker=a.worker,
        workers=a.workers,
        coordination=a.coordination,
        setting="audit.coordination",
        progress=settings.progress,
        desc="audit runs",
    )
    done = run_all(job)
    if isinstance(done, WorkerDone):
        return done
    with done:
        record = aggregate(out, settings, ident)
        return record if finish is None else finish(record)


def audit_status(out: str | Path, recent: int = 20) -> dict:
    """Progress of the multi-run audit in ``out`` (``engine.progress``), from any shell while
    its workers run; ``evaluated``: ``results.json`` is there and no run is missing."""
    out = Path(out)
    status = progress(out, load_settings(out).audit.runs, recent)
    status["evaluated"] = Path(out, "results.json").exists() and status["to_go"] == 0
    return status


def status_line(status: dict) -> str:
    """``audit_status`` in one line."""
    return progress_line(status, "results.json")


def _problems(bad: list[RunFileError], limit: int = 3) -> str:
    shown = "; ".join(f"{e.path.name} {e.reason}" for e in bad[:limit])
    return shown + (f"; and {len(bad) - limit} more" if len(bad) > limit else "")


def _summed(values) -> float | None:
    """Sum of the known values (runs read from older files may lack a time), or None."""
    known = [v for v in values if v is not None]
    return float(sum(known)) if known else None


def aggregate(out: str | Path, settings: AuditSettings | None = None,
              identity: RunIdentity | None = None) -> RunRecord:
    """Pool the verified run records under ``out/runs`` into one record (``runs`` lists them).

    With ``settings``, every record must come from them (never silently mixed) and carry the
    bit the seed gives its run; a pooled record of run files written without a threat model
    gets the settings' one. Any invalid file is a ValueError naming it (rerunning the audit
    sets such files aside and redoes their runs). ``identity``: the settings' ``RunIdentity``
    when the caller made it already.
    """
    runs_dir = Path(out, RUNS_DIR)
    if not any(runs_dir.glob("run_*.json")):
        raise ValueError(f"no run records under {runs_dir}")
    if identity is None and settings is not None:
        identity = run_identity(settings)
    good, bad = scan_runs(out, identity)
    if bad:
        other = all("other settings" in e.reason for e in bad)
        raise ValueError(
            f"{len(bad)} run file(s) under {runs_dir} "
            + ("come from different settings" if other else "are not usable")
            + f": {_problems(bad)}. Rerun the audit on {out} to set them aside and redo them"
        )
    records = [good[r] for r in sorted(good)]
    prints = {r.fingerprint for r in records}
    if len(prints) > 1:
        raise ValueError(
            f"run records under {out} come from different settings ({sorted(prints)}): "
            "use a fresh output directory"
        )
    scores: dict[str, list] = {}
    membership: list[int] = []
    for rec in records:
        for k, v in rec.scores.items():
            scores.setdefault(k, []).extend(v)
        membership.extend(rec.membership)
    rungs = pooled_rungs([rec.rungs for rec in records])
    first = records[0]
    recorded = [rec for rec in records if rec.white_box is not None]
    threat = first.threat_model
    if threat is None and settings is not None:  # run files written before threat models
        threat = recorded_threat_model(plan_audit(settings), first.sample_rate, first.steps,
                                       first.canary_norm)
    return RunRecord(
        scores=scores,
        membership=membership,
        steps=first.steps,
        sample_rate=first.sample_rate,
        engine_accountants=first.engine_accountants,
        test_accuracy=float(np.mean([r.test_accuracy for r in records])),
        canary_info=first.canary_info,
        threat_model=threat,
        canary_norm=first.canary_norm,
        independent=first.independent,
        runs=sorted(good),
        train_seconds=_summed([r.train_seconds for r in records]),
        rungs=rungs,
        white_box=recorded[0].white_box if recorded else None,
        white_box_source=None if not recorded else {
            "run": recorded[0].run, "runs_with_records": len(recorded), "runs": len(records),
            "note": WHITE_BOX_RUN},
    )


def pooled_rungs(per_run: list[dict | None]) -> dict | None:
    """The weaker rungs' scores of runs pooled run after run (the first run's summary; a
    rung some run lacks, e.g. run files written before the ladder, has none, with why)."""
    if not per_run or all(r is None for r in per_run):
        return None
    out: dict = {}
    for rung in sorted({k for r in per_run if r for k in r}):
        entries = [(r or {}).get(rung) for r in per_run]
        if any(e is None for e in entries):
            out[rung] = {"reason": "some run files hold no scores for it (written before "
                         "the threat-model ladder)"}
        elif any("scores" not in e for e in entries):
            out[rung] = {"reason": next(e["reason"] for e in entries if "scores" not in e)}
        else:
            names = set.intersection(*(set(e["scores"]) for e in entries))
            out[rung] = {"scores": {n: [v for e in entries for v in e["scores"][n]]
                                    for n in sorted(names)}}
            if "summary" in entries[0]:
                out[rung]["summary"] = entries[0]["summary"]
    return out
