"""A real Ray cluster on this machine for the tests and the benchmark: a head node and worker
nodes, each its own raylet started by ``ray start --block`` (as on a cluster, one per machine),
with ``cpus`` CPU slots each. Stopping ends exactly these nodes (their ``--block`` processes
take their node's processes down), never another Ray of the user's."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path


def ray_available() -> str | None:
    """None if Ray and Hydra's Ray launcher are installed, else why not."""
    try:
        import hydra_plugins.hydra_ray_launcher  # noqa: F401
        import ray  # noqa: F401
    except ImportError as err:
        return f"the ray extra is not installed ({err.name}): pip install -e '.[ray]'"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cluster_env() -> dict[str, str]:
    """The environment for the nodes and for the drivers joining them (no usage report, no
    token: a cluster reachable only on this machine)."""
    return {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled",
            "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def _nodes_up(address: str, env: dict) -> int:
    code = ("import ray, sys; ray.init(address=sys.argv[1], logging_level='ERROR'); "
            "print(sum(n['Alive'] for n in ray.nodes()))")
    p = subprocess.run([sys.executable, "-c", code, address], capture_output=True, text=True,
                       env=env, timeout=120)
    return int(p.stdout.strip().splitlines()[-1]) if p.returncode == 0 and p.stdout.strip() else 0


@contextlib.contextmanager
def local_ray_cluster(nodes: int = 2, cpus: int = 1, timeout: float = 180.0) -> Iterator[str]:
    """Start ``nodes`` Ray nodes (the first the head) with ``cpus`` CPUs each; yields the
    head's address ``127.0.0.1:<port>`` once every node has joined; stops them on exit."""
    ray = shutil.which("ray", path=str(Path(sys.executable).parent)) or "ray"
    env = cluster_env()
    port = _free_port()
    address = f"127.0.0.1:{port}"
    temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's socket paths are limited
    procs: list[subprocess.Popen] = []
    try:
        common = ["--block", f"--num-cpus={cpus}", "--disable-usage-stats"]
        procs.append(subprocess.Popen(
            [ray, "start", "--head", f"--port={port}", "--include-dashboard=false",
             f"--temp-dir={temp}", *common],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        for _ in range(nodes - 1):
            procs.append(subprocess.Popen(
                [ray, "start", f"--address={address}", *common],
                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        deadline = time.monotonic() + timeout
        while _nodes_up(address, env) < nodes:  # each check is a driver connecting: an event
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                raise RuntimeError(f"the local Ray cluster did not come up ({nodes} nodes)")
        yield address
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in reversed(procs):
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(temp, ignore_errors=True)
