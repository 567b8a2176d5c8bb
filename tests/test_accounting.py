"""Accounting: Opacus' accountants, read correctly, and the mechanism's trade-off curves."""

import numpy as np
import pytest
import torch
from opacus import PrivacyEngine
from opacus.accountants import PRVAccountant, RDPAccountant

from dpaudit.accounting import (
    accountant_epsilon,
    all_accountants,
    engine_epsilons,
    gaussian_mechanism_epsilon,
    history_epsilon,
    prv_history_bounds,
    rdp_history_epsilon,
    sound_epsilon,
    subsampled_gaussian_tradeoff,
    tradeoff_from_profile,
)
from dpaudit.stats import gdp_delta, gdp_tradeoff

CONFIGS = [(1.0, 0.01, 1000), (0.8, 0.05, 200), (2.0, 0.1, 500), (1.5, 1.0, 10)]


@pytest.mark.parametrize("sigma,q,steps", CONFIGS)
def test_rdp_is_at_least_prv(sigma, q, steps):
    # RDP conversion is looser than PRV; PRV's own error is at most eps_error = 0.01.
    res = all_accountants(sigma, q, steps, 1e-5)
    assert res["rdp"].epsilon >= res["prv"].epsilon - 0.011
    assert res["gdp"].may_underestimate and not res["prv"].may_underestimate


@pytest.mark.parametrize("sigma,q,steps", CONFIGS[:2])
def test_values_match_opacus_called_directly(sigma, q, steps):
    rdp, prv = RDPAccountant(), PRVAccountant()
    for _ in range(steps):
        rdp.step(noise_multiplier=sigma, sample_rate=q)
        prv.step(noise_multiplier=sigma, sample_rate=q)
    assert accountant_epsilon(sigma, q, steps, 1e-5, "rdp").epsilon == rdp.get_epsilon(1e-5)
    assert accountant_epsilon(sigma, q, steps, 1e-5, "prv").epsilon == pytest.approx(
        prv.get_epsilon(1e-5), rel=1e-12
    )


def test_q1_prv_agrees_with_exact_gaussian_mechanism():
    # Non-subsampled: T steps of sigma are exactly sqrt(T)/sigma-GDP; PRV is within eps_error.
    exact = gaussian_mechanism_epsilon(2.0, 16, 1e-5)
    prv = accountant_epsilon(2.0, 1.0, 16, 1e-5, "prv").epsilon
    assert exact <= prv <= exact + 0.02


def test_engine_epsilons_reads_a_live_engine():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    data = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,)))
    loader = torch.utils.data.DataLoader(data, batch_size=16)
    engine = PrivacyEngine(accountant="prv")
    model, opt, loader = engine.make_private(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        data_loader=loader,
        noise_multiplier=1.1,
        max_grad_norm=1.0,
    )
    for x, y in loader:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    res = engine_epsilons(engine, 1e-5)
    assert res["prv"].epsilon == pytest.approx(engine.get_epsilon(1e-5), rel=1e-12)
    assert res["rdp"].epsilon == pytest.approx(
        accountant_epsilon(1.1, 0.25, 4, 1e-5, "rdp").epsilon, rel=1e-12
    )


def test_envelope_of_exact_gdp_profile_is_the_gdp_roc():
    # f-DP duality: the envelope over all (eps, delta(eps)) of mu-GDP is exactly G_mu.
    mu = 1.5
    eps = np.linspace(0, 12, 4000)
    deltas = np.array([gdp_delta(mu, e) for e in eps])
    alpha = np.array([1e-4, 1e-3, 1e-2, 0.1, 0.3, 0.7])
    np.testing.assert_allclose(
        tradeoff_from_profile(alpha, eps, deltas), gdp_tradeoff(alpha, mu), rtol=2e-3
    )


def test_subsampled_curve_at_q1_is_a_tight_upper_bound_of_gdp():
    alpha = np.array([1e-3, 1e-2, 0.1, 0.5])
    curve = subsampled_gaussian_tradeoff(alpha, 2.0, 1.0, 4)  # mu = sqrt(4)/2 = 1
    exact = gdp_tradeoff(alpha, 1.0)
    assert np.all(curve >= exact - 1e-12)
    np.testing.assert_allclose(curve, exact, rtol=0.02)


def test_subsampled_curve_lies_below_its_accountant_epsilon_lines():
    # The curve must respect the (eps, delta) that PRV certifies at delta = 1e-5.
    sigma, q, steps = 1.0, 0.01, 1000
    eps = accountant_epsilon(sigma, q, steps, 1e-5, "prv").epsilon
    alpha = np.logspace(-5, -0.1, 20)
    curve = subsampled_gaussian_tradeoff(alpha, sigma, q, steps)
    assert np.all(curve <= 1e-5 + np.exp(eps) * alpha + 1e-9)
    assert np.all(curve >= alpha)


@pytest.mark.parametrize(
    "kwargs,name",
    [
        ({"noise_multiplier": 0.0}, "noise_multiplier"),
        ({"sample_rate": 1.5}, "sample_rate"),
        ({"steps": -1}, "steps"),
        ({"delta": 1.0}, "delta"),
        ({"accountant": "moments"}, "accountant"),
    ],
)
def test_bad_input_names_the_parameter(kwargs, name):
    args = {"noise_multiplier": 1.0, "sample_rate": 0.1, "steps": 10, "delta": 1e-5}
    args.update(kwargs)
    with pytest.raises(ValueError, match=name):
        accountant_epsilon(**args)


def test_profile_domain_is_opacus_own_or_larger_and_the_profile_agrees():
    # the safe domain from a subset of Opacus' RDP orders (fast at q = 1/2) is at least the
    # one Opacus computes, with the same mesh; the profiles agree to rounding
    import warnings

    import numpy as np
    from opacus.accountants import PRVAccountant
    from opacus.accountants.analysis.prv import PoissonSubsampledGaussianPRV

    from dpaudit.accounting import _delta_upper, _safe_domain, discrete_prv

    sigma, q, steps, eps_error, delta_error = 1.0, 0.5, 50, 0.01, 1e-11
    acc = PRVAccountant()
    acc.history = [(sigma, q, steps)]
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        prvs = [PoissonSubsampledGaussianPRV(q, sigma)]
        theirs = acc._get_domain(prvs, [steps], eps_error, delta_error)
        ours = _safe_domain(sigma, q, steps, eps_error, delta_error)
        assert ours.t_max >= theirs.t_max and ours.t_min <= theirs.t_min
        assert ours.dt == pytest.approx(theirs.dt, rel=1e-12)
        eps = np.linspace(0.0, 20.0, 81)
        mine = _delta_upper(discrete_prv(sigma, q, steps, eps_error, delta_error), eps,
                            eps_error, delta_error)
        opacus = _delta_upper(acc._get_dprv(eps_error=eps_error, delta_error=delta_error), eps,
                              eps_error, delta_error)
    np.testing.assert_allclose(mine, opacus, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("sigma", [0.3, 0.6, 1.0, 2.0, 8.0])
@pytest.mark.parametrize("q,steps", [(0.01, 1000), (0.28, 36), (0.5, 100), (1.0, 10)])
def test_domain_rdp_epsilon_equals_all_domain_orders(sigma, q, steps):
    # the fractional orders below 2 are skipped unless the integers' best order is 2: the
    # epsilon must equal the one over every domain order (and so the domain is unchanged)
    import warnings

    from opacus.accountants.analysis.rdp import compute_rdp, get_privacy_spent

    from dpaudit.accounting import _DOMAIN_ORDERS, _rdp_epsilon

    for delta in (1e-11 / 4, 1e-11 / (8 * steps)):
        rdp = compute_rdp(q=q, noise_multiplier=sigma, steps=steps, orders=_DOMAIN_ORDERS)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            full = float(get_privacy_spent(orders=_DOMAIN_ORDERS, rdp=rdp, delta=delta)[0])
        assert _rdp_epsilon(sigma, q, steps, delta) == pytest.approx(full, rel=1e-12)


@pytest.mark.parametrize("sigma,q,steps", [(2.0, 1 / 3, 30), (6.9, 1 / 3, 30), (1.0, 0.5, 100),
                                           (0.8, 0.01, 1000), (3.0, 0.9, 20)])
def test_prv_epsilon_equals_opacus_prv_accountant(sigma, q, steps):
    from dpaudit.accounting import accountant_epsilon, prv_epsilon

    opacus = accountant_epsilon(sigma, q, steps, 1e-5, "prv").epsilon
    assert prv_epsilon(sigma, q, steps, 1e-5) == pytest.approx(opacus, rel=1e-6, abs=1e-9)


@pytest.mark.parametrize("sigma,q,steps", [(2.0, 1 / 3, 30), (1.0, 0.5, 100), (0.5, 0.5, 48),
                                           (20.0, 0.9, 5), (3.0, 0.05, 2000)])
def test_profile_roc_inverse_envelope_equals_every_line(sigma, q, steps):
    # the one-run claim test evaluates the inverse thousands of times: the hull of lines must
    # give the brute-force maximum, and never more (a larger inverse could refute a true claim)
    import numpy as np

    from dpaudit.accounting import (
        ProfileRocInverse,
        roc_inverse_from_profile,
        subsampled_gaussian_profile_grid,
    )

    e, d = subsampled_gaussian_profile_grid(sigma, q, steps)
    y = np.concatenate([np.linspace(0.0, 1.0, 20001),
                        np.random.default_rng(0).uniform(0.0, 1.0, 5000),
                        1.0 - np.geomspace(1e-16, 1e-3, 200), [1e-300]])
    brute, fast = roc_inverse_from_profile(y, e, d), ProfileRocInverse(e, d)(y)
    assert np.all(fast <= brute)
    np.testing.assert_allclose(fast, brute, rtol=1e-12, atol=0.0)


@pytest.mark.parametrize("sigma,q,steps", [(1.2, 0.048, 100), (0.6, 0.28, 36), (0.5, 0.5, 48),
                                           (0.3, 0.5, 100), (0.3, 0.01, 1000), (8.0, 0.5, 100),
                                           (1.0, 1.0, 10), (3.0, 0.05, 2000)])
def test_truncated_mean_equals_opacus_quadrature(sigma, q, steps):
    """The discretisation's continuous mean by vectorised Gauss-Legendre (or, where its two
    orders disagree, Opacus' own ``quad``) equals Opacus' ``mean`` within quad's tolerance:
    measured within 3.4e-8 (sigma 0.3, q 0.5; 1.5e-12 at the default audit's sigma 1.2)."""
    from opacus.accountants.analysis.prv import (
        PoissonSubsampledGaussianPRV,
        TruncatedPrivacyRandomVariable,
    )

    from dpaudit.accounting import _safe_domain, _truncated_mean

    domain = _safe_domain(sigma, q, steps, 0.01, 1e-8)
    with np.errstate(all="ignore"):
        prv = TruncatedPrivacyRandomVariable(PoissonSubsampledGaussianPRV(q, sigma),
                                             domain.t_min, domain.t_max)
        assert _truncated_mean(prv) == pytest.approx(prv.mean(), rel=1e-7, abs=1e-7)


HISTORIES = [
    [(0.883, 1 / 22, 88)],
    [(1.0, 0.05, 40), (0.9, 0.05, 8), (1.0, 0.05, 40)],  # a few steps with less noise
    [(0.82 + 0.01 * i, 0.048, 4) for i in range(8)],  # per-step multipliers, merged
    [(6.0, 0.0476, 100)],
]


@pytest.mark.parametrize("history", HISTORIES)
def test_prv_history_bounds_is_opacus_prv_accountant(history):
    """The heterogeneous PRV on one common, wider, FFT-friendly domain: Opacus' upper end to
    1e-8 (the domain's extra width only moves mass of order delta_error), its bracket around
    its estimate, within 2 eps_error and the delta error's width; RDP over the integer orders
    and the fractional ones near the best is Opacus' RDP (its best order is among them)."""
    acc = PRVAccountant()
    acc.history = [tuple(h) for h in history]
    lower, estimate, upper = prv_history_bounds(history, 1e-5)
    assert upper == pytest.approx(acc.get_epsilon(1e-5), rel=1e-8)
    assert lower < estimate < upper <= lower + 0.025
    rdp = history_epsilon(history, 1e-5, "rdp").epsilon
    assert rdp_history_epsilon(history, 1e-5) >= rdp * (1 - 1e-12)
    assert rdp_history_epsilon(history, 1e-5) == pytest.approx(rdp, rel=1e-9)
    # the order of the steps does not matter, and equal entries merge wherever they stand
    assert prv_history_bounds(history[::-1], 1e-5)[2] == pytest.approx(upper, rel=1e-9)


def test_sound_epsilon_refuses_gdp_and_names_bad_entries():
    assert sound_epsilon([(1.0, 0.05, 10)], 1e-5, "rdp") > sound_epsilon(
        [(1.0, 0.05, 10)], 1e-5, "prv")
    with pytest.raises(ValueError, match="GDP can underestimate"):
        sound_epsilon([(1.0, 0.05, 10)], 1e-5, "gdp")
    with pytest.raises(ValueError, match="noise multiplier"):
        prv_history_bounds([(0.0, 0.05, 10)], 1e-5)
    with pytest.raises(ValueError, match="sample rates"):
        prv_history_bounds([(1.0, 1.5, 10)], 1e-5)
    assert prv_history_bounds([], 1e-5) == (0.0, 0.0, 0.0)
