"""The many-trainings engine on toy jobs (no training): static shares, the evaluation's claim
without locks, the write-time guard against two workers training one run, and the status."""

import errno
import json
import os
import sys
from pathlib import Path

import pytest

from dpaudit.experiment.trainings.engine import (
    Evaluation,
    ManyTrainings,
    SharingError,
    WorkerDone,
    directory_status,
    progress_line,
    run_all,
    run_path,
)
from dpaudit.report import write_new
from dpaudit.report.lock import FileLock, LocksUnavailableError, check_exclusive

BROKEN_LOCKS = str(Path(__file__).parents[1] / "support" / "broken_locks")


def toy_job(out: Path, runs: int, worker: int = 0, workers: int = 1, coordination="static",
            log: list | None = None, **kw) -> ManyTrainings:
    """A job whose run r is the file {"run": r, "value": r * r}, written by ``write_new``."""
    log = [] if log is None else log

    def train(r):
        log.append((worker, r))
        write_new(run_path(out, r), {"run": r, "value": r * r, "worker": worker})

    def tidy(only):
        good = set()
        for f in Path(out, "runs").glob("run_*.json"):
            try:
                d = json.loads(f.read_text())
                ok = f.name == run_path(out, d["run"]).name and d["value"] == d["run"] ** 2
            except (ValueError, KeyError, TypeError):
                ok = False
            if ok:
                good.add(d["run"])
            elif only is None or int(f.stem.removeprefix("run_")) in only:
                f.rename(f.with_suffix(".bad"))
        return good

    return ManyTrainings(out=out, runs=runs, setup=lambda: None, train=train, tidy=tidy,
                         worker=worker, workers=workers, coordination=coordination,
                         setting="audit.coordination", progress=False, **kw)


def test_static_workers_train_their_shares_and_the_last_evaluates(tmp_path):
    log = []
    first = run_all(toy_job(tmp_path, 10, 0, 3, log=log))
    second = run_all(toy_job(tmp_path, 10, 2, 3, log=log))
    assert first == WorkerDone(trained=4, waiting=6) and second == WorkerDone(3, waiting=3)
    assert not (tmp_path / "runs" / ".evaluated").exists()
    last = run_all(toy_job(tmp_path, 10, 1, 3, log=log))
    assert last == Evaluation(3)  # the last one evaluates, holding the evaluation's claim
    assert (tmp_path / "runs" / ".evaluating").exists()
    last.release()  # (the caller's ``with``, once its report is written)
    assert not (tmp_path / "runs" / ".evaluating").exists()
    assert sorted(r for _, r in log) == list(range(10))  # each run trained once
    assert all(r % 3 == w for w, r in log)  # by the worker whose share it is
    marker = json.loads((tmp_path / "runs" / ".evaluated").read_text())
    assert marker["worker"] == 1 and marker["coordination"] == "static"


def finish(job: ManyTrainings):
    """run_all as a caller uses it: evaluate (nothing here) inside the claim."""
    done = run_all(job)
    if isinstance(done, Evaluation):
        with done:
            pass
    return done


def test_static_rerun_evaluates_again_but_a_peer_of_the_same_launch_does_not(tmp_path):
    for w in (0, 1):
        finish(toy_job(tmp_path, 4, w, 2))
    marker = tmp_path / "runs" / ".evaluated"
    old = marker.stat().st_mtime - 60  # evaluated a minute ago (file-system clocks are coarse:
    os.utime(marker, (old, old))       # a rerun within one tick counts as a peer, never twice)
    with run_all(toy_job(tmp_path, 4, 0, 2)) as evaluation:  # a rerun on a finished directory
        assert evaluation == Evaluation(0)
        assert (tmp_path / "runs" / ".evaluating").exists()  # held while it evaluates:
        peer = run_all(toy_job(tmp_path, 4, 1, 2))  # a peer that starts now leaves it
        assert isinstance(peer, WorkerDone) and peer.trained == 0
    assert not (tmp_path / "runs" / ".evaluating").exists()
    # a peer that started before the evaluation was claimed: it leaves it to the other
    job = toy_job(tmp_path, 4, 1, 2)
    from dpaudit.experiment.trainings import engine

    assert engine._claim_evaluation(job, marker.stat().st_mtime - 1.0, 0) is None
    release = engine._claim_evaluation(job, marker.stat().st_mtime + 1.0, 0)
    assert release is not None
    release()


def test_a_claim_left_by_a_dead_process_is_taken_over_and_a_live_ones_is_respected(tmp_path):
    for w in (0, 1):
        finish(toy_job(tmp_path, 4, w, 2))
    marker = tmp_path / "runs" / ".evaluated"
    os.utime(marker, (marker.stat().st_mtime - 60,) * 2)  # evaluated a minute ago
    claim = tmp_path / "runs" / ".evaluating"
    import socket
    import subprocess

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    claim.write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname()}))
    done = run_all(toy_job(tmp_path, 4, 0, 2))  # a live holder evaluates: named
    assert done.trained == 0 and f"names pid {os.getpid()}" in done.note
    assert claim.exists()
    claim.write_text(json.dumps({"pid": int(dead.stdout), "host": socket.gethostname()}))
    with run_all(toy_job(tmp_path, 4, 0, 2)) as evaluation:  # the holder has ended
        assert evaluation == Evaluation(0)
    assert not claim.exists()


def test_static_worker_sets_aside_only_its_own_shares_bad_files(tmp_path):
    (tmp_path / "runs").mkdir()
    for r, value in ((0, 99), (1, 99)):  # both damaged: run 0 is worker 0's, run 1 worker 1's
        run_path(tmp_path, r).write_text(json.dumps({"run": r, "value": value}))
    log = []
    assert run_all(toy_job(tmp_path, 2, 0, 2, log=log)) == WorkerDone(1, waiting=1)
    assert log == [(0, 0)] and (tmp_path / "runs" / "run_00001.bad").exists() is False
    assert json.loads(run_path(tmp_path, 1).read_text())["value"] == 99  # not its to move


@pytest.mark.parametrize("coordination", ["static", "locks"])
def test_two_workers_training_one_run_are_stopped_at_the_write(tmp_path, coordination):
    """The guard behind the locks: a run file that appears while this worker trains the run
    (another worker trained it too) is kept, and the worker stops naming the setting."""
    job = toy_job(tmp_path, 2, 0, 1, coordination)
    real = job.train

    def train_after_another_worker(r):
        write_new(run_path(tmp_path, r), {"run": r, "value": r * r, "worker": "other"})
        real(r)

    job.train = train_after_another_worker
    with pytest.raises(SharingError, match=r"run 0 of .* written by another worker") as err:
        run_all(job)
    assert "audit.coordination" in str(err.value)
    assert json.loads(run_path(tmp_path, 0).read_text())["worker"] == "other"
    assert not list((tmp_path / "runs").glob(".run_*.tmp"))


def test_write_new_never_overwrites(tmp_path):
    path = tmp_path / "a.json"
    write_new(path, {"x": 1})
    with pytest.raises(FileExistsError):
        write_new(path, {"x": 2})
    assert json.loads(path.read_text()) == {"x": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"]  # no temporary file left


def test_a_failing_flock_is_no_lock_not_a_busy_directory(tmp_path, monkeypatch):
    import fcntl

    def enolck(fd, op):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(fcntl, "flock", enolck)
    with pytest.raises(LocksUnavailableError, match="No locks available"):
        FileLock(tmp_path / "x.lock", "test").try_take()


def test_probe_passes_on_a_local_directory(tmp_path):
    check_exclusive(tmp_path)
    assert list(tmp_path.iterdir()) == []  # the probe file is removed


@pytest.mark.parametrize("mode,said", [("always", "do not exclude"),
                                       ("enolck", "No locks available")])
def test_probe_sees_locks_that_fail_or_do_not_exclude(tmp_path, monkeypatch, mode, said):
    import fcntl

    monkeypatch.setenv("PYTHONPATH", BROKEN_LOCKS)
    monkeypatch.setenv("DPAUDIT_TEST_FLOCK", mode)
    # this process too: the same file system
    if mode == "always":
        monkeypatch.setattr(fcntl, "flock", lambda fd, op: None)
    else:
        def enolck(fd, op):
            raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))
        monkeypatch.setattr(fcntl, "flock", enolck)
    with pytest.raises(LocksUnavailableError, match=said):
        check_exclusive(tmp_path)
    # and the engine refuses before any run, naming the setting
    log = []
    with pytest.raises(SharingError, match=r"audit\.coordination=static") as err:
        run_all(toy_job(tmp_path, 3, 0, 2, "locks", log=log))
    assert log == [] and len(str(err.value).splitlines()) == 1


def test_status_of_a_static_and_a_locked_directory(tmp_path):
    static, locked = tmp_path / "static", tmp_path / "locked"
    run_all(toy_job(static, 6, 0, 2, result="figure3.json"))
    s = directory_status(static)
    assert (s["done"], s["to_go"], s["coordination"], s["result"]) == (3, 3, "static",
                                                                      "figure3.json")
    line = progress_line(s, s["result"])
    assert line.startswith(f"{static}: 3 of 6 runs done; 3 in training or waiting (static")
    run_all(toy_job(locked, 4, coordination="locks", result="figure3.json"))
    (locked / "figure3.json").write_text("{}")
    s = directory_status(locked)
    assert (s["done"], s["to_go"], s["training"], s["evaluated"]) == (4, 0, {}, True)
    assert progress_line(s, s["result"]).endswith("figure3.json written")
    with pytest.raises(ValueError, match="not a directory of many trainings"):
        directory_status(tmp_path)


def test_a_worker_starting_while_another_evaluates_leaves_it_with_locks(tmp_path):
    """The bug this claim fixes: a worker that started after the evaluator decided (its start
    is younger than the marker, so it looked like a rerun) wrote the same report at the same
    time. Now the evaluation's lock is held until the report is written."""
    with run_all(toy_job(tmp_path, 3, coordination="locks")) as evaluation:
        assert evaluation == Evaluation(3)
        assert run_all(toy_job(tmp_path, 3, coordination="locks")) == WorkerDone(0)
    marker = tmp_path / "runs" / ".evaluated"
    os.utime(marker, (marker.stat().st_mtime - 60,) * 2)  # evaluated a minute ago
    assert finish(toy_job(tmp_path, 3, coordination="locks")) == Evaluation(0)  # a rerun
