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


def test_ray_cluster_shards_one_audit_and_heals_a_killed_worker(tmp_path):
    sweep, alone = tmp_path / "sweep", tmp_path / "alone"
    env = cluster_env()
    with local_ray_cluster(nodes=2, cpus=1) as address:
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
