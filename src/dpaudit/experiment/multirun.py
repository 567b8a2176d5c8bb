"""Multi-run audits (the fixed-target game of seed 001): R trainings, one membership bit each.

Each run r trains with the same data split, initial model and canaries (``settings.seed``)
and its own sampling / noise seed; all its canaries share one bit b_r ~ Bernoulli(inclusion).
Runs are independent jobs: each writes ``runs/run_<r>.json`` (r zero-padded) atomically,
tagged with the fingerprint of the settings that produced it. An interrupted audit resumes by
skipping the runs already on disk; ``aggregate`` pools whatever is there without losing or
double-counting a run, and refuses runs made with other settings.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from dpaudit.experiment.run import PreparedRun, RunRecord, audit_run, prepare_run
from dpaudit.experiment.settings import AuditSettings
from dpaudit.experiment.threat import threat_model_for
from dpaudit.report import write_json

RUNS_DIR = "runs"
SETTINGS_FILE = "settings.json"


def fingerprint(settings: AuditSettings) -> str:
    """Hash of everything that defines a run's distribution (not progress or device)."""
    d = settings.to_dict()
    d.pop("progress", None)
    d.pop("device", None)
    skip = ("methods", "confidence", "runs")  # evaluation choices and how many runs to make
    d["audit"] = {k: v for k, v in d["audit"].items() if k not in skip}
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]


def run_bit(settings: AuditSettings, r: int) -> bool:
    """Membership bit of run r: a seeded Bernoulli(inclusion) draw, independent of order."""
    return bool(np.random.default_rng([settings.seed, r, 7]).random() < settings.audit.inclusion)


def run_path(out: Path, r: int) -> Path:
    return out / RUNS_DIR / f"run_{r:05d}.json"


def run_one(
    settings: AuditSettings, out: Path, r: int, prepared: dict[bool, PreparedRun] | None = None
) -> Path:
    """Train run r and write its record (skips the work if the record already exists).

    ``prepared`` is a cache, membership bit -> ``PreparedRun``, shared by the runs of one
    audit: the data, initial model, canaries and scores are set up once per bit, not once
    per run (the records are the same either way).
    """
    path = run_path(out, r)
    if path.exists():
        return path
    bit = run_bit(settings, r)
    membership = np.full(settings.canary.count, bit)
    cache = {} if prepared is None else prepared
    if bit not in cache:
        cache[bit] = prepare_run(settings, membership)
    record = audit_run(
        settings,
        run_seed=int(np.random.SeedSequence([settings.seed, r]).generate_state(1)[0]),
        membership=membership,
        prepared=cache[bit],
    )
    record = dataclasses.replace(
        record, candidate_scores=None, run=r, bit=int(bit), fingerprint=fingerprint(settings)
    )
    return write_json(path, record.to_dict())


def run_multi(settings: AuditSettings, out: Path) -> RunRecord:
    """Run the missing runs of ``settings.audit.runs``, then aggregate everything on disk.

    The settings are saved as ``settings.json`` next to the runs (so ``dpaudit-aggregate`` can
    re-evaluate the directory later); a directory holding other settings is refused.
    """
    saved = Path(out, SETTINGS_FILE)
    if saved.exists():
        old = AuditSettings.from_mappings(**json.loads(saved.read_text()))
        if fingerprint(old) != fingerprint(settings):
            raise ValueError(f"{out} holds a multi-run audit with other settings: use a fresh one")
    else:
        write_json(saved, settings.to_dict())
    todo = [r for r in range(settings.audit.runs) if not run_path(out, r).exists()]
    prepared: dict[bool, PreparedRun] = {}
    for r in tqdm(todo, desc="audit runs", disable=not settings.progress):
        run_one(settings, out, r, prepared)
    return aggregate(out, settings)


def read_run(path: Path) -> RunRecord:
    """The run record in ``path``; a ValueError names the file if it is not one."""
    try:
        data = json.loads(Path(path).read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not a JSON run record ({err})") from err
    record = RunRecord.from_dict(data, source=str(path))
    if record.run is None or record.fingerprint is None:
        raise ValueError(f"{path}: run record lacks its run number or settings fingerprint")
    return record


def aggregate(out: str | Path, settings: AuditSettings | None = None) -> RunRecord:
    """Pool the run records under ``out/runs`` into one record (``runs`` lists the runs).

    With ``settings``, records of other settings are an error (never silently mixed), and a
    pooled record of run files written without a threat model gets the settings' one.
    """
    files = sorted(Path(out, RUNS_DIR).glob("run_*.json"))
    if not files:
        raise ValueError(f"no run records under {Path(out, RUNS_DIR)}")
    want = fingerprint(settings) if settings is not None else None
    records = [read_run(f) for f in files]
    prints = {r.fingerprint for r in records}
    if (want is not None and prints != {want}) or len(prints) > 1:
        raise ValueError(
            f"run records under {out} come from different settings ({sorted(prints)}"
            + (f", expected {want}" if want else "")
            + "): use a fresh output directory"
        )
    runs = [r.run for r in records]
    if len(set(runs)) != len(runs):
        raise ValueError(f"duplicate run numbers under {out}")
    scores: dict[str, list] = {}
    membership: list[int] = []
    for rec in records:
        for k, v in rec.scores.items():
            scores.setdefault(k, []).extend(v)
        membership.extend(rec.membership)
    first = records[0]
    threat = first.threat_model
    if threat is None and settings is not None:
        threat = threat_model_for(settings, first.sample_rate, first.steps, first.canary_norm)
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
        runs=sorted(runs),
    )
