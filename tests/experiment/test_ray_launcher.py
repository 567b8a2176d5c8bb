"""Hydra's Ray launcher on a real Ray cluster started on this machine (a head node and a worker
node, one CPU slot each): one multi-run audit sharded over the cluster's workers, a worker
killed mid-run, the audit healed and equal, run file for run file, to a single process's."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ray_cluster import cluster_env, local_ray_cluster, ray_available

pytestmark = [pytest.mark.slow, pytest.mark.skipif(ray_available() is not None,
                                                   reason=ray_available() or "")]

ARGS = ["model=logreg", "dp.noise_multiplier=2.0", "dp.steps=8", "canary.count=2",
        "attack=scalar", "audit=multi_run", "audit.runs=16",
        "audit.methods=[gaussian,clopper_pearson]", "progress=false"]


def _held_claim(runs: Path) -> tuple[int, int] | None:
    """(run, pid) of a claim a live worker holds on a run not yet on disk, if any."""
    for lock in sorted(runs.glob(".claims/run_*.lock")):
        r = int(lock.stem.removeprefix("run_"))
        try:
            holder = json.loads(lock.read_text() or "{}")
        except (OSError, ValueError):
            continue  # being written
        if holder.get("pid") and not (runs / f"run_{r:05d}.json").exists():
            return r, int(holder["pid"])
    return None


@pytest.fixture(scope="module")
def cluster():
    with local_ray_cluster(nodes=2, cpus=1) as address:
        yield address


@pytest.mark.xdist_group("ray_cluster")
def test_ray_cluster_shards_one_audit_and_heals_a_killed_worker(tmp_path, cluster):
    sweep, alone = tmp_path / "sweep", tmp_path / "alone"
    env = cluster_env()
    address = cluster
    cmd = [sys.executable, "-m", "dpaudit", "-m", "hydra/launcher=ray_cluster",
           f"hydra.launcher.ray.init.address={address}", f"hydra.sweep.dir={sweep}",
           "hydra.sweep.subdir=shared", "audit.workers=2", "audit.worker=range(2)", *ARGS]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    runs = sweep / "shared" / "runs"
    victim = None
    deadline = time.monotonic() + 300
    while victim is None:  # the event: two runs on disk and a third claimed by a worker
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        assert time.monotonic() < deadline, "no worker claimed a run in 300 s"
        if len(list(runs.glob("run_*.json"))) >= 2:
            victim = _held_claim(runs)
        time.sleep(0.02)
    run, pid = victim
    os.kill(pid, signal.SIGKILL)  # the Ray worker process running one Hydra job
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-3000:]  # Ray reran the job; it resumed from disk
    # a rerun of the same command on the finished directory trains nothing, evaluates again
    stamps = {f.name: f.stat().st_mtime_ns for f in runs.glob("run_*.json")}
    again = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert {f.name: f.stat().st_mtime_ns for f in runs.glob("run_*.json")} == stamps
    files = sorted(runs.glob("run_*.json"))
    assert [f.name for f in files] == [f"run_{r:05d}.json" for r in range(16)]
    assert json.loads((runs / f"run_{run:05d}.json").read_text())["worker"]["pid"] != pid
    single = subprocess.run([sys.executable, "-m", "dpaudit", f"hydra.run.dir={alone}", *ARGS],
                            env=env, capture_output=True, text=True, timeout=600)
    assert single.returncode == 0, single.stderr[-3000:]
    for f in files:  # the same run files as one process's, whoever trained them
        mine, theirs = json.loads(f.read_text()), json.loads((alone / "runs" / f.name).read_text())
        assert (mine["scores"], mine["membership"]) == (theirs["scores"], theirs["membership"])
    a = json.loads((sweep / "shared" / "results.json").read_text())
    b = json.loads((alone / "results.json").read_text())
    assert a["bounds"] == b["bounds"] and a["verdict"]["status"] == b["verdict"]["status"]


@pytest.mark.xdist_group("ray_cluster")
def test_ray_cluster_shards_figure3(tmp_path, cluster):
    """Figure 3 goes through the same engine: sharded over the cluster's two workers it
    equals one process's."""
    args = ["experiment=fig3_digits", "progress=false", "task.runs=6",
            "task.canaries_per_class=2", "task.n_references=50", "task.candidates=200",
            "dp.steps=10", "dp.noise_multiplier=1.0"]
    env = cluster_env()
    cmd = [sys.executable, "-m", "dpaudit", "-m", *args, "task.workers=2", "task.worker=0,1",
           "hydra/launcher=ray_cluster", f"hydra.launcher.ray.init.address={cluster}",
           f"hydra.sweep.dir={tmp_path / 'sweep'}", "hydra.sweep.subdir=shared"]
    sharded = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert sharded.returncode == 0, sharded.stdout[-3000:] + sharded.stderr[-3000:]
    workers = {json.loads(f.read_text())["worker"]["index"]
               for f in (tmp_path / "sweep" / "shared" / "runs").glob("run_*.json")}
    single = subprocess.run([sys.executable, "-m", "dpaudit", *args,
                             f"hydra.run.dir={tmp_path / 'alone'}"],
                            env=env, capture_output=True, text=True, timeout=600)
    assert single.returncode == 0, single.stderr[-3000:]
    a = json.loads((tmp_path / "sweep" / "shared" / "figure3.json").read_text())
    b = json.loads((tmp_path / "alone" / "figure3.json").read_text())
    assert a["results"] == b["results"] and workers <= {0, 1}
