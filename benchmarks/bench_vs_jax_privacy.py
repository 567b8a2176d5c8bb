"""Tightness of our threshold bounds against jax_privacy's auditing module, on identical inputs.

For each setting (mu, delta) it draws 50 pairs of 1000 member scores ~ N(mu, 1) and 1000
non-member scores ~ N(0, 1) (the same pairs for both deltas of a mu), runs at 95% confidence

* ours: ``epsilon_lower_bound(method="clopper_pearson")`` and ``method="gdp"`` with the default
  selection (``DEFAULT_SELECTION``: Bonferroni over fixed one-sided order statistics);
* theirs: ``CanaryScoreAuditor(in, out).epsilon_clopper_pearson(0.05, delta)`` (their default,
  one-sided, and ``one_sided=False``) and ``.epsilon_from_gdp(0.05, delta)``,

and prints the median [min, max] over the pairs of ours - theirs for the CP epsilon and the GDP
epsilon (and mu: theirs is recovered from their epsilon with ``gdp_mu``).

jax_privacy is never imported into this process and is not a dependency of dpaudit: their
``auditing.py`` (it needs numpy, scipy and dp_accounting only) runs in a separate Python, read
from a checkout given on the command line; the pairs go to it through a temporary .npz file.

Run (once: a separate venv and a checkout of google-deepmind/jax_privacy)::

    python3 -m venv /tmp/jaxenv && /tmp/jaxenv/bin/pip install numpy scipy dp-accounting
    python benchmarks/bench_vs_jax_privacy.py --jax-privacy /path/to/jax_privacy \\
        --jax-python /tmp/jaxenv/bin/python

``--jax-privacy`` is the checkout's root (holding ``jax_privacy/auditing.py``) or that file.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np

from dpaudit.stats import epsilon_lower_bound, gdp_mu

CONFIDENCE = 0.95
MUS = (1.0, 2.0, 4.0)
DELTAS = (1e-5, 1e-6)

# Runs in the jax venv: loads auditing.py by path (not the package, whose __init__ needs jax).
_THEIRS = r"""
import importlib.util, json, sys
import numpy as np
spec = importlib.util.spec_from_file_location("jp_auditing", sys.argv[1])
aud = importlib.util.module_from_spec(spec)
sys.modules["jp_auditing"] = aud
spec.loader.exec_module(aud)
data = np.load(sys.argv[2])
sig = float(sys.argv[3])
deltas = json.loads(sys.argv[4])
out = {}
for key in data.files:
    if not key.endswith("_in"):
        continue
    base = key[:-3]
    a = aud.CanaryScoreAuditor(data[base + "_in"], data[base + "_out"])
    out[base] = {
        str(d): [
            float(a.epsilon_clopper_pearson(sig, d)),
            float(a.epsilon_clopper_pearson(sig, d, one_sided=False)),
            float(a.epsilon_from_gdp(sig, d)),
        ]
        for d in deltas
    }
json.dump(out, open(sys.argv[5], "w"))
"""


def make_pairs(n_pairs: int, n: int, seed: int) -> dict[str, np.ndarray]:
    """``{f"mu{mu}_{i}_in": ..., f"mu{mu}_{i}_out": ...}``: the benchmark's inputs."""
    rng = np.random.default_rng(seed)
    pairs = {}
    for mu in MUS:
        for i in range(n_pairs):
            pairs[f"mu{mu:g}_{i}_in"] = rng.normal(mu, 1.0, n)
            pairs[f"mu{mu:g}_{i}_out"] = rng.normal(0.0, 1.0, n)
    return pairs


def theirs(pairs: dict[str, np.ndarray], jax_python: str, auditing: Path) -> dict:
    """Their CP (one-sided, two-sided) and GDP epsilons per pair and delta, in their venv."""
    with tempfile.TemporaryDirectory() as tmp:
        npz, res = Path(tmp) / "pairs.npz", Path(tmp) / "theirs.json"
        np.savez(npz, **pairs)
        cmd = [jax_python, "-c", _THEIRS, str(auditing), str(npz), str(1 - CONFIDENCE)]
        subprocess.run([*cmd, json.dumps(list(DELTAS)), str(res)], check=True)
        return json.loads(res.read_text())


def ours(s_in: np.ndarray, s_out: np.ndarray, delta: float) -> tuple[float, float, float]:
    """Our default CP epsilon, GDP epsilon and GDP mu_lower."""
    kw = {"delta": delta, "confidence": CONFIDENCE}
    cp = epsilon_lower_bound(s_in, s_out, method="clopper_pearson", **kw)
    g = epsilon_lower_bound(s_in, s_out, method="gdp", **kw)
    return cp.epsilon, g.epsilon, float(g.mu_lower)


def _summary(x: np.ndarray) -> str:
    return f"{np.median(x):+7.3f} [{np.min(x):+7.3f}, {np.max(x):+7.3f}]"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jax-privacy", required=True, help="jax_privacy checkout or auditing.py")
    ap.add_argument("--jax-python", required=True, help="python of a venv with dp_accounting")
    ap.add_argument("--pairs", type=int, default=50)
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=2025)
    args = ap.parse_args()
    auditing = Path(args.jax_privacy)
    if auditing.is_dir():
        auditing = auditing / "jax_privacy" / "auditing.py"
    if not auditing.is_file():
        sys.exit(f"no auditing.py at {auditing}")
    pairs = make_pairs(args.pairs, args.n, args.seed)
    their = theirs(pairs, args.jax_python, auditing)
    print(
        f"{args.pairs} pairs of {args.n} in ~ N(mu, 1) / {args.n} out ~ N(0, 1), "
        f"{CONFIDENCE:.0%} confidence; ours - theirs: median [min, max] over the pairs"
    )
    head = (
        f"{'mu':>4} {'delta':>6} | {'CP eps vs their default (1-sided)':>33} | "
        f"{'CP eps vs their 2-sided':>29} | {'GDP eps':>29} | {'GDP mu':>29}"
    )
    print(head)
    print("-" * len(head))
    for mu in MUS:
        for delta in DELTAS:
            rows = []
            for i in range(args.pairs):
                base = f"mu{mu:g}_{i}"
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    o = ours(pairs[base + "_in"], pairs[base + "_out"], delta)
                t = their[base][str(delta)]
                t_mu = gdp_mu(t[2], delta) if t[2] > 0 else 0.0
                rows.append((o[0] - t[0], o[0] - t[1], o[1] - t[2], o[2] - t_mu))
            d = np.array(rows)
            print(
                f"{mu:4g} {delta:6.0e} | {_summary(d[:, 0]):>33} | {_summary(d[:, 1]):>29} | "
                f"{_summary(d[:, 2]):>29} | {_summary(d[:, 3]):>29}"
            )


if __name__ == "__main__":
    main()
