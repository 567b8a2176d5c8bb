"""Many trainings: a directory of R runs, each a file, made by any number of workers.

A run is (the job's settings, run index r) -> one self-checking file under ``runs/``. The
engine plans the runs, skips those on disk, trains the rest and says when all are done; the
job supplies what a run is (``ManyTrainings``): multi-run audits (``multirun``) and Figure 3
(``tasks.figure3``) both go through it, so both resume and shard the same way.

Sharing: any number of processes (a Hydra sweep's jobs on joblib, Slurm or Ray, the same
command started twice, Slurm array tasks on a shared file system) may work on one directory,
in one of two coordinations (``COORDINATIONS``):

* ``locks`` (the default): a worker claims a run while it trains it (``flock`` on
  ``runs/.claims/run_<r>.lock``, naming its pid and host; the kernel drops a claim when its
  holder dies). The directory's own lock (``.dpaudit.lock``) is held only for moments: to check
  or save the settings, set aside what a dead worker left, and decide which worker evaluates.
  A worker with no free run left waits on the claims of the runs still in training: when one
  ends without its run file (its worker died), it trains that run itself, so a killed worker's
  runs are redone by another and the job completes. Before any of this each worker checks that
  the directory's locks work (``lock.check_exclusive``: a second process must be refused a lock
  this one holds); where they do not (NFS without a lock manager, a ``nolock`` mount) it stops
  before training with one line naming the ``static`` setting.
* ``static``: no locks at all. Worker k of n trains only its share, the runs r with
  r mod n == k, and tidies only its share's files; a rerun of worker k redoes what a killed
  worker k left. The settings and the evaluation's claim are files created only if absent.

In both, run files are created only if absent (``write_new``), so two workers that train one
run (locks that do not exclude across hosts, two static workers given one index) are stopped
at the write, named, never merged. Of the workers that find every run done, one evaluates
(``runs/.evaluated``, compared with a stamp this worker wrote when it started, both dated by
the file system); the others get ``WorkerDone``. A rerun on a finished directory evaluates
again.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
from collections.abc import Callable
from pathlib import Path

from tqdm.auto import tqdm

from dpaudit._validate import require_choice
from dpaudit.names import COORDINATIONS
from dpaudit.report import write_json, write_new
from dpaudit.report.lock import DirectoryLock, FileLock, LocksUnavailableError, check_exclusive

RUNS_DIR = "runs"
CLAIMS_DIR = ".claims"  # under runs/: one lock file per run being trained
EVALUATED_FILE = ".evaluated"  # under runs/: who took the evaluation, and when
EVALUATING_FILE = ".evaluating"  # under runs/ (static): the evaluation's claim
EVALUATION_LOCK = "evaluation.lock"  # under runs/.claims/ (locks): the evaluation's claim
SHARING_FILE = ".sharing.json"  # under runs/: the latest workers' coordination (for --status)


class SharingError(RuntimeError):
    """The workers of one directory cannot share it safely as configured (the message names
    the setting to use)."""


@dataclasses.dataclass
class Evaluation:
    """This worker evaluates: it trained ``trained`` runs, and holds the evaluation's claim
    until ``release`` (a context manager: evaluate and write the report inside ``with``), so a
    worker that starts meanwhile never writes the same report at the same time."""

    trained: int
    _release: Callable[[], None] | None = dataclasses.field(default=None, repr=False,
                                                            compare=False)

    def release(self) -> None:
        """Give the evaluation's claim back (idempotent)."""
        if self._release is not None:
            self._release()
            self._release = None

    def __enter__(self) -> Evaluation:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


@dataclasses.dataclass(frozen=True)
class WorkerDone:
    """A worker that leaves the evaluation to another: it trained ``trained`` runs, and
    ``waiting`` runs of other workers' shares are not on disk yet (static coordination; 0:
    every run is done and another worker evaluates)."""

    trained: int
    waiting: int = 0
    note: str = ""  # static: who holds the evaluation's claim, if that is unclear


@dataclasses.dataclass
class ManyTrainings:
    """What the engine needs of a job.

    Attributes:
        out: the job's directory (``runs/`` below it).
        runs: how many runs, 0..runs-1.
        worker, workers: this worker's index among the workers sharing ``out``; with
            ``locks`` it only says where the worker starts (workers started together start
            apart), with ``static`` it fixes the worker's share.
        setup: called before any run (under the directory's lock with ``locks``): check or
            save the settings (raise ValueError to refuse the directory); with ``static`` it
            must create files only if absent (``write_new``).
        train: trains run r and writes its file ``run_path(out, r)`` with ``write_new``.
        tidy: ``tidy(only)`` sets aside the invalid run files of the runs in ``only`` (None:
            all; called under the directory's lock with ``locks``) and returns the numbers of
            all valid runs.
        coordination: one of ``COORDINATIONS`` (module doc); ``setting`` names it for the user
            (e.g. ``audit.coordination``) in errors.
        result: the file the evaluation writes in ``out`` (for ``directory_status``).
        progress: show a bar over the runs; ``desc`` its label.
    """

    out: Path
    runs: int
    setup: Callable[[], None]
    train: Callable[[int], object]
    tidy: Callable[[set[int] | None], set[int]]
    worker: int = 0
    workers: int = 1
    coordination: str = "locks"
    setting: str = "coordination"
    result: str = "results.json"
    progress: bool = True
    desc: str = "runs"

    @property
    def start(self) -> int:
        """The first run this worker tries (``visit_order``)."""
        return visit_order(self.runs, self.worker, self.workers)

    def share(self) -> list[int]:
        """The runs this worker trains with ``static``: r mod workers == worker."""
        return list(range(self.worker, self.runs, self.workers))


def run_path(out: str | Path, r: int) -> Path:
    """Where run r's file lives: ``out/runs/run_<r:05d>.json``."""
    return Path(out) / RUNS_DIR / f"run_{r:05d}.json"


def run_number(path: str | Path) -> int | None:
    """The run a run file's name says (``run_<r>.json`` -> r), or None."""
    stem = Path(path).stem.removeprefix("run_")
    return int(stem) if stem.isdigit() else None


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


def _remove_partial_files(out: Path, only: set[int] | None = None) -> None:
    """Delete what a worker killed mid-write left: the temporary files of runs no live worker
    claims (never a run file: only complete files are linked into place). ``only``: the runs
    of this worker's static share, whose files no other worker writes (no claims asked)."""
    for tmp in Path(out, RUNS_DIR).glob(".run_*.json.*.tmp"):
        number = tmp.name.removeprefix(".run_").split(".", 1)[0]
        if not number.isdigit():
            continue
        if (int(number) in only) if only is not None else not claimed(out, int(number)):
            tmp.unlink(missing_ok=True)


def _train(job: ManyTrainings, r: int) -> None:
    """Train run r; a run file that appears meanwhile (``write_new`` refuses to overwrite it)
    means two workers trained one run: stop, naming the setting."""
    try:
        job.train(r)
    except FileExistsError:
        if job.coordination == "locks":
            why = (f"this worker held run {r}'s claim, so the file system's locks do not "
                   "exclude across workers (an NFS mount with nolock, or locks local to each "
                   f"host): start every worker with {job.setting}=static")
        else:
            why = (f"two workers trained it: each worker of {job.setting}=static needs its "
                   "own index (worker=0, ..., workers-1), and all the same workers")
        raise SharingError(
            f"run {r} of {job.out} was written by another worker meanwhile (its file was "
            f"kept, this worker's copy dropped): {why}") from None


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
                _train(job, r)
                trained += 1
        bar.n = sum(run_path(job.out, k).exists() for k in range(job.runs))
        bar.refresh()
    return trained


def run_all(job: ManyTrainings) -> Evaluation | WorkerDone:
    """Make every run of ``job`` that is neither on disk nor in training elsewhere (module
    doc). Returns an ``Evaluation`` (with the evaluation's claim: evaluate inside ``with``)
    when this worker is the one to evaluate, or ``WorkerDone`` when another worker evaluates
    (or, with ``static``, when other shares are still missing)."""
    require_choice(job.setting, job.coordination, COORDINATIONS)
    Path(job.out, RUNS_DIR).mkdir(parents=True, exist_ok=True)
    started = _file_system_now(job.out)
    sharing = {"coordination": job.coordination, "workers": job.workers, "runs": job.runs,
               "result": job.result}
    if job.coordination == "static":
        write_json(Path(job.out, RUNS_DIR, SHARING_FILE), sharing)
        return _run_static(job, started)
    try:
        check_exclusive(Path(job.out, RUNS_DIR))
        write_json(Path(job.out, RUNS_DIR, SHARING_FILE), sharing)
        return _run_with_locks(job, started)
    except LocksUnavailableError as err:
        raise SharingError(
            f"{err}: workers cannot claim runs there; start every worker with "
            f"{job.setting}=static (worker k of n then trains runs r with r mod n == k, no "
            "locks needed)") from None


def _run_with_locks(job: ManyTrainings, started: float) -> Evaluation | WorkerDone:
    out = Path(job.out)
    with DirectoryLock(out, "audit", wait=True):
        job.setup()
        _remove_partial_files(out)
        good = job.tidy(None)
    bar = tqdm(total=job.runs, initial=len(good), desc=job.desc, disable=not job.progress)
    trained = 0
    while True:
        trained += _train_free_runs(job, bar)
        with DirectoryLock(out, "audit", wait=True):
            _remove_partial_files(out)
            good = job.tidy(None)
            missing = [r for r in range(job.runs) if r not in good]
            if not missing:
                bar.close()
                claim = FileLock(Path(out, RUNS_DIR, CLAIMS_DIR, EVALUATION_LOCK),
                                 "evaluation").try_take()
                if claim is None:
                    return WorkerDone(trained)  # another worker is evaluating these runs now
                marker = Path(out, RUNS_DIR, EVALUATED_FILE)
                if marker.exists() and marker.stat().st_mtime >= started:
                    claim.release()
                    return WorkerDone(trained)  # another worker found them done first
                write_json(marker, _holder(job, trained))
                return Evaluation(trained, claim.release)
        # the missing runs are in training elsewhere (or were a moment ago): wait for the
        # first one's claim; it ends with its file on disk, or its worker died and the next
        # pass trains it here
        with claim_of(out, missing[0], wait=True):
            pass


def _run_static(job: ManyTrainings, started: float) -> Evaluation | WorkerDone:
    """``static`` coordination (module doc): train this worker's share, no locks."""
    out = Path(job.out)
    share = job.share()
    job.setup()
    _remove_partial_files(out, set(share))
    good = job.tidy(set(share))
    todo = [r for r in share if r not in good]
    bar = tqdm(total=len(share), initial=len(share) - len(todo),
               desc=f"{job.desc} (share {job.worker} of {job.workers})",
               disable=not job.progress)
    for r in todo:
        _train(job, r)
        bar.update(1)
    bar.close()
    good = job.tidy(set())  # every valid run, this worker's and the others'
    waiting = sum(r not in good for r in range(job.runs))
    if waiting:
        return WorkerDone(len(todo), waiting)
    release = _claim_evaluation(job, started, len(todo))
    if release is not None:
        return Evaluation(len(todo), release)
    claim = Path(out, RUNS_DIR, EVALUATING_FILE)
    note = ""
    if claim.exists():
        h = _read_holder(claim)
        who = f"pid {h['pid']} on {h['host']}" if "pid" in h and "host" in h else "another worker"
        note = (f"{claim} names {who} as evaluating; if it is no longer running, delete that "
                "file and rerun any worker")
    return WorkerDone(len(todo), note=note)


def _claim_evaluation(job: ManyTrainings, started: float, trained: int
                      ) -> Callable[[], None] | None:
    """Without locks: the claim's release for the one worker that evaluates, None for the
    others. The claim is a file created only if absent and removed when the report is written;
    the worker evaluates unless a peer's ``.evaluated`` is younger than this worker's start. A
    claim left by a dead process of this host is removed (one of another host is named)."""
    runs_dir = Path(job.out, RUNS_DIR)
    claim, marker = runs_dir / EVALUATING_FILE, runs_dir / EVALUATED_FILE
    for _ in range(2):
        try:
            write_new(claim, _holder(job, trained))
            break
        except FileExistsError:
            if not _left_by_dead_process(claim):
                return None  # a live peer evaluates now (or one on another host died there)
            claim.unlink(missing_ok=True)
    else:
        return None
    if marker.exists() and marker.stat().st_mtime >= started:
        claim.unlink(missing_ok=True)
        return None  # a peer found them done after this worker started
    write_json(marker, _holder(job, trained))
    return lambda: claim.unlink(missing_ok=True)


def _left_by_dead_process(path: Path) -> bool:
    """True if ``path`` names a holder on this host whose process has ended."""
    holder = _read_holder(path)
    if holder.get("host") != socket.gethostname():
        return False
    try:
        os.kill(int(holder["pid"]), 0)
    except ProcessLookupError:
        return True
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return False


def _read_holder(path: Path) -> dict:
    """The holder a claim or lock file names (pid, host, ...); {} if unreadable or empty."""
    try:
        holder = json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        return {}
    return holder if isinstance(holder, dict) else {}


def _holder(job: ManyTrainings, trained: int) -> dict:
    return {"pid": os.getpid(), "host": socket.gethostname(), "worker": job.worker,
            "coordination": job.coordination, "runs": job.runs, "trained_here": trained}


def _file_system_now(out: Path) -> float:
    """The file system's clock now (the mtime of a file created and removed at once): compared
    with other files' mtimes, immune to clock skew between hosts sharing the directory."""
    stamp = Path(out, RUNS_DIR, f".started.{socket.gethostname()}.{os.getpid()}")
    stamp.touch()
    try:
        return stamp.stat().st_mtime
    finally:
        stamp.unlink(missing_ok=True)


def progress(out: str | Path, runs: int, recent: int = 20) -> dict:
    """Progress of the ``runs`` runs in ``out``, from any shell while its workers run: runs on
    disk, runs in training (with their workers' pid and host, from the claims), runs to go,
    the rate over the last ``recent`` run files (runs per minute, all workers together) and
    the time left at that rate. Reads the files; takes each free claim for a moment only to
    see that it is free. With ``static`` coordination there are no claims: the runs not on
    disk are "to go", and ``coordination`` says so."""
    out = Path(out)
    stamps = sorted(run_path(out, r).stat().st_mtime for r in range(runs)
                    if run_path(out, r).exists())
    try:
        sharing = json.loads(Path(out, RUNS_DIR, SHARING_FILE).read_text())
    except (OSError, ValueError):
        sharing = {}
    coordination = sharing.get("coordination", "locks") if isinstance(sharing, dict) else "locks"
    training = {}
    for r in range(runs if coordination == "locks" else 0):
        if not run_path(out, r).exists() and claimed(out, r):
            holder = _read_holder(claim_of(out, r).path)
            training[r] = {"pid": holder.get("pid"), "host": holder.get("host")}
    last = stamps[-recent:]
    rate = 60 * (len(last) - 1) / (last[-1] - last[0]) if len(last) > 1 and last[-1] > last[0] \
        else None
    left = runs - len(stamps)
    return {"directory": str(out), "runs": runs, "done": len(stamps), "training": training,
            "to_go": left, "runs_per_minute": rate, "coordination": coordination,
            "seconds_left": None if rate is None or left == 0 else 60 * left / rate}


def progress_line(status: dict, result_file: str) -> str:
    """``progress`` in one line; ``result_file`` (with ``status["evaluated"]``) is what the
    evaluation writes."""
    s = status
    busy = ", ".join(f"run {r} (pid {h['pid']} on {h['host']})" for r, h in s["training"].items())
    if s.get("coordination") == "static":
        parts = [f"{s['directory']}: {s['done']} of {s['runs']} runs done",
                 f"{s['to_go']} in training or waiting (static coordination: no claims to read)"]
    else:
        parts = [f"{s['directory']}: {s['done']} of {s['runs']} runs done",
                 f"{len(s['training'])} in training" + (f": {busy}" if busy else ""),
                 f"{s['to_go'] - len(s['training'])} waiting"]
    if s["runs_per_minute"]:
        parts.append(f"{s['runs_per_minute']:.1f} runs/min over the last run files")
    if s["seconds_left"]:
        parts.append(f"about {s['seconds_left']:.0f} s left")
    if s["to_go"] == 0:
        parts.append(f"{result_file} written" if s.get("evaluated") else "evaluation pending")
    return "; ".join(parts)


def directory_status(out: str | Path, recent: int = 20) -> dict:
    """``progress`` of any engine directory (a multi-run audit's, Figure 3's), read from the
    ``runs/.sharing.json`` its workers write; ``evaluated``: the job's result file is there
    and no run is missing. A ValueError if ``out`` holds no such file."""
    out = Path(out)
    try:
        sharing = json.loads(Path(out, RUNS_DIR, SHARING_FILE).read_text())
        runs, result = int(sharing["runs"]), str(sharing["result"])
    except FileNotFoundError:
        raise ValueError(f"{out} has no {RUNS_DIR}/{SHARING_FILE}: not a directory of many "
                         "trainings (or made by a dpaudit that did not write it)") from None
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{out / RUNS_DIR / SHARING_FILE}: not readable ({err})") from err
    status = progress(out, runs, recent)
    status["evaluated"] = Path(out, result).exists() and status["to_go"] == 0
    status["result"] = result
    return status
