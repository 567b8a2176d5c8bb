"""Exact draws of the data-rate canaries' summed mixture log-LR scores (the audit's score).

Each canary is an independent experiment (a coordinate of its own, DESIGN 4.5): a member's
per-step observation in units of the claimed noise is u_t = D b_t + tau z_t with b_t ~
Bernoulli(q_true) i.i.d. over steps, a non-member's is tau z_t. The score is sum_t l(u_t),
l(u) = log(1 - q_s + q_s exp(D_s u - D_s^2 / 2)) (``law.step_log_lr``, the hook's
``MixtureLR``). The sum does not depend on the order of the steps, so a member's steps are
drawn as "the first n_i steps carry the canary" with n_i ~ Binomial(T, q_true): the same law
as Bernoulli draws at every step, exactly, for a third of the random numbers. The T x K noise
is drawn in chunks of at most ``chunk`` numbers (default 4M: 32 MB), so 10^5 canaries at
T = 2,500 stay in bounded memory (5 s per 10^5 canaries at T = 2,500 on one core).
"""

from __future__ import annotations

import numpy as np

from dpaudit._validate import check_count, check_open_unit, check_positive
from dpaudit.stats.data_rate.law import step_log_lr


def simulate_mixture_scores(
    n_in: int,
    n_out: int,
    *,
    steps: int,
    sample_rate: float,
    noise_multiplier: float,
    rng: np.random.Generator,
    canary_norm: float = 1.0,
    true_rate: float | None = None,
    true_noise: float | None = None,
    chunk: int = 4_000_000,
) -> tuple[np.ndarray, np.ndarray]:
    """(member scores, non-member scores): ``n_in`` and ``n_out`` independent canaries.

    Args:
        n_in, n_out: members and non-members (each >= 0).
        steps, sample_rate, noise_multiplier, canary_norm: the claim the score uses (T, q,
            sigma, the canary's norm over C).
        rng: a seeded ``numpy.random.Generator`` (every draw comes from it).
        true_rate, true_noise: the mechanism that really ran (defaults: the claim), as in
            ``law.mixture_score_law``.
        chunk: the most noise draws held at once.
    """
    n_in, n_out = check_count(n_in, "n_in"), check_count(n_out, "n_out")
    steps = check_count(steps, "steps", 1)
    q = check_open_unit(sample_rate, "sample_rate")
    sigma = check_positive(noise_multiplier, "noise_multiplier")
    d = check_positive(canary_norm, "canary_norm") / sigma
    q_t = q if true_rate is None else float(true_rate)
    if not 0.0 <= q_t <= 1.0:
        raise ValueError(f"true_rate must lie in [0, 1], got {true_rate!r}")
    tau = 1.0 if true_noise is None else check_positive(true_noise, "true_noise") / sigma
    if not isinstance(rng, np.random.Generator):
        raise ValueError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
    rows = max(1, check_count(chunk, "chunk", 1) // steps)
    column = np.arange(steps)

    def draw(n: int, member: bool) -> np.ndarray:
        out = np.empty(n)
        for i in range(0, n, rows):
            m = min(rows, n - i)
            u = rng.standard_normal((m, steps))
            if tau != 1.0:
                u *= tau
            if member:
                included = rng.binomial(steps, q_t, m)
                u += d * (column[None, :] < included[:, None])
            out[i : i + m] = step_log_lr(u, q, d).sum(axis=1)
        return out

    return draw(n_in, True), draw(n_out, False)
