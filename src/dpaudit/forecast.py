"""What an audit can certify, said before it trains (DESIGN 4.5: what the audit can see).

From the threat model and the canary counts alone: the scores of the most powerful attack on
a correct run (``ideal_scores``), the certified bound such scores give
(``expected_certified_bound``), and the largest epsilon any threshold attack can certify
with these counts (``certifiable_ceiling``, in words: ``ceiling_sentence``). The trainings
wing warns with it before training; the judging wing prints it in the report.
"""

from __future__ import annotations

import math

import numpy as np

from dpaudit import seeds
from dpaudit.threat_model import ThreatModel


def ideal_scores(
    threat: ThreatModel, n_in: int, n_out: int, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Member / non-member scores of the most powerful attack on one gradient canary of a
    correct run, drawn from the claimed mechanism itself (seeded, ``seeds.POWER_SIMULATION``).

    Every step (q = 1): N(mu, 1) vs N(0, 1) with mu = sqrt(T) c / (sigma C). Poisson canaries
    (q < 1): the summed per-step log-likelihood ratio log(1 - q + q exp(m y - m^2 / 2)), y the
    released coordinate over sigma C, m = c / (sigma C), the Neyman-Pearson test of the
    subsampled Gaussian. No real attack does better, so a bound that is 0 here is 0 for the
    audit."""
    rng = seeds.stream(seed, seeds.POWER_SIMULATION)
    c = threat.canary_norm or threat.max_grad_norm
    m = c / (threat.noise_multiplier * threat.max_grad_norm)
    q, steps = threat.sample_rate, threat.steps
    if q >= 1.0:
        mu = m * np.sqrt(steps)
        return rng.standard_normal(n_in) + mu, rng.standard_normal(n_out)

    def draw(n: int, member: bool) -> np.ndarray:
        out, rows = np.empty(n), max(1, 2_000_000 // steps)  # bounded memory per chunk
        for i in range(0, n, rows):
            y = rng.standard_normal((min(rows, n - i), steps))
            if member:
                y += m * (rng.random(y.shape) < q)
            out[i : i + len(y)] = np.log1p(q * np.expm1(m * y - m * m / 2)).sum(axis=1)
        return out

    return draw(n_in, True), draw(n_out, False)


def expected_certified_bound(
    n_in: int, n_out: int, mu: float | None, confidence: float, delta: float, seed: int = 0,
    scores: tuple[np.ndarray, np.ndarray] | None = None,
) -> float:
    """The Clopper-Pearson epsilon bound of n_in member / n_out non-member scores drawn as
    N(mu, 1) / N(0, 1) (mu None: perfectly separated scores, the most any certified rate
    bound can give with these counts), or of the given ``scores``. Used to say before
    training what an audit can show."""
    from dpaudit.stats import epsilon_lower_bound

    if scores is not None:
        s_in, s_out = scores
    elif mu is None:
        s_in, s_out = np.ones(n_in), np.zeros(n_out)
    else:
        rng = seeds.stream(seed, seeds.POWER_SIMULATION)
        s_in, s_out = rng.standard_normal(n_in) + mu, rng.standard_normal(n_out)
    res = epsilon_lower_bound(
        s_in, s_out, delta=delta, confidence=confidence, method="clopper_pearson"
    )
    return float(res.epsilon)


_CHECK_UP_TO = 200_000  # canaries per side up to which certifiable_ceiling checks its answer


def certifiable_ceiling(
    n_in: int, n_out: int, claimed: float, confidence: float, delta: float
) -> dict:
    """The largest epsilon a threshold attack can certify with these counts (perfectly
    separated scores, ``expected_certified_bound``) and, when that is below ``claimed``, about
    how many canaries per side it would take to certify the claim (the ceiling grows like
    log n: n x e^(claimed - ceiling), checked once up to 200,000 per side); ``needed`` is None
    when it is beyond 10^9 per side (out of reach: the claim test's sigma_upper is the
    statement to read)."""
    ceiling = expected_certified_bound(n_in, n_out, None, confidence, delta)
    out = {"epsilon": ceiling, "claimed": float(claimed), "n_in": n_in, "n_out": n_out,
           "needed_per_side": 0}
    if not ceiling < claimed:
        return out
    n = max(n_in, n_out, 1)
    guess = n * math.exp(min(claimed - ceiling, 50.0))
    needed = None
    if guess <= 1e9:
        needed = math.ceil(guess)
        # checked by the bound itself while that is cheap (it sorts 2 x needed scores)
        if needed <= _CHECK_UP_TO and expected_certified_bound(
            needed, needed, None, confidence, delta
        ) < claimed:
            needed = math.ceil(needed * math.e ** 0.5)  # the log n law is approximate
    out["needed_per_side"] = needed
    return out


def per_side_points(forecast: dict) -> str:
    """A forecast's ``epsilon_at_per_side`` in words: "1,000 per side 0.306, ..."."""
    return ", ".join(f"{int(k):,} per side {v:.3g}"
                     for k, v in forecast["epsilon_at_per_side"].items())


def ceiling_sentence(ceiling: dict) -> str:
    """``certifiable_ceiling`` in words, for the report (empty when it is not below the claim)."""
    if not ceiling or ceiling.get("needed_per_side") == 0:
        return ""
    head = (
        f"with {ceiling['n_in']} member and {ceiling['n_out']} non-member scores, the largest "
        f"epsilon a threshold attack can certify here is about {ceiling['epsilon']:.3g} "
        "(perfectly separated scores)"
    )
    need = ceiling.get("needed_per_side")
    if need is None:
        return (f"{head}: the claimed {ceiling['claimed']:.4g} is out of reach of any "
                "certified epsilon bound; the claim test (mu_lower, sigma_upper) is the "
                "statement to read")
    return (f"{head}; certifying the claimed {ceiling['claimed']:.4g} would take about "
            f"{need:,} canaries on each side")




def clt_mu(noise_multiplier: float, sample_rate: float, steps: int) -> float:
    """The CLT's GDP parameter of T Poisson-subsampled Gaussian steps (Bu et al. 2020):
    q sqrt(T (e^{1/sigma^2} - 1)) (sqrt(T) / sigma at q = 1); an approximation."""
    if sample_rate >= 1.0:
        return float(np.sqrt(steps) / noise_multiplier)
    with np.errstate(over="ignore"):
        return float(sample_rate * np.sqrt(steps * np.expm1(1.0 / noise_multiplier**2)))


def expected_count_bound(mu: float, per_side: int, confidence: float, delta: float) -> float:
    """The Clopper-Pearson epsilon of ``per_side`` member and non-member scores N(mu, 1) /
    N(0, 1) at their EXPECTED counts (no simulation: deterministic, O(log n)), with the
    default threshold candidates and their Bonferroni levels (``stats.threshold_selection``).
    A forecast of what an audit with that many canaries reaches, not a bound."""
    from scipy.special import ndtr, ndtri

    from dpaudit.stats.clopper_pearson import eps_from_rates
    from dpaudit.stats.threshold_selection import cp_upper, default_ranks

    m = int(per_side)
    ranks = default_ranks(m)
    a = (1.0 - confidence) / (4 * len(ranks))
    t = -ndtri((ranks + 0.5) / m)  # the non-members' (k+1)-th largest, in expectation
    fn = np.clip(np.round(m * ndtr(t - mu)), 0, m)
    eps = eps_from_rates(cp_upper(ranks, m, a), cp_upper(fn, m, a), delta)
    return float(np.max(eps))


def poisson_canaries_forecast(noise_multiplier: float, sample_rate: float, steps: int,
                              confidence: float, delta: float) -> dict:
    """What canaries inserted like a training example (Poisson at the data's rate, norm C, the
    same noise) would certify for the training data, by the CLT's mu and
    ``expected_count_bound``: the epsilon at 10^3 / 10^4 / 10^5 canaries per side and the
    smallest power of ten per side (up to 10^9) that certifies a positive epsilon (None
    beyond). A forecast under the CLT model, never a bound."""
    mu = clt_mu(noise_multiplier, sample_rate, steps)
    at = {str(10**e): expected_count_bound(mu, 10**e, confidence, delta) for e in (3, 4, 5)}
    needed = next((10**e for e in range(2, 10)
                   if expected_count_bound(mu, 10**e, confidence, delta) > 0), None)
    return {"mu": mu, "epsilon_at_per_side": at, "per_side_for_positive": needed,
            "kind": "forecast (ideal attack, CLT model of the subsampled Gaussian)"}


def _data_rate_threat(threat: ThreatModel) -> ThreatModel:
    """The threat model of data-rate canaries: Poisson at a rate q < 1 (refused otherwise)."""
    if not isinstance(threat, ThreatModel):
        raise ValueError(f"threat must be a ThreatModel, got {type(threat).__name__}")
    if threat.every_step:
        raise ValueError(
            "data-rate canaries are inserted with probability q < 1 per step (the training "
            "data's rate); this threat model inserts them at every step (sample_rate=1)")
    return threat


def data_rate_plan(threat: ThreatModel, n_in: int, n_out: int, *, confidence: float,
                   refutation_level: float):
    """Every test of the data-rate canaries, fixed from the claim before the scores are seen
    (``stats.data_rate.plan_data_rate`` at the threat model's q, T, sigma, canary norm and
    delta). ``plan.expected`` is what a correct run should show (the count ceiling's median
    certified epsilon; the noise multipliers the curve tests reject half the time or more);
    ``data_rate_evidence`` evaluates it."""
    from dpaudit.stats.data_rate import plan_data_rate

    threat = _data_rate_threat(threat)
    return plan_data_rate(steps=int(threat.steps), sample_rate=float(threat.sample_rate),
                          noise_multiplier=float(threat.noise_multiplier),
                          delta=float(threat.delta), n_in=n_in, n_out=n_out,
                          confidence=confidence, refutation_level=refutation_level,
                          canary_norm=float(threat.sensitivity))


def data_rate_evidence(plan, threat: ThreatModel, scores_in, scores_out, **options):
    """The data-rate canaries' evidence (``stats.data_rate.DataRateEvidence``) with the
    threat model's claimed curves (PRV with its error bounds, ``ThreatModel.roc_curve``) as
    the noise multipliers' family and its accountant (``ThreatModel.estimated_epsilon``)
    converting sigma_upper: ``epsilon_lower`` certified for any mechanism,
    ``epsilon_within_family`` conditional on a Poisson-subsampled Gaussian. ``options`` go
    to ``DataRatePlan.evaluate`` (``sigma_rtol``, ``sigma_floor``)."""
    threat = _data_rate_threat(threat)

    def family_roc(sigma: float):
        return lambda alpha: threat.roc_curve(alpha, noise_multiplier=sigma)

    return plan.evaluate(scores_in, scores_out, family_roc=family_roc,
                         epsilon_of_sigma=threat.estimated_epsilon, **options)


def data_rate_ceiling(threat: ThreatModel, n_in: int, n_out: int, *,
                      confidence: float) -> dict:
    """What data-rate canaries can certify on a correct run of this claim: the count ceiling
    (the best pre-registered count test's median certified epsilon, exact;
    ``stats.data_rate.count_ceiling``) and an upper bound on any valid method's median
    (``universal_ceiling``), beside the claimed epsilon (PRV)."""
    from dpaudit.stats.data_rate import count_ceiling, mixture_score_law, universal_ceiling

    threat = _data_rate_threat(threat)
    law = mixture_score_law(int(threat.steps), float(threat.sample_rate),
                            float(threat.noise_multiplier), canary_norm=float(threat.sensitivity))
    c = count_ceiling(law, n_in, n_out, delta=float(threat.delta), confidence=confidence)
    u = universal_ceiling(law, n_in, n_out, confidence=confidence)
    claimed = threat.estimated_epsilon(threat.noise_multiplier)
    return {"claimed": claimed, "count_ceiling": c.epsilon, "count_step": c.step,
            "one_sided": c.one_sided, "universal_ceiling": u, "design": c.design.to_dict(),
            "kind": "exact, on the claimed mechanism's score law (no simulation)"}
