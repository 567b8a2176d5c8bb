"""GDP algebra: round trips over mu in [0.01, 20], delta down to 1e-10, and eps(delta) of the
Gaussian mechanism against an independent numerical integration of its privacy-loss law."""

import numpy as np
import pytest
from scipy import integrate, optimize, stats

from dpaudit.stats import gdp_delta, gdp_epsilon, gdp_mu, gdp_tradeoff

MUS = np.geomspace(0.01, 20.0, 12)
DELTAS = [1e-2, 1e-6, 1e-10]


@pytest.mark.parametrize("delta", DELTAS)
@pytest.mark.parametrize("mu", MUS)
def test_gdp_round_trip(mu, delta):
    eps = gdp_epsilon(mu, delta)
    if eps == 0.0:
        assert gdp_delta(mu, 0.0) <= delta
        return
    assert gdp_delta(mu, eps) == pytest.approx(delta, rel=1e-6)
    assert gdp_mu(eps, delta) == pytest.approx(mu, rel=1e-6)


def _delta_by_quadrature(mu: float, eps: float) -> float:
    """delta(eps) = E[(1 - e^(eps - L))_+], L ~ N(mu^2/2, mu^2) the Gaussian privacy loss."""
    loss = stats.norm(mu * mu / 2, mu)

    def f(x):
        return loss.pdf(x) * -np.expm1(eps - x)

    hi = max(eps, mu * mu / 2) + 12 * mu  # tail beyond is < 1e-30
    val, _ = integrate.quad(f, eps, hi, epsabs=0, epsrel=1e-10, limit=200)
    return val


@pytest.mark.parametrize("mu", [0.5, 1.0, 3.0, 8.0])
@pytest.mark.parametrize("delta", [1e-3, 1e-6, 1e-10])
def test_gaussian_eps_matches_independent_integration(mu, delta):
    got = gdp_epsilon(mu, delta)
    # Only the bracket uses the closed form; the root itself comes from the quadrature.
    lo, hi = max(0.9 * got - 1e-3, 1e-9), 1.1 * got + 1e-3
    ref = optimize.brentq(
        lambda e: np.log(_delta_by_quadrature(mu, e)) - np.log(delta), lo, hi, xtol=1e-12
    )
    assert got == pytest.approx(ref, rel=1e-6, abs=1e-8)


def test_tradeoff_is_phi_of_z_plus_mu():
    a = np.array([1e-6, 0.01, 0.5, 0.99])
    np.testing.assert_allclose(
        gdp_tradeoff(a, 1.5), stats.norm.cdf(stats.norm.ppf(a) + 1.5), rtol=1e-12
    )


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda: gdp_epsilon(1.0, 0.0), "delta"),
        (lambda: gdp_epsilon(1.0, 1.0), "delta"),
        (lambda: gdp_epsilon(-1.0, 1e-5), "mu"),
        (lambda: gdp_delta(1.0, -1.0), "epsilon"),
    ],
)
def test_gdp_bad_input(call, name):
    with pytest.raises(ValueError, match=name):
        call()
