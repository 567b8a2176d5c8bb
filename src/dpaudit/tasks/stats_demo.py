"""Statistics demo: every lower-bound method on synthetic scores that are exactly mu-GDP.

Out scores ~ N(0, 1), in scores ~ N(mu, 1): the optimal test of a mu-GDP mechanism, so the true
epsilon at delta is ``gdp_epsilon(mu, delta)``. A sound method must stay below it; a tight one
gets close. This is the CLI's ``experiment=stats_demo`` task, over ``dpaudit.stats``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dpaudit._validate import require_choice
from dpaudit.report import format_table, write_json
from dpaudit.report.provenance import stamped
from dpaudit.stats import auc, epsilon_lower_bound, gdp_epsilon
from dpaudit.tasks.arguments import in_unit_interval, non_empty, positive

METHODS = ("gdp", "clopper_pearson", "one_run", "density", "density_tv")


def stats_demo(
    mus=(0.5, 1.0, 2.0, 4.0),
    n: int = 10_000,
    delta: float = 1e-5,
    confidence: float = 0.95,
    methods=METHODS,
    seed: int = 0,
    output_dir: str | None = None,
) -> dict:
    """Bound epsilon from n + n synthetic mu-GDP scores for each mu; print and save a table."""
    non_empty("mus", mus, positive)
    positive("n", n, integer=True)
    in_unit_interval("delta", delta)
    in_unit_interval("confidence", confidence)
    non_empty("methods", methods)
    for m in methods:
        require_choice("task.methods", m, METHODS)
    rng = np.random.default_rng(seed)
    rows, kinds = [], {}
    for mu in mus:
        scores_out = rng.standard_normal(n)
        scores_in = rng.standard_normal(n) + mu
        row = {
            "mu": float(mu),
            "true_eps": gdp_epsilon(mu, delta),
            "auc": auc(scores_in, scores_out),
        }
        for method in methods:
            res = epsilon_lower_bound(
                scores_in, scores_out, delta=delta, confidence=confidence, method=method
            )
            row[method] = res.epsilon
            kinds[method] = res.kind
        rows.append(row)
    print(
        f"\nEpsilon at delta={delta:g}, {confidence:.0%} confidence, {n} in + {n} out "
        "synthetic mu-GDP scores; certified: "
        + ", ".join(m for m in methods if kinds[m] == "certified")
        + "; estimates (under a model): "
        + ", ".join(m for m in methods if kinds[m] != "certified")
    )
    print(format_table(rows, ["mu", "true_eps", "auc", *methods]))
    result = {
        "task": "stats_demo",
        "n": n,
        "delta": delta,
        "confidence": confidence,
        "seed": seed,
        "kinds": kinds,
        "rows": rows,
    }
    if output_dir is not None:
        result = stamped(result)  # what is returned is what was written
        path = write_json(Path(output_dir) / "results.json", result)
        print(f"results: {path}")
    return result
