"""The one-run design's inclusion probability p: a plausibility check and the reduction to p = 1/2.

The one-run theorems (Steinke, Nasr & Jagielski 2023; Mahloujifar, Melis & Chaudhuri 2024)
assume each of the m canaries is a member independently with probability 1/2. Applied to a
different design they certify nonsense: 200 members against 5000 non-members with no signal
at all certify epsilon 2.5, because "out" guesses are then right 96% of the time by design.

Two tools, derived in ``docs/one_run_inclusion.md``:

* ``require_plausible``: before anything is certified, the member count must be plausible for
  Binomial(m, p) (two-sided exact binomial test at level ``PLAUSIBILITY_LEVEL`` = 1e-3);
  otherwise a ValueError names ``inclusion``. Under the stated design a refusal happens with
  probability <= 1e-3 and certifies nothing, so it costs power, never validity. The check
  cannot prove the memberships were drawn at random: it catches designs that are grossly not
  Bernoulli(p) (fixed unequal splits, memberships copied from a schedule).
* the **virtual fair-coin reduction** for p != 1/2: with gamma = 2 min(p, 1 - p) the auditor
  draws, after training and independently of the output, labels S' that are i.i.d. fair coins
  and consistent with the memberships (p < 1/2: every member gets S' = +1 and each
  non-member S' = +1 with probability (1/2 - p) / (1 - p); p > 1/2 symmetrically). The
  triple (S', memberships, output) then has the law of an experiment in which S' is uniform
  and a canary with S' = +1 (p > 1/2: S' = -1) is kept only with probability gamma: the
  mechanism seen from S' is the original one subsampled at rate gamma, hence
  (log(1 + gamma (e^eps - 1)), gamma delta)-DP when the original is (eps, delta)-DP (both
  directions; proof in the doc). The p = 1/2 theorem applied to S' therefore rejects eps
  whenever it rejects eps' = log(1 + gamma (e^eps - 1)) at delta' = gamma delta. At p = 1/2,
  gamma = 1 and S' are the memberships themselves: nothing changes.
"""

from __future__ import annotations

import numbers

import numpy as np
from scipy.stats import binom

from dpaudit import seeds

PLAUSIBILITY_LEVEL = 1e-3
"""Two-sided binomial test level below which a split is refused as implausible for p."""


def check_inclusion(inclusion, name: str = "inclusion") -> float:
    """``inclusion`` as a float in (0, 1), or a ValueError naming ``name``."""
    if isinstance(inclusion, bool) or not isinstance(inclusion, numbers.Real):
        raise ValueError(
            f"{name} must be a real number in (0, 1), the probability with which each canary "
            f"was made a member, got {inclusion!r}"
        )
    p = float(inclusion)
    if not (np.isfinite(p) and 0.0 < p < 1.0):
        raise ValueError(
            f"{name} must lie in the open interval (0, 1) (the probability with which each "
            f"canary was made a member), got {inclusion!r}"
        )
    return p


def split_p_value(n_in: int, n_out: int, inclusion: float) -> float:
    """Two-sided exact binomial p-value of ``n_in`` members among n_in + n_out under p."""
    m = int(n_in) + int(n_out)
    below = float(binom.cdf(n_in, m, inclusion))
    above = float(binom.sf(n_in - 1, m, inclusion))
    return min(1.0, 2.0 * min(below, above))


def require_plausible(n_in: int, n_out: int, inclusion: float, method: str) -> float:
    """Refuse (ValueError naming ``inclusion``) a split implausible under the stated design.

    Returns the split's two-sided p-value when it is at least ``PLAUSIBILITY_LEVEL``.
    """
    pv = split_p_value(n_in, n_out, inclusion)
    if pv < PLAUSIBILITY_LEVEL:
        m = n_in + n_out
        raise ValueError(
            f"inclusion={inclusion:g}: {method} assumes each of the m = {m} canaries was made a "
            f"member independently with probability inclusion, but {n_in} members and {n_out} "
            f"non-members are implausible under it (two-sided binomial test p = {pv:.2g} < "
            f"{PLAUSIBILITY_LEVEL:g}; expected about {m * inclusion:.0f} members); pass the "
            "inclusion probability the memberships were drawn with, or draw them at random "
            "(one_run's guarantee holds only for that design)"
        )
    return pv


def amplification(inclusion: float) -> float:
    """gamma = 2 min(p, 1 - p): the rate at which the virtual fair-coin design keeps a canary."""
    return 2.0 * min(inclusion, 1.0 - inclusion)


def amplified_epsilon(epsilon, gamma: float):
    """eps' = log(1 + gamma (e^eps - 1)): the privacy of the virtual design (arrays broadcast)."""
    return np.log1p(gamma * np.expm1(np.asarray(epsilon, dtype=np.float64)))


def virtual_labels(n_in: int, n_out: int, inclusion: float, seed: int) -> np.ndarray:
    """Fair-coin labels S' (True = +1) for members first, then non-members (module doc).

    At p = 1/2 these are the memberships themselves (no random draw). Otherwise each
    non-member (p < 1/2), or each member (p > 1/2), is relabelled with the probability that
    makes S' a fair coin, from ``seeds.stream(seed, seeds.VIRTUAL_LABELS)``.
    """
    labels = np.concatenate([np.ones(n_in, dtype=bool), np.zeros(n_out, dtype=bool)])
    if inclusion == 0.5:
        return labels
    u = seeds.stream(seed, seeds.VIRTUAL_LABELS).random(n_in + n_out)
    if inclusion < 0.5:
        flip = (~labels) & (u < (0.5 - inclusion) / (1.0 - inclusion))
    else:
        flip = labels & (u < (inclusion - 0.5) / inclusion)
    return labels ^ flip
