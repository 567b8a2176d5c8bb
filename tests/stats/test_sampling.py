"""The sampling tests (``stats.sampling``): the Chernoff spread bounds dominate the exact tail on
a law small enough to enumerate, Kearns & Saul's variance proxy bounds the Bernoulli moment
generating function, simulated Poisson sampling is rejected at most at the stated level (with
the overlap sketch's collisions many or few), and each bug class of the sampling (replayed
passes, shuffled passes, duplicated draws, fixed-size batches) is refuted and named."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy.stats import binom

from dpaudit.stats.sampling import (
    describe_sampling,
    poisson_sampling_test,
    sampling_by_example_test,
    spread_tails,
    subgaussian_variance,
)

N, Q, T = 1348, 1 / 21, 100  # the default audit's data set, rate and steps


def _limit(level: float, runs: int) -> float:
    """Rejection rate a valid level-``level`` test stays under in ``runs`` runs (3 s.e.)."""
    return level + 3.0 * np.sqrt(level * (1 - level) / runs)


def sketch(batches, n, m=256, seed=0):
    """What the hook records of ``batches`` (index arrays): counts, sizes, count sketches,
    bucket sizes and sign sums, set hashes (an independent re-implementation)."""
    rng = np.random.default_rng([seed, 99])
    bucket, sign = rng.integers(0, m, n), rng.choice([-1.0, 1.0], n)
    keys = rng.integers(0, 2**62, n, dtype=np.uint64)
    counts = np.zeros(n, dtype=int)
    for b in batches:
        np.add.at(counts, b, 1)
    sig = np.stack([np.bincount(bucket[b], weights=sign[b], minlength=m) for b in batches])
    hashes = np.array([int(keys[b].sum(dtype=np.uint64)) for b in batches], dtype=np.uint64)
    return dict(counts=counts, sizes=np.array([len(b) for b in batches]), signatures=sig,
                bucket_sizes=np.bincount(bucket, minlength=m),
                bucket_signed=np.bincount(bucket, weights=sign, minlength=m),
                set_hashes=hashes)


def poisson(n, q, t, rng):
    return [np.flatnonzero(rng.random(n) < q) for _ in range(t)]


def shuffled(n, q, t, rng, binomial=True):
    """Passes of a random permutation cut into Binomial(n, q) (or fixed n q) sized batches."""
    out, perm, pos = [], rng.permutation(n), 0
    size = round(n * q)
    for _ in range(t):
        k = rng.binomial(n, q) if binomial else size
        if pos + k > n:
            rest = perm[pos:]
            perm, pos = rng.permutation(n), k - len(rest)
            out.append(np.concatenate([rest, perm[:pos]]))
        else:
            out.append(perm[pos : pos + k])
            pos += k
    return out


def test_spread_tails_dominate_the_exact_tail():
    # V = sum of 3 squared deviations of Binomial(4, 0.3): its exact law by enumeration
    n, q, m = 4, 0.3, 3
    pmf = binom.pmf(np.arange(n + 1), n, q)
    law: dict[float, float] = {}
    for ks in itertools.product(range(n + 1), repeat=m):
        v = round(sum((k - n * q) ** 2 for k in ks), 9)
        law[v] = law.get(v, 0.0) + float(np.prod(pmf[list(ks)]))
    values = np.array(sorted(law))
    probs = np.array([law[v] for v in values])
    for ks in itertools.product(range(n + 1), repeat=m):
        v = round(sum((k - n * q) ** 2 for k in ks), 9)
        low, high = spread_tails(ks, n, q)
        assert low >= probs[values <= v + 1e-9].sum() - 1e-12
        assert high >= probs[values >= v - 1e-9].sum() - 1e-12


@pytest.mark.parametrize("q", [0.01, 0.05, 0.3, 0.5, 0.8])
def test_the_bernoulli_variance_proxy_bounds_its_mgf(q):
    s = subgaussian_variance(q)
    lam = np.linspace(-60, 60, 2401)
    log_mgf = np.log((1 - q) * np.exp(-lam * q) + q * np.exp(lam * (1 - q)))
    assert np.all(log_mgf <= lam**2 * s / 2 + 1e-12)
    # and it is the smallest such proxy (to the grid's resolution): Kearns & Saul's optimum
    nz = lam != 0
    assert np.max(2 * log_mgf[nz] / lam[nz] ** 2) == pytest.approx(s, rel=2e-2)


@pytest.mark.slow
@pytest.mark.parametrize("m", [256, 8])  # many buckets, or few (many collisions)
def test_poisson_sampling_is_rejected_at_most_at_the_level(m):
    rng = np.random.default_rng(m)
    runs, level = 400, 0.05
    p = np.array([sampling_by_example_test(**sketch(poisson(300, 0.05, 60, rng), 300, m, i),
                                           q=0.05, level=level).p_value for i in range(runs)])
    assert np.mean(p < level) <= _limit(level, runs)


def test_poisson_sampling_passes_and_sizes_keep_their_level():
    rng = np.random.default_rng(0)
    runs, level = 200, 0.05
    rej = [sampling_by_example_test(**sketch(poisson(N, Q, T, rng), N, seed=i), q=Q,
                                    level=level).rejected for i in range(40)]
    assert sum(rej) == 0  # conservative: a valid test, far below its level here
    sizes = [poisson_sampling_test(rng.binomial(N, Q, T), N, Q, level=level).rejected
             for _ in range(runs)]
    assert np.mean(sizes) <= _limit(level, runs)


def test_replayed_passes_are_refuted_and_named():
    rng = np.random.default_rng(1)
    first = poisson(N, Q, 21, rng)
    res = sampling_by_example_test(**sketch([first[t % 21] for t in range(T)], N), q=Q,
                                   level=1e-7)
    assert res.rejected and res.p_value < 1e-100
    seen = res.details["sampling_seen"]
    assert seen["kind"] == "replayed batches" and seen["period"] == 21
    # one pass in five replayed: the batches 21 steps apart share examples
    batches = poisson(N, Q, T, rng)
    batches[84:] = batches[63:79]
    res = sampling_by_example_test(**sketch(batches, N), q=Q, level=1e-7)
    assert res.rejected and res.witness["failed"] == "overlap" and res.witness["lag"] == 21


@pytest.mark.parametrize("binomial", [True, False])
def test_shuffled_passes_are_refuted_and_named(binomial):
    rng = np.random.default_rng(2)
    res = sampling_by_example_test(**sketch(shuffled(N, Q, T, rng, binomial), N), q=Q,
                                   level=1e-7)
    assert res.rejected and res.witness["failed"] == "participation too regular"
    kind = res.details["sampling_seen"]["kind"]
    assert kind == ("shuffled passes" if binomial else "shuffled passes of fixed-size batches")
    # one pass in five shuffled: the counts are still too regular
    batches = poisson(N, Q, T, rng)
    batches[40:60] = shuffled(N, Q, 20, rng)
    res = sampling_by_example_test(**sketch(batches, N), q=Q, level=1e-7)
    assert res.rejected and res.witness["failed"] == "participation too regular"


def test_duplicated_draws_spread_the_sizes_and_are_named():
    rng = np.random.default_rng(3)
    batches = [np.repeat(b, 2) for b in poisson(N, Q / 2, T, rng)]
    sizes = poisson_sampling_test([len(b) for b in batches], N, Q, level=1e-4)
    assert sizes.rejected and sizes.witness["failed"] == "spread"
    seen = describe_sampling(sketch(batches, N)["counts"], [len(b) for b in batches], Q,
                             duplicate_batches=T)
    assert seen["kind"] == "duplicated examples"


def test_fixed_size_batches_are_named():
    rng = np.random.default_rng(4)
    batches = [rng.choice(N, 64, replace=False) for _ in range(T)]
    s = sketch(batches, N)
    assert describe_sampling(s["counts"], s["sizes"], Q)["kind"] == "fixed-size batches"
    ok = sketch(poisson(N, Q, T, rng), N)
    assert describe_sampling(ok["counts"], ok["sizes"], Q)["kind"] == "poisson"


def test_sampling_arguments_must_describe_one_run():
    s = sketch(poisson(50, 0.2, 5, np.random.default_rng(5)), 50)
    with pytest.raises(ValueError, match="disagree"):
        sampling_by_example_test(**{**s, "counts": s["counts"] * 0}, q=0.2, level=0.05)


def test_ranks_drawing_alike_are_refuted_and_independent_ranks_are_not():
    from dpaudit.stats.sampling import ranks_alike_test

    rng = np.random.default_rng(6)
    shard, q, t = 320, 0.05, 30
    alike = rng.binomial(shard, q, t)
    p, witness = ranks_alike_test(np.stack([alike, alike], axis=1), [shard, shard], q)
    assert p < 1e-20 and witness["equal_steps"] == t
    runs = 300
    rejected = [ranks_alike_test(rng.binomial(shard, q, (t, 3)), [shard] * 3, q)[0] < 0.05
                for _ in range(runs)]
    assert np.mean(rejected) <= _limit(0.05, runs)
