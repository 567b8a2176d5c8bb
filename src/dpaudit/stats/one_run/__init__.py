"""One-run auditing: epsilon and claims from m canaries trained in ONE run, each a member
independently with probability 1/2 (DESIGN 4.5; proofs in ``docs/one_run_fdp.md``).

Where things are, one job per module (imports run downhill in this order):

* ``guesses``: the guesses from scores ("in" for the top k+, "out" for the bottom k-, ties
  in a seeded random order), their correct counts, and every candidate set (``GuessTable``);
* ``steinke``: Steinke, Nasr & Jagielski's (epsilon, delta) bound on the counts (the
  ``"one_run"`` method), any inclusion probability;
* ``recursion``: Mahloujifar et al.'s guess-count recursion: does a claimed curve allow v of
  r guesses right? (valid for canaries that interact); the claim families' inverse ROCs;
* ``design``: the guess count fixed by the claim before the scores are seen;
* ``confidence_set``: the certified parameter, the infimum of the claims not refuted;
* ``claim``: the claim test of a curve, mu_lower and sigma_upper (the audit's one-run claim);
* ``bounds``: the certified epsilon lower bound (``"fdp_one_run_certified"``) and the GDP
  estimate (``"fdp_one_run"``).
"""

from dpaudit.stats.one_run.bounds import (
    ASSUME_FDP_ONE_RUN,
    fdp_one_run_bound,
    fdp_one_run_certified_bound,
)
from dpaudit.stats.one_run.claim import (
    OneRunClaimTest,
    claim_counts,
    claim_table,
    claim_test_on_table,
    one_run_claim_test,
    one_run_mu_lower,
    one_run_noise_upper_bound,
)
from dpaudit.stats.one_run.design import claim_guess_count, piece_rule, soonest_guess_count
from dpaudit.stats.one_run.guesses import GuessTable, guess_counts, guess_table, ranked_guesses
from dpaudit.stats.one_run.recursion import (
    epsdelta_roc_inverse,
    gdp_roc_inverse,
    largest_refuted,
    refutes,
    refutes_gdp,
    roc_inverse_of,
)
from dpaudit.stats.one_run.steinke import epsilon_from_guesses, one_run_bound, p_value

__all__ = [
    "ASSUME_FDP_ONE_RUN",
    "GuessTable",
    "OneRunClaimTest",
    "claim_counts",
    "claim_guess_count",
    "claim_table",
    "claim_test_on_table",
    "epsdelta_roc_inverse",
    "epsilon_from_guesses",
    "fdp_one_run_bound",
    "fdp_one_run_certified_bound",
    "gdp_roc_inverse",
    "guess_counts",
    "guess_table",
    "largest_refuted",
    "one_run_bound",
    "one_run_claim_test",
    "one_run_mu_lower",
    "one_run_noise_upper_bound",
    "p_value",
    "piece_rule",
    "ranked_guesses",
    "refutes",
    "refutes_gdp",
    "roc_inverse_of",
    "soonest_guess_count",
]
