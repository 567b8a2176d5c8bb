"""Time of each of our statistics against jax_privacy's counterpart on the same scores.

Scores: members N(``--mu``, 1), non-members N(0, 1), n of each for every n of ``--sizes``
(seed ``--seed``); every statistic at ``--delta`` and 95% confidence. Each time is the median
of ``--repeats`` calls in one process, from the scores to the number (their
``CanaryScoreAuditor`` constructor, which sorts, is timed with each call); ours run here,
theirs in a separate Python (their venv) on the very same arrays, passed through a temporary
.npz file. It prints, per (n, statistic):
our time, theirs, the ratio ours / theirs (<= 1: no slower), and both values (epsilon), so
that a speed-up cannot hide a looser bound. The machine load and thread settings are printed.

Pairs: clopper_pearson vs ``epsilon_clopper_pearson`` (their default), one_run vs
``epsilon_one_run``, fdp_one_run vs ``epsilon_one_run_fdp``, gdp vs ``epsilon_from_gdp``.
Ours run with the inclusion probability 1/2 (their one-run methods assume it).

Run (once: a separate venv and jax_privacy's ``auditing.py``, which needs numpy, scipy and
dp_accounting only)::

    python3 -m venv /tmp/jaxenv && /tmp/jaxenv/bin/pip install numpy scipy dp-accounting
    python benchmarks/speed_vs_jax_privacy.py --auditing /path/to/jax_privacy/auditing.py \\
        --jax-python /tmp/jaxenv/bin/python
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

from dpaudit.stats import epsilon_lower_bound

CONFIDENCE = 0.95
PAIRS = {  # ours -> theirs (method name on CanaryScoreAuditor)
    "clopper_pearson": "epsilon_clopper_pearson",
    "one_run": "epsilon_one_run",
    "fdp_one_run": "epsilon_one_run_fdp",
    "gdp": "epsilon_from_gdp",
}

_THEIRS = r"""
import importlib.util, json, statistics, sys, time, warnings
import numpy as np
warnings.simplefilter("ignore")
spec = importlib.util.spec_from_file_location("jp_auditing", sys.argv[1])
aud = importlib.util.module_from_spec(spec)
sys.modules["jp_auditing"] = aud
spec.loader.exec_module(aud)
data = np.load(sys.argv[2])
sig, delta, repeats = float(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
names = json.loads(sys.argv[6])
out = {}
for n in sorted({k.split("|")[0] for k in data.files}):
    for name in names:
        times, value = [], None
        for _ in range(repeats):
            t = time.perf_counter()
            a = aud.CanaryScoreAuditor(data[n + "|in"], data[n + "|out"])
            value = float(getattr(a, name)(sig, delta))
            times.append(time.perf_counter() - t)
        out[n + "|" + name] = [statistics.median(times), value]
json.dump(out, open(sys.argv[7], "w"))
"""


def median_time(fn, repeats: int) -> tuple[float, object]:
    """Median wall time of ``repeats`` calls and the last call's result."""
    times, out = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return float(np.median(times)), out


def ours(data: dict, sizes, delta: float, repeats: int) -> dict:
    """``{"n|method": (seconds, epsilon)}`` for our statistics."""
    out = {}
    for n in sizes:
        s_in, s_out = data[f"{n}|in"], data[f"{n}|out"]
        for method in PAIRS:
            opts = {"inclusion": 0.5} if "one_run" in method else {}
            secs, res = median_time(
                lambda method=method, opts=opts, s_in=s_in, s_out=s_out: epsilon_lower_bound(
                    s_in, s_out, delta=delta, confidence=CONFIDENCE, method=method, **opts
                ),
                repeats,
            )
            out[f"{n}|{method}"] = (secs, float(res.epsilon))
    return out


def theirs(data: dict, auditing: Path, python: str, delta: float, repeats: int) -> dict:
    """The same table from jax_privacy, computed in their venv."""
    with tempfile.TemporaryDirectory() as tmp:
        npz, res = Path(tmp) / "scores.npz", Path(tmp) / "theirs.json"
        np.savez(npz, **data)
        names = json.dumps(list(PAIRS.values()))
        cmd = [python, "-c", _THEIRS, str(auditing), str(npz), str(1 - CONFIDENCE), str(delta)]
        subprocess.run([*cmd, str(repeats), names, str(res)], check=True)
        raw = json.loads(res.read_text())
    return {f"{k.split('|')[0]}|{m}": tuple(raw[f"{k.split('|')[0]}|{t}"])
            for k in raw for m, t in PAIRS.items() if k.endswith("|" + t)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--auditing", type=Path, required=True, help="jax_privacy/auditing.py")
    ap.add_argument("--jax-python", required=True, help="a Python with numpy, scipy, dp_accounting")
    ap.add_argument("--sizes", type=float, nargs="+", default=[1e3, 1e4, 1e5])
    ap.add_argument("--mu", type=float, default=1.0)
    ap.add_argument("--delta", type=float, default=1e-5)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, help="write the rows here")
    args = ap.parse_args()
    sizes = [int(n) for n in args.sizes]
    rng = np.random.default_rng(args.seed)
    data = {}
    for n in sizes:
        data[f"{n}|in"] = rng.normal(args.mu, 1.0, n)
        data[f"{n}|out"] = rng.normal(0.0, 1.0, n)
    mine = ours(data, sizes, args.delta, args.repeats)
    other = theirs(data, args.auditing, args.jax_python, args.delta, args.repeats)
    print(f"load {os.getloadavg()[0]:.2f}, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}"
          f", mu {args.mu}, delta {args.delta}, median of {args.repeats}")
    print(f"{'n':>7} {'statistic':>16} {'ours s':>9} {'theirs s':>9} {'ratio':>6}"
          f" {'ours eps':>9} {'theirs eps':>10}")
    rows = []
    for n in sizes:
        for method in PAIRS:
            (t_o, e_o), (t_t, e_t) = mine[f"{n}|{method}"], other[f"{n}|{method}"]
            rows.append({"n": n, "statistic": method, "ours_s": t_o, "theirs_s": t_t,
                         "ratio": t_o / t_t, "ours_eps": e_o, "theirs_eps": e_t})
            print(f"{n:>7} {method:>16} {t_o:9.4f} {t_t:9.4f} {t_o / t_t:6.2f}"
                  f" {e_o:9.3f} {e_t:10.3f}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
