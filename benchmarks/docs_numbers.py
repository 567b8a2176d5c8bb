"""Numbers in the documentation, regenerated from the code that produces them.

A documented number sits between two markers, ``<!-- docs-numbers:NAME -->`` and
``<!-- /docs-numbers:NAME -->`` (invisible in the rendered page; they may sit inside a table
cell). Each NAME below is a function that computes the text between them. Run:

    python benchmarks/docs_numbers.py            # check: exit 1 and list the stale blocks
    python benchmarks/docs_numbers.py --write    # rewrite every block in place

``tests/test_docs_numbers.py`` (slow tier) runs the check, so a change that moves a documented
number fails CI until the docs are regenerated. Only deterministic computations are blocks
(fixed seeds, no timing); numbers measured over seeds on a particular machine (tightness,
power, wall times) name the script and commit that produced them instead.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", ROOT / "experiments" / "README.md",
        *sorted((ROOT / "docs").glob("*.md"))]


def stats_demo() -> str:
    """``dpaudit experiment=stats_demo``'s table (its defaults), one clause per mu."""
    from dpaudit.tasks.stats_demo import stats_demo as run

    methods = ("gdp", "clopper_pearson", "one_run", "density", "density_tv")
    rows = run(methods=methods)["rows"]
    head = "true eps / " + " / ".join(methods)
    parts = [
        f"mu = {r['mu']:g}: " + " / ".join(f"{r[k]:.3f}" for k in ("true_eps", *methods))
        for r in rows
    ]
    return f"{head} at " + "; ".join(parts)


def _exact_claim(noise_multiplier: float) -> str:
    """The claimed epsilon of canaries inserted at every step of the default audit's DP
    settings at ``noise_multiplier``: the exact Gaussian mechanism (mu = sqrt(T) / sigma)."""
    from dpaudit.experiment.settings import AuditSettings
    from dpaudit.stats import gdp_epsilon

    dp = AuditSettings().dp
    return f"{gdp_epsilon(math.sqrt(dp.steps) / noise_multiplier, dp.delta):.3f}"


def claim_default() -> str:
    """The default audit's every-step canaries' claim (``dpaudit``: sigma 1, T = 100, delta
    1e-5): the stress test's, not the training data's."""
    from dpaudit.experiment.settings import AuditSettings

    return _exact_claim(AuditSettings().dp.noise_multiplier)


def claim_sigma6() -> str:
    """The every-step canaries' claim of the default audit before issue 66 (sigma 6: the
    measurements the docs keep for it, ``dpaudit dp.noise_multiplier=6``)."""
    return _exact_claim(6.0)


def claim_sigma10() -> str:
    """The claim of ``dpaudit dp.noise_multiplier=10`` (the planted-bug showcase)."""
    return _exact_claim(10.0)


def own_loop() -> str:
    """What the complete own-loop example (docs/own_loop.md) reports for its gradient
    canaries: it runs the snippet (a short Opacus training on digits) in a temporary
    directory. The numbers are those of perfectly separated scores, so they depend on the
    canary counts and the claim."""
    import contextlib
    import io
    import os
    import tempfile

    page = (ROOT / "docs" / "own_loop.md").read_text()
    section = page.split("## A complete example: input and gradient canaries\n", 1)[1]
    (block,) = re.findall(r"```python\n(.*?)```", section.split("\n## ", 1)[0], flags=re.S)
    ns: dict = {"__name__": "__docs_numbers__"}
    here = os.getcwd()
    with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stdout(io.StringIO()):
        os.chdir(tmp)
        try:
            exec(compile(block, "docs/own_loop.md", "exec"), ns)
        finally:
            os.chdir(here)
    report = ns["report"]
    ceiling = report["canary_info"]["certifiable_ceiling"]
    best = max((b for b in report["bounds"] if b["kind"] == "certified"),
               key=lambda b: b["epsilon"])
    auc_value = report["attacks"][best["attack"]]["auc"]
    return (f"certifies {best['epsilon']:.2f} (`{best['method']}`) against a claim of "
            f"{ceiling['claimed']:.1f}, with AUC {auc_value:.3f}. With {ceiling['n_in']} member "
            f"and {ceiling['n_out']} non-member gradient canaries, a threshold attack could "
            f"certify at most {ceiling['epsilon']:.2f} even with perfectly separated scores")


def shuffled_bound() -> str:
    """``run_audit(dp={"bug": "shuffled_batches", "noise_multiplier": 1})`` (seed 0): the
    sampling seen, Opacus' epsilon for the training data and the shuffled batches' lower
    bound (Chua et al.) the report prints beside it."""
    import contextlib
    import io
    import warnings

    from dpaudit.experiment import run_audit

    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        res = run_audit(dp={"bug": "shuffled_batches", "noise_multiplier": 1.0},
                        progress=False)
    seen = res["white_box"]["checks"]["sampling_by_example"]["details"]["sampling_seen"]
    bound = seen["lower_bound"]
    train = res["theory"]["training_data"]
    return (f"fixed batches of {seen['batch_size']}, {bound['batches_per_pass']} a pass, "
            f"{bound['passes']} full passes in {res['steps']} steps: Opacus claims epsilon "
            f"{train['opacus_epsilon']:.2f} for the training data (Poisson, q = "
            f"{train['sample_rate']:.3f}), and the shuffled batches' true epsilon is at least "
            f"{bound['epsilon']:.2f}, at delta {bound['delta']:g}")


BLOCKS: dict[str, Callable[[], str]] = {
    "stats_demo": stats_demo,
    "claim_default": claim_default,
    "claim_sigma6": claim_sigma6,
    "claim_sigma10": claim_sigma10,
    "own_loop": own_loop,
    "shuffled_bound": shuffled_bound,
}


def _pattern(name: str) -> re.Pattern:
    key = re.escape(name)
    return re.compile(rf"(<!-- docs-numbers:{key} -->)(.*?)(<!-- /docs-numbers:{key} -->)", re.S)


def refresh(write: bool, names=None) -> list[str]:
    """Recompute every block (or ``names``); returns 'file: NAME' for each stale one, and with
    ``write`` rewrites them. A block named in no file is an error (its marker was lost)."""
    names = list(BLOCKS) if names is None else list(names)
    stale, found = [], set()
    values = {}
    for path in DOCS:
        text = path.read_text()
        new = text
        for name in names:
            pat = _pattern(name)
            if not pat.search(new):
                continue
            found.add(name)
            if name not in values:
                values[name] = BLOCKS[name]()
            value = values[name]
            for m in pat.finditer(new):
                if m.group(2) != value:
                    stale.append(f"{path.relative_to(ROOT)}: {name}")
            new = pat.sub(lambda m, v=value: m.group(1) + v + m.group(3), new)
        if write and new != text:
            path.write_text(new)
    missing = sorted(set(names) - found)
    if missing:
        raise SystemExit(f"no docs-numbers marker for {missing} in {[str(p) for p in DOCS]}")
    return stale


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="rewrite the stale blocks")
    ap.add_argument("names", nargs="*", help=f"blocks to refresh (default all: {list(BLOCKS)})")
    a = ap.parse_args(argv)
    stale = refresh(a.write, a.names or None)
    if stale and not a.write:
        print("stale documented numbers (python benchmarks/docs_numbers.py --write):")
        print("\n".join(f"  {s}" for s in stale))
        sys.exit(1)
    print(("rewrote: " + ", ".join(stale)) if stale else "every documented number is current")


if __name__ == "__main__":
    main()
