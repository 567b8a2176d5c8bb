"""Runs per minute of one multi-run audit on 1 worker against N workers sharing its directory.

Both are the CLI as a user starts it, in fresh processes, with 1 torch thread per process:

* sequential: ``python -m dpaudit CONFIG audit.runs=R hydra.run.dir=A``;
* sharded: ``python -m dpaudit -m CONFIG audit.runs=R audit.workers=N 'audit.worker=range(N)'
  hydra/launcher=cpu_parallel hydra.launcher.n_jobs=N hydra.sweep.dir=B
  hydra.sweep.subdir=shared`` (hydra-joblib-launcher: N processes on this machine), or with
  ``--launcher ray``: ``hydra/launcher=ray_cluster hydra.launcher.ray.init.address=HEAD`` on
  a Ray cluster of N nodes with one CPU slot each, started on this machine before the clock
  starts (``tests/support/ray_cluster.py``; on a real cluster it is up before the audit too).

CONFIG is the README's cheap multi-run configuration (``audit=multi_run canary=input
canary.count=1``: one input canary per run, the default MLP and DP settings). It prints the
wall time and runs per minute of each, their ratio (and the same between the first and the
last run file, without start-up and evaluation), whether the two audits are identical (every
run file's scores and membership bit, and every bound in results.json), and the per-run
overhead: the median time between consecutive run files of the sequential audit minus the
median training time those files record (the set-up is paid once per worker, not per run).
The machine's cores and load are printed beside.

    python benchmarks/multirun_workers.py                 # R = 200, N = 2
    python benchmarks/multirun_workers.py --runs 40       # quicker
    python benchmarks/multirun_workers.py --launcher ray  # over a local Ray cluster
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))

CONFIG = ["audit=multi_run", "canary=input", "canary.count=1", "progress=false"]


def _run(args: list[str]) -> float:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", RAY_AUTH_MODE="disabled",
               RAY_USAGE_STATS_ENABLED="0")
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "dpaudit", *args], capture_output=True,
                          text=True, env=env)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"dpaudit {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return wall


def _runs(directory: Path) -> dict[int, dict]:
    out = {}
    for f in sorted((directory / "runs").glob("run_*.json")):
        d = json.loads(f.read_text())
        out[d["run"]] = {"scores": d["scores"], "membership": d["membership"],
                         "train": d.get("train_seconds"), "mtime": f.stat().st_mtime,
                         "worker": d.get("worker", {}).get("index")}
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--launcher", choices=["joblib", "ray"], default="joblib")
    ap.add_argument("--dir", default=None, help="where to keep both audits (default: a temp dir)")
    a = ap.parse_args(argv)
    root = Path(a.dir or tempfile.mkdtemp(prefix="dpaudit_workers_"))
    seq_dir, shard_root = root / "sequential", root / "sharded"
    load = os.getloadavg()[0]
    wall_seq = _run([*CONFIG, f"audit.runs={a.runs}", f"hydra.run.dir={seq_dir}"])
    with contextlib.ExitStack() as stack:
        if a.launcher == "ray":
            from ray_cluster import local_ray_cluster

            address = stack.enter_context(local_ray_cluster(nodes=a.workers, cpus=1))
            launcher = ["hydra/launcher=ray_cluster", f"hydra.launcher.ray.init.address={address}"]
        else:
            launcher = ["hydra/launcher=cpu_parallel", f"hydra.launcher.n_jobs={a.workers}"]
        wall_shard = _run(["-m", *CONFIG, f"audit.runs={a.runs}", f"audit.workers={a.workers}",
                           f"audit.worker=range({a.workers})", *launcher,
                           f"hydra.sweep.dir={shard_root}", "hydra.sweep.subdir=shared"])
    shard_dir = shard_root / "shared"
    seq, shard = _runs(seq_dir), _runs(shard_dir)
    same_runs = sorted(seq) == sorted(shard) == list(range(a.runs)) and all(
        seq[r]["scores"] == shard[r]["scores"] and seq[r]["membership"] == shard[r]["membership"]
        for r in seq
    )
    res_seq = json.loads((seq_dir / "results.json").read_text())
    res_shard = json.loads((shard_dir / "results.json").read_text())
    same_bounds = res_seq["bounds"] == res_shard["bounds"]
    times = [seq[r]["mtime"] for r in sorted(seq)]
    cycle = statistics.median(b - a_ for a_, b in itertools.pairwise(times))
    train = statistics.median(seq[r]["train"] for r in seq if seq[r]["train"] is not None)
    per_worker = {w: sum(1 for r in shard.values() if r["worker"] == w) for w in range(a.workers)}
    rate_seq, rate_shard = 60 * a.runs / wall_seq, 60 * a.runs / wall_shard

    def steady(runs: dict) -> float:  # runs per minute from the first run file to the last
        t = sorted(r["mtime"] for r in runs.values())
        return 60 * (len(t) - 1) / (t[-1] - t[0])

    steady_seq, steady_shard = steady(seq), steady(shard)
    print(f"{os.cpu_count()} cores, load {load:.2f} at start, 1 torch thread per process; "
          f"config: {' '.join(CONFIG)}, audit.runs={a.runs}; launcher {a.launcher}; "
          f"directories under {root}")
    print(f"sequential : {wall_seq:7.1f} s wall, {rate_seq:6.1f} runs/min")
    print(f"{a.workers} workers  : {wall_shard:7.1f} s wall, {rate_shard:6.1f} runs/min "
          f"(runs per worker: {per_worker})")
    print(f"ratio      : {rate_shard / rate_seq:.2f}x the runs per minute of one worker "
          "(wall: start-up, set-up and evaluation included)")
    print(f"steady     : {steady_seq:.1f} vs {steady_shard:.1f} runs/min between the first and "
          f"the last run file: {steady_shard / steady_seq:.2f}x")
    print(f"identical  : run files {same_runs}, bounds {same_bounds}")
    print(f"per run    : {cycle:.3f} s between run files, {train:.3f} s training (median): "
          f"overhead {cycle - train:.3f} s = {(cycle - train) / cycle:.1%} of a run")


if __name__ == "__main__":
    main()
