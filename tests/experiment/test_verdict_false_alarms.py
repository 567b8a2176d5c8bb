"""False alarms of the certified verdict: whole audits of CORRECT DP-SGD (issue 12, section 3).

A PRIVACY BUG verdict claims a refutation at failure probability 1e-6 (``refutation_level``),
so on a correct optimizer it must not appear: over n audits the chance of even one is about
n x 1e-6. Warnings (evidence at the bounds' 95% only) may: at most 5% + 3 s.e. of the
audits per statement family. Many seeds of five cheap audit designs (logistic regression on
digits, a few steps, each audit about a second):

* one-run, 30 Dirac gradient canaries on digits' 30 dead logreg coordinates, every step
  (independent canaries: the claim test and the threshold bounds certify);
* one-run, 8 Dirac canaries (few canaries: the bounds live at their small-sample edge; a seed
  whose draw puts every canary on one side, probability 1/128, is no audit and is skipped);
* multi-run, one gradient canary, 20 trainings (the fixed-target game);
* one-run, 20 mislabeled input canaries (dependent canaries: only one_run certifies);
* one-run, 30 Dirac gradient canaries inserted like real examples (Poisson, q_c = q; scored
  by the mixture likelihood ratio, the design's default).

None adds canaries inserted like an example on a canary block (``canary.lower_side=0``):
their claim test's validity is ``tests/stats/data_rate``'s. Every audit also runs the
white-box checks (the noise's scale, law, alignment and freshness,
the released noise floor, Poisson sampling of the batches, the clipping check, the bookkeeping,
the normalisation), which share the same 1e-6.

The assertions: no ``privacy_bug`` verdict at all, and audits with a white-box warning at most
5% + 3 standard errors of a 5% rate over n audits (sqrt(0.05 x 0.95 / n)); the comment at
each test gives n. Every verdict's message must also name the threat model and the
accountant it tested. (``benchmarks/false_alarms.py`` runs 1190 larger audits.)
"""

import math

import pytest

from dpaudit.experiment import run_audit

DIRAC = {
    "model": {"name": "logreg"},
    "dp": {"noise_multiplier": 2.0, "steps": 10},
    "canary": {"kind": "gradient", "direction": "dirac", "count": 30, "view": "auto",
               "lower_side": 0},
    "attack": {"scores": ["scalar"]},
    "audit": {"methods": ["clopper_pearson", "one_run", "gdp", "gaussian"]},
}
FEW = {
    "model": {"name": "logreg"},
    "dp": {"noise_multiplier": 1.0, "steps": 10},
    "canary": {"kind": "gradient", "direction": "dirac", "count": 8, "view": "auto",
               "lower_side": 0},
    "attack": {"scores": ["scalar"]},
    "audit": {"methods": ["clopper_pearson", "one_run", "gdp", "gaussian"]},
}
MULTI = {
    "model": {"name": "logreg"},
    "dp": {"noise_multiplier": 1.0, "steps": 5},
    "canary": {"kind": "gradient", "direction": "dirac", "count": 1, "view": "auto"},
    "attack": {"scores": ["scalar"]},
    "audit": {"mode": "multi_run", "runs": 20, "methods": ["clopper_pearson", "gdp", "gaussian"]},
}
INPUT = {
    "model": {"name": "logreg"},
    "dp": {"noise_multiplier": 1.0, "steps": 10},
    "canary": {"kind": "input", "count": 20, "source": "mislabeled", "candidates": 60},
    "attack": {"scores": ["scalar"]},
    "audit": {"methods": ["clopper_pearson", "one_run", "gdp", "gaussian"]},
}
POISSON = {
    "model": {"name": "logreg"},
    "dp": {"noise_multiplier": 1.0, "steps": 20},
    "canary": {"kind": "gradient", "direction": "dirac", "count": 30, "view": "auto",
               "policy": "bernoulli", "lower_side": 0},
    "audit": {"methods": ["clopper_pearson", "one_run", "gdp", "gaussian"]},
}


def verdicts(cfg: dict, seeds, tmp_path=None) -> list[dict]:
    """The verdicts of the correct-optimizer audit ``cfg`` at each seed."""
    out = []
    for seed in seeds:
        kw = {}
        if cfg["audit"].get("mode") == "multi_run":
            kw["output_dir"] = tmp_path / f"multi_{seed}"
        try:
            result = run_audit(**cfg, seed=seed, progress=False, **kw)
        except ValueError as err:  # every canary drawn on one side: no audit to judge
            assert "an audit needs both" in str(err)
            continue
        assert result["settings"]["dp"]["bug"] == "none"
        out.append(result["verdict"])
    return out


def check(vs: list[dict]) -> None:
    n = len(vs)
    for v in vs:
        assert v["status"] in ("privacy_bug", "estimate_above_claim", "not_verified",
                               "consistent")
        # the canaries' own claim is in their own section, never in the user's paragraph
        canaries = ((v.get("stress_test") or {}).get("message")
                    or ((v.get("training_data") or {}).get("lower") or {}).get("canaries")
                    or v["message"])
        assert v["threat_model"] and v["threat_model"] in canaries, canaries
        assert v["accountant"] in canaries, canaries
    bugs = [v["message"] for v in vs if v["privacy_bug"]]
    warned = [v["message"] for v in vs if v.get("white_box_warned")]
    se = math.sqrt(0.05 * 0.95 / n)
    statuses = {s: sum(v["status"] == s for v in vs) for s in {v["status"] for v in vs}}
    print(f"{len(bugs)}/{n} privacy_bug; {len(warned)} with a white-box warning (limit "
          f"{0.05 + 3 * se:.3f}); verdicts {statuses}")
    assert not bugs, (n, bugs)
    assert len(warned) / n <= 0.05 + 3 * se, (len(warned), n, warned)


def test_correct_dp_sgd_is_never_called_a_privacy_bug_small(tmp_path):
    # n = 3 + 3 + 1 + 1 + 1 = 9 audits: s.e. of a 5% rate 0.073, limit 0.268 (at most 2).
    vs = verdicts(DIRAC, range(3)) + verdicts(FEW, range(3))
    vs += verdicts(INPUT, range(1)) + verdicts(MULTI, range(1), tmp_path)
    vs += verdicts(POISSON, range(1))
    assert len(vs) == 9
    check(vs)


@pytest.mark.slow
def test_correct_dp_sgd_is_never_called_a_privacy_bug(tmp_path):
    # n = 40 + 40 + 40 + 8 + 40 = 168 audits (minus any one-sided draw of the 8-canary
    # design): s.e. of a 5% rate 0.0168, limit 0.100 (at most 16 of 168).
    vs = verdicts(DIRAC, range(100, 140)) + verdicts(FEW, range(100, 140))
    vs += verdicts(INPUT, range(100, 140)) + verdicts(MULTI, range(100, 108), tmp_path)
    vs += verdicts(POISSON, range(100, 140))
    assert len(vs) >= 160
    check(vs)
