"""Threshold policies for attacks that must decide (seed 003), and an orientation check.

Convention everywhere in dpaudit: higher score = "member"; decide member iff score >= t.

* fixed: a threshold chosen in advance (seed 003's naive attacker, "balanced" for the
  undefended case);
* adaptive from reference non-members: seed 003's tau^(N) is the mean score of the N
  reference non-members that look most like members (lowest LR statistic in their sign
  convention, i.e. the HIGHEST scores in ours);
* Neyman-Pearson at level alpha: the threshold from reference non-member scores whose false
  positive rate on a fresh non-member is <= alpha (exchangeability: the k-th largest of n
  reference scores, k = floor(alpha (n + 1)), is exceeded-or-equalled by a new one with
  probability k / (n + 1) for continuous scores).

``check_orientation`` warns (``OrientationWarning``) when members score significantly LOWER
than non-members: a one-sided Mann-Whitney z-test of AUC < 1/2 at p < 1e-3 ("far below 0.5"),
which almost always means a sign bug in the score.
"""

from __future__ import annotations

import warnings

import numpy as np
from scipy.special import ndtr

from dpaudit._validate import check_open_unit, check_real, check_scores
from dpaudit.stats.roc import auc as _auc


class OrientationWarning(UserWarning):
    """Members score significantly lower than non-members: the score is probably flipped."""


def fixed_threshold(value: float) -> float:
    """A fixed, pre-registered threshold (validated finite)."""
    v = check_real(value, "value")
    if not np.isfinite(v):
        raise ValueError(f"value must be a finite threshold, got {value!r}")
    return v


def adaptive_threshold(reference_out, n_top: int) -> float:
    """Seed 003's adaptive threshold: mean of the ``n_top`` highest reference non-member scores."""
    ref = check_scores(reference_out, "reference_out")
    if isinstance(n_top, bool) or not isinstance(n_top, (int, np.integer)) or not (
        1 <= n_top <= ref.size
    ):
        raise ValueError(f"n_top must be an integer in [1, {ref.size}], got {n_top!r}")
    return float(np.mean(np.sort(ref)[ref.size - int(n_top) :]))


def neyman_pearson_threshold(reference_out, alpha: float) -> float:
    """Threshold with false positive rate <= ``alpha`` on a fresh non-member (module doc).

    Returns +inf (never decide "member") when fewer than 1 / alpha - 1 references exist.
    """
    ref = np.sort(check_scores(reference_out, "reference_out"))
    alpha = check_open_unit(alpha, "alpha")
    k = int(np.floor(alpha * (ref.size + 1)))
    if k == 0:
        return float("inf")
    return float(ref[ref.size - k])


def apply_threshold(scores, threshold: float) -> np.ndarray:
    """Boolean "member" decisions: score >= threshold."""
    return check_scores(scores, "scores") >= check_real(threshold, "threshold")


def orientation_test(scores_in, scores_out, *, p_value: float = 1e-3) -> tuple[float, float, bool]:
    """(AUC, z, reversed): one-sided Mann-Whitney test of AUC < 1/2, no warning.

    z = (AUC - 1/2) / sqrt((n_in + n_out + 1) / (12 n_in n_out)) (null variance, no tie
    correction); ``reversed`` is Phi(z) < ``p_value``.
    """
    s_in = check_scores(scores_in, "scores_in")
    s_out = check_scores(scores_out, "scores_out")
    p_value = check_open_unit(p_value, "p_value")
    a = _auc(s_in, s_out)
    n1, n2 = s_in.size, s_out.size
    z = float((a - 0.5) / np.sqrt((n1 + n2 + 1) / (12.0 * n1 * n2)))
    return a, z, bool(ndtr(z) < p_value)


def check_orientation(scores_in, scores_out, *, p_value: float = 1e-3) -> float:
    """Return the AUC; warn ``OrientationWarning`` if it is significantly below 1/2.

    The test is ``orientation_test``'s; ``epsilon_lower_bound`` runs it on every call.
    """
    a, z, flipped = orientation_test(scores_in, scores_out, p_value=p_value)
    if flipped:
        warnings.warn(
            f"AUC = {a:.4f} is significantly below 0.5 (z = {z:.2f}): members score LOWER than "
            "non-members; the score is probably flipped (higher must mean 'member')",
            OrientationWarning,
            stacklevel=2,
        )
    return a
