"""Random tie-breaking (``stats.ties``): order, ranks and reported values, and the bounds it
gives on tied scores (randomized response: tight, valid) against the old fixed-rank rule."""

import numpy as np
import pytest

from dpaudit.stats import Bonferroni, epsilon_lower_bound
from dpaudit.stats.claim import claim_test
from dpaudit.stats.ties import break_ties, has_ties, random_order


def test_no_ties_no_change():
    a, b = np.array([0.1, 0.5]), np.array([0.2, 0.3])
    assert not has_ties(a, b) and break_ties(a, b, 0) is None


def test_ranks_follow_scores_and_randomise_only_inside_tie_groups():
    s_in, s_out = np.array([0.0, 1.0, 1.0]), np.array([0.0, 1.0, 2.0])
    tb = break_ties(s_in, s_out, 3)
    pooled_ranks = np.r_[tb.ranks_in, tb.ranks_out]
    assert sorted(pooled_ranks.tolist()) == list(range(6))
    assert tb.values.tolist() == [0.0, 0.0, 1.0, 1.0, 1.0, 2.0]
    assert tb.ranks_out[-1] == 5  # the unique top score keeps its place
    # the value of a threshold between ranks r and r + 1 is the score at rank r
    assert tb.value([2.5, 0.0, np.inf]).tolist() == [1.0, 0.0, np.inf]
    # inside the group of 1s, which member comes first changes with the seed
    orders = {tuple(random_order(np.r_[s_in, s_out], s)) for s in range(50)}
    assert len(orders) > 1


def _rr(eps0, n, rng):
    q = np.exp(eps0) / (1 + np.exp(eps0))
    return (rng.random(n) < q).astype(float), (rng.random(n) < 1 - q).astype(float)


def test_randomized_response_is_seen_through_its_ties():
    # eps0 = 1, 1000 per side: the fixed ranks (0, 3, 15, 62, 249) all fall inside the tie
    # group of ~270 non-members at score 1, so the old rule certified 0; with random
    # tie-breaking the candidates split the group and certify close to eps0, never above it
    rng = np.random.default_rng(0)
    eps = []
    for _ in range(15):
        s_in, s_out = _rr(1.0, 1000, rng)
        b = epsilon_lower_bound(s_in, s_out, delta=1e-5, method="clopper_pearson")
        assert "ties broken at random" in b.details["selection"]
        assert b.threshold in (0.0, 1.0)  # reported on the user's scale
        eps.append(b.epsilon)
        perfect = claim_test(s_in, s_out, lambda a: 1.0 - np.asarray(a))
        assert perfect.rejected
    assert 0.75 <= np.median(eps) and max(eps) < 1.0


def test_tie_seed_is_validated_and_used():
    rng = np.random.default_rng(1)
    s_in, s_out = _rr(1.0, 500, rng)
    kw = {"delta": 1e-5, "method": "clopper_pearson"}
    a = epsilon_lower_bound(s_in, s_out, selection=Bonferroni(tie_seed=1), **kw).epsilon
    b = epsilon_lower_bound(s_in, s_out, selection=Bonferroni(tie_seed=1), **kw).epsilon
    assert a == b
    with pytest.raises(ValueError, match="tie_seed"):
        Bonferroni(tie_seed=0.5)
