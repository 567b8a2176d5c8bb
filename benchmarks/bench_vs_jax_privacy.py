"""Our bounds against jax_privacy's auditing module on identical inputs, over the validity suite.

For every scenario of ``dpaudit.validity.SCENARIOS`` (plus N(4, 1) vs N(0, 1)) and every
design (equal sides of ``--n``, and ``dpaudit.validity.DESIGNS``: 200 / 5000 Bernoulli both
ways, 200 / 5000 fixed, one member against 300, ten per side) it draws ``--pairs`` score
samples (seeded exactly as the validity study draws them) and computes at ``--delta`` and 95%:

* ours: ``epsilon_lower_bound`` with ``clopper_pearson``, ``one_run``, ``fdp_one_run`` and
  ``gdp`` (default options; the one-run methods are told the design's inclusion
  probability n_in / m);
* theirs: ``CanaryScoreAuditor(in, out)``'s ``epsilon_clopper_pearson`` (their default,
  one-sided, and ``one_sided=False``), ``epsilon_one_run``, ``epsilon_one_run_fdp`` and
  ``epsilon_from_gdp`` (their default Bonferroni threshold strategy; their one-run methods
  have no inclusion probability and assume 1/2).

It prints, per (scenario, design, method), the median of ours and of theirs, the median
[min, max] over the pairs of ours - theirs, and how often each exceeded the scenario's true
epsilon (a certified number may do so in at most 5% of pairs, up to noise: "!" marks theirs
or ours above 5% + 3 s.e.). A refusal (ours: a split implausible under the stated design, or
a method not derived for it) prints "refused" and counts as 0.

jax_privacy is never imported into this process and is not a dependency of dpaudit: their
``auditing.py`` (it needs numpy, scipy and dp_accounting only) runs in a separate Python, read
from a checkout given on the command line; the samples go to it through a temporary .npz file.

Run (once: a separate venv and a checkout of google-deepmind/jax_privacy)::

    python3 -m venv /tmp/jaxenv && /tmp/jaxenv/bin/pip install numpy scipy dp-accounting
    python benchmarks/bench_vs_jax_privacy.py --jax-privacy /path/to/jax_privacy \\
        --jax-python /tmp/jaxenv/bin/python --json vs_jax.json

``--jax-privacy`` is the checkout's root (holding ``jax_privacy/auditing.py``) or that file.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from dpaudit._jsonable import to_jsonable
from dpaudit.stats import epsilon_lower_bound
from dpaudit.validity import DESIGNS, SCENARIOS, Design, GaussianShift, draw, draw_rng

CONFIDENCE = 0.95
OURS = ("clopper_pearson", "one_run", "fdp_one_run", "gdp")
THEIRS = ("cp_one_sided", "cp_two_sided", "one_run", "fdp_one_run", "gdp")
# which of theirs each of ours is compared with (CP twice: their default and two-sided)
PAIRS = (
    ("clopper_pearson", "cp_one_sided"),
    ("clopper_pearson", "cp_two_sided"),
    ("one_run", "one_run"),
    ("fdp_one_run", "fdp_one_run"),
    ("gdp", "gdp"),
)
CERTIFIED = {"clopper_pearson", "one_run", "cp_one_sided", "cp_two_sided"}

# Runs in the jax venv: loads auditing.py by path (not the package, whose __init__ needs jax).
_THEIRS = r"""
import importlib.util, json, sys, warnings
import numpy as np
warnings.simplefilter("ignore")
spec = importlib.util.spec_from_file_location("jp_auditing", sys.argv[1])
aud = importlib.util.module_from_spec(spec)
sys.modules["jp_auditing"] = aud
spec.loader.exec_module(aud)
data = np.load(sys.argv[2])
sig, delta = float(sys.argv[3]), float(sys.argv[4])
out = {}
for key in data.files:
    if not key.endswith("|in"):
        continue
    base = key[:-3]
    a = aud.CanaryScoreAuditor(data[base + "|in"], data[base + "|out"])
    row = {}
    for name, call in (
        ("cp_one_sided", lambda: a.epsilon_clopper_pearson(sig, delta)),
        ("cp_two_sided", lambda: a.epsilon_clopper_pearson(sig, delta, one_sided=False)),
        ("one_run", lambda: a.epsilon_one_run(sig, delta)),
        ("fdp_one_run", lambda: a.epsilon_one_run_fdp(sig, delta)),
        ("gdp", lambda: a.epsilon_from_gdp(sig, delta)),
    ):
        try:
            row[name] = float(call())
        except Exception as err:  # their refusal: reported as such
            row[name] = repr(err)[:200]
    out[base] = row
json.dump(out, open(sys.argv[5], "w"))
"""


def settings(n: int) -> list[tuple[object, Design, bool]]:
    """(scenario, design, keyed) of the comparison: equal sides first (the validity study's
    own seeding), then every design of ``DESIGNS`` on every scenario."""
    scens = [*SCENARIOS.values(), GaussianShift(4.0)]
    out = [(s, Design(n, n), False) for s in scens]
    out += [(s, d, True) for s in scens for d in DESIGNS.values()]
    return out


def make_samples(cases, pairs: int, seed: int) -> dict[str, np.ndarray]:
    """``{"scenario|design|i|in": ..., "...|out": ...}``: the benchmark's inputs."""
    data = {}
    for scen, design, keyed in cases:
        for i in range(pairs):
            s_in, s_out = draw(scen, design, draw_rng(seed, scen, i, design if keyed else None))
            data[f"{scen.name}|{design.name}|{i}|in"] = s_in
            data[f"{scen.name}|{design.name}|{i}|out"] = s_out
    return data


def theirs(data: dict[str, np.ndarray], jax_python: str, auditing: Path, delta: float) -> dict:
    """Their numbers per sample, computed in their venv."""
    with tempfile.TemporaryDirectory() as tmp:
        npz, res = Path(tmp) / "samples.npz", Path(tmp) / "theirs.json"
        np.savez(npz, **data)
        cmd = [jax_python, "-c", _THEIRS, str(auditing), str(npz), str(1 - CONFIDENCE)]
        subprocess.run([*cmd, str(delta), str(res)], check=True)
        return json.loads(res.read_text())


def _ours_one(args) -> tuple[str, dict]:
    key, s_in, s_out, inclusion, delta = args
    row = {}
    for method in OURS:
        opts = {"inclusion": inclusion} if "one_run" in method else {}
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                row[method] = epsilon_lower_bound(
                    s_in, s_out, delta=delta, confidence=CONFIDENCE, method=method, **opts
                ).epsilon
        except ValueError as err:  # refused (design not covered, too few scores)
            row[method] = f"refused: {err}"[:200]
    return key, row


def ours(data, cases, pairs: int, delta: float, jobs: int) -> dict:
    """Our numbers per sample (in ``jobs`` processes)."""
    tasks = []
    for scen, design, _ in cases:
        for i in range(pairs):
            base = f"{scen.name}|{design.name}|{i}"
            tasks.append((base, data[base + "|in"], data[base + "|out"], design.inclusion, delta))
    if jobs > 1:
        with ProcessPoolExecutor(jobs) as pool:
            return dict(pool.map(_ours_one, tasks, chunksize=4))
    return dict(map(_ours_one, tasks))


def _value(x) -> float:
    return float(x) if isinstance(x, (int, float)) else 0.0  # a refusal certifies nothing


def summarise(cases, pairs: int, our: dict, their: dict, delta: float) -> list[dict]:
    """One row per (scenario, design, our method, their method)."""
    rows = []
    for scen, design, _ in cases:
        truth = float(scen.true_epsilon(delta))
        keys = [f"{scen.name}|{design.name}|{i}" for i in range(pairs)]
        for mine, other in PAIRS:
            o = np.array([_value(our[k][mine]) for k in keys])
            t = np.array([_value(their[k][other]) for k in keys])
            refused_o = sum(isinstance(our[k][mine], str) for k in keys)
            refused_t = sum(isinstance(their[k][other], str) for k in keys)
            d = o - t
            rows.append(
                {
                    "scenario": scen.name,
                    "design": design.name,
                    "ours": mine,
                    "theirs": other,
                    "truth": truth,
                    "median_ours": float(np.median(o)),
                    "median_theirs": float(np.median(t)),
                    "diff_median": float(np.median(d)),
                    "diff_min": float(np.min(d)),
                    "diff_max": float(np.max(d)),
                    "ours_above_truth": float(np.mean(o > truth)),
                    "theirs_above_truth": float(np.mean(t > truth)),
                    "ours_refused": refused_o / pairs,
                    "theirs_refused": refused_t / pairs,
                    "pairs": pairs,
                }
            )
    return rows


def _mark(frac: float, pairs: int, certified: bool) -> str:
    limit = 0.05 + 3 * np.sqrt(0.05 * 0.95 / pairs)
    return "!" if certified and frac > limit else " "


def print_table(rows: list[dict]) -> None:
    head = (
        f"{'scenario':>26} {'design':>17} {'ours':>15} {'theirs':>12} {'truth':>7} "
        f"{'ours':>7} {'theirs':>7} {'ours - theirs: median [min, max]':>34} "
        f"{'>truth ours':>11} {'theirs':>7}"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        ref_o = " (refused)" if r["ours_refused"] == 1 else ""
        mark_o = _mark(r["ours_above_truth"], r["pairs"], r["ours"] in CERTIFIED)
        mark_t = _mark(r["theirs_above_truth"], r["pairs"], r["theirs"] in CERTIFIED)
        print(
            f"{r['scenario']:>26} {r['design']:>17} {r['ours']:>15} {r['theirs']:>12} "
            f"{r['truth']:7.3f} {r['median_ours']:7.3f} {r['median_theirs']:7.3f} "
            f"{r['diff_median']:+8.3f} [{r['diff_min']:+8.3f}, {r['diff_max']:+8.3f}]     "
            f"{r['ours_above_truth']:9.2f}{mark_o} {r['theirs_above_truth']:6.2f}{mark_t}"
            f"{ref_o}"
        )


def markdown(rows: list[dict], header: str) -> str:
    """The rows as a Markdown table after ``header``, then a per-method summary."""
    cols = ("scenario", "design", "ours", "theirs", "truth", "median ours", "median theirs",
            "ours - theirs: median [min, max]", "ours > truth", "theirs > truth")
    lines = [header, "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        refused = " (refused)" if r["ours_refused"] == 1 else ""
        mark_o = _mark(r["ours_above_truth"], r["pairs"], r["ours"] in CERTIFIED).strip()
        mark_t = _mark(r["theirs_above_truth"], r["pairs"], r["theirs"] in CERTIFIED).strip()
        lines.append(
            f"| {r['scenario']} | {r['design']} | {r['ours']}{refused} | {r['theirs']} | "
            f"{r['truth']:.3f} | {r['median_ours']:.3f} | {r['median_theirs']:.3f} | "
            f"{r['diff_median']:+.3f} [{r['diff_min']:+.3f}, {r['diff_max']:+.3f}] | "
            f"{r['ours_above_truth']:.2f}{mark_o} | {r['theirs_above_truth']:.2f}{mark_t} |"
        )
    lines += ["", summary(rows)]
    return "\n".join(lines) + "\n"


def summary(rows: list[dict]) -> str:
    """Per (ours, theirs): in how many (scenario, design) cells ours is lower in the median,
    equal or higher, and how many cells have a certified number above the truth too often."""
    out = ["| ours | theirs | cells | ours lower | equal | ours higher | ours refused | "
           "certified above truth (!): ours / theirs |", "|---|---|---|---|---|---|---|---|"]
    for mine, other in PAIRS:
        sel = [r for r in rows if r["ours"] == mine and r["theirs"] == other]
        used = [r for r in sel if r["ours_refused"] < 1]
        lower = sum(r["diff_median"] < -1e-9 for r in used)
        higher = sum(r["diff_median"] > 1e-9 for r in used)
        bad_o = sum(_mark(r["ours_above_truth"], r["pairs"], mine in CERTIFIED) == "!"
                    for r in sel)
        bad_t = sum(_mark(r["theirs_above_truth"], r["pairs"], other in CERTIFIED) == "!"
                    for r in sel)
        out.append(
            f"| {mine} | {other} | {len(sel)} | {lower} | {len(used) - lower - higher} | "
            f"{higher} | {len(sel) - len(used)} | {bad_o} / {bad_t} |"
        )
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jax-privacy", required=True, help="jax_privacy checkout or auditing.py")
    ap.add_argument("--jax-python", required=True, help="python of a venv with dp_accounting")
    ap.add_argument("--pairs", type=int, default=20)
    ap.add_argument("--n", type=int, default=1000, help="scores per side of the equal design")
    ap.add_argument("--delta", type=float, default=1e-5)
    ap.add_argument("--seed", type=int, default=2025)
    ap.add_argument("--jobs", type=int, default=1, help="processes for our side")
    ap.add_argument("--json", type=Path, help="write the rows here")
    ap.add_argument("--markdown", type=Path, help="write the table and summary as Markdown")
    args = ap.parse_args()
    auditing = Path(args.jax_privacy)
    if auditing.is_dir():
        auditing = auditing / "jax_privacy" / "auditing.py"
    if not auditing.is_file():
        sys.exit(f"no auditing.py at {auditing}")
    cases = settings(args.n)
    data = make_samples(cases, args.pairs, args.seed)
    t0 = time.perf_counter()
    their = theirs(data, args.jax_python, auditing, args.delta)
    t1 = time.perf_counter()
    our = ours(data, cases, args.pairs, args.delta, args.jobs)
    t2 = time.perf_counter()
    rows = summarise(cases, args.pairs, our, their, args.delta)
    header = (
        f"{args.pairs} samples per (scenario, design), delta {args.delta:g}, "
        f"{CONFIDENCE:.0%} confidence, seed {args.seed}; theirs {t1 - t0:.0f} s, ours "
        f"{t2 - t1:.0f} s ({args.jobs} job(s), {os.cpu_count()} hardware threads)"
    )
    print(header)
    print_table(rows)
    print(summary(rows))
    if args.markdown:
        args.markdown.write_text(markdown(rows, header))
    if args.json:
        args.json.write_text(json.dumps(to_jsonable({"settings": vars(args), "rows": rows})))


if __name__ == "__main__":
    main()
