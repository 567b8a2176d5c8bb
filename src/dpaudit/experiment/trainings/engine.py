"""Many trainings: a directory of R runs, each a file, made by any number of workers.

A run is (the job's settings, run index r) -> one self-checking file under ``runs/``. The
engine plans the runs, skips those on disk, trains the rest and says when all are done; the
job supplies what a run is (``ManyTrainings``): multi-run audits (``multirun``) and Figure 3
(``tasks.figure3``) both go through it, so both resume and shard the same way.

Sharing: any number of processes (a Hydra sweep's jobs, the same command started twice, Slurm
array tasks on a shared file system) may work on one directory. A worker claims a run while it
trains it (``flock`` on ``runs/.claims/run_<r>.lock``, naming its pid and host; the kernel
drops a claim when its holder dies). The directory's own lock (``.dpaudit.lock``) is held only
for moments: to check or save the settings, set aside what a dead worker left, and decide which
worker evaluates. A worker with no free run left waits on the claims of the runs still in
training: when one ends without its run file (its worker died), it trains that run itself, so
a killed worker's runs are redone by another and the job completes. Of the workers that find
every run done, the first to take the directory's lock evaluates (``runs/.evaluated``); the
others get ``WorkerDone``. A rerun on a finished directory evaluates again.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from pathlib import Path

from tqdm.auto import tqdm

from dpaudit.report import write_json
from dpaudit.report.lock import DirectoryLock, FileLock

RUNS_DIR = "runs"
CLAIMS_DIR = ".claims"  # under runs/: one lock file per run being trained
EVALUATED_FILE = ".evaluated"  # under runs/: who took the evaluation, and when


@dataclasses.dataclass(frozen=True)
class WorkerDone:
    """A worker that leaves the evaluation to another: every run is done, and it trained
    ``trained`` of them."""

    trained: int


@dataclasses.dataclass
class ManyTrainings:
    """What the engine needs of a job.

    Attributes:
        out: the job's directory (``runs/`` below it).
        runs: how many runs, 0..runs-1.
        start: the run this worker tries first (workers started together start apart).
        setup: called under the directory's lock before any run: check or save the settings
            (raise ValueError to refuse the directory).
        train: trains run r and writes its file ``run_path(out, r)`` atomically.
        tidy: called under the directory's lock (after partial files of dead workers are
            removed): set aside invalid run files; returns the numbers of the valid runs.
        progress: show a bar over the runs; ``desc`` its label.
    """

    out: Path
    runs: int
    start: int
    setup: Callable[[], None]
    train: Callable[[int], object]
    tidy: Callable[[], set[int]]
    progress: bool = True
    desc: str = "runs"


def run_path(out: str | Path, r: int) -> Path:
    """Where run r's file lives: ``out/runs/run_<r:05d>.json``."""
    return Path(out) / RUNS_DIR / f"run_{r:05d}.json"


def claim_of(out: str | Path, r: int, wait: bool = False) -> FileLock:
    """The claim on run r: ``runs/.claims/run_<r>.lock`` (``flock``; the kernel drops it when
    its worker dies, so a dead worker's run is taken over and redone). ``wait``: block until
    the claim is free instead of refusing."""
    return FileLock(Path(out) / RUNS_DIR / CLAIMS_DIR / f"run_{r:05d}.lock", f"run {r}", wait)


def claimed(out: str | Path, r: int) -> bool:
    """True while a live worker trains run r."""
    claim = claim_of(out, r).try_take()
    if claim is None:
        return True
    claim.release()
    return False


def visit_order(runs: int, worker: int, workers: int) -> int:
    """The first run worker ``worker`` of ``workers`` tries: k/n of the way in."""
    return (runs * worker) // max(workers, 1)


def _remove_partial_files(out: Path) -> None:
    """Delete what a worker killed mid-write left: ``write_json``'s temporary files of runs no
    live worker claims (never a run file: only complete files are renamed into place)."""
    for tmp in Path(out, RUNS_DIR).glob(".run_*.json.*.tmp"):
        number = tmp.name.removeprefix(".run_").split(".", 1)[0]
        if number.isdigit() and not claimed(out, int(number)):
            tmp.unlink(missing_ok=True)


def _train_free_runs(job: ManyTrainings, bar) -> int:
    """One pass over the runs: train each that has no file and no live claim; how many."""
    trained = 0
    for i in range(job.runs):
        r = (job.start + i) % job.runs
        if run_path(job.out, r).exists():
            continue
        claim = claim_of(job.out, r).try_take()
        if claim is None:
            continue  # another worker trains it
        with claim:
            if not run_path(job.out, r).exists():  # finished between the check and the claim
                job.train(r)
                trained += 1
        bar.n = sum(run_path(job.out, k).exists() for k in range(job.runs))
        bar.refresh()
    return trained


def run_all(job: ManyTrainings) -> int | WorkerDone:
    """Make every run of ``job`` that is neither on disk nor in training elsewhere (module
    doc). Returns the number this worker trained when it is the one to evaluate, or
    ``WorkerDone`` when another worker evaluates."""
    out = Path(job.out)
    started = time.time()
    with DirectoryLock(out, "audit", wait=True):
        job.setup()
        _remove_partial_files(out)
        good = job.tidy()
    bar = tqdm(total=job.runs, initial=len(good), desc=job.desc, disable=not job.progress)
    trained = 0
    while True:
        trained += _train_free_runs(job, bar)
        with DirectoryLock(out, "audit", wait=True):
            _remove_partial_files(out)
            good = job.tidy()
            missing = [r for r in range(job.runs) if r not in good]
            if not missing:
                bar.close()
                marker = Path(out, RUNS_DIR, EVALUATED_FILE)
                if marker.exists() and marker.stat().st_mtime >= started:
                    return WorkerDone(trained)  # another worker found them done first
                write_json(marker, {"pid": os.getpid(), "runs": job.runs,
                                    "trained_here": trained})
                return trained
        # the missing runs are in training elsewhere (or were a moment ago): wait for the
        # first one's claim; it ends with its file on disk, or its worker died and the next
        # pass trains it here
        with claim_of(out, missing[0], wait=True):
            pass
