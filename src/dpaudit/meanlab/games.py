"""Membership games on the mean mechanisms: fixed target (seed 001 Algs. 1-2) and average target.

A game draws the membership bits, samples every round's output in vectorised chunks, and
scores them; it returns the bits and one score array per named score. A seed (or Generator)
makes the whole game reproducible.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from dpaudit._validate import require_known
from dpaudit.meanlab import scores as sc
from dpaudit.meanlab.distributions import ProductDistribution, as_target
from dpaudit.meanlab.mechanisms import (
    ExactMean,
    NoisyMean,
    PoissonSubsampledMean,
    SubsampledMean,
)
from dpaudit.seeds import as_generator

ScoreFn = Callable[[np.ndarray, np.ndarray], np.ndarray]


@dataclass(frozen=True)
class GameResult:
    """Membership bits (rounds,), scores by name (rounds,), optionally outputs/targets."""

    members: np.ndarray
    scores: dict[str, np.ndarray]
    outputs: np.ndarray | None = None
    targets: np.ndarray | None = None

    def split(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """(scores_in, scores_out) of the named score."""
        require_known("score", [name], self.scores)
        s = self.scores[name]
        return s[self.members], s[~self.members]


def membership_bits(rounds: int, rng, balanced: bool = False) -> np.ndarray:
    """b_t ~ Bernoulli(1/2) i.i.d. (Algorithm 1), or exactly half in random order."""
    rounds = int(rounds)
    if rounds < 2:
        raise ValueError(f"rounds must be >= 2, got {rounds}")
    rng = as_generator(rng, "rng")
    if balanced:
        b = np.arange(rounds) < rounds // 2
        return rng.permutation(b)
    return rng.random(rounds) < 0.5


def oracle_score(dist: ProductDistribution, mechanism) -> ScoreFn:
    """The papers' approximate LR for each mechanism, with the true (mu, C).

    Exact/noisy: Eq. 5 with C + C_gamma. Sub-sampled "independent": sum_j W_{n,j}
    (Lemma C.11). Sub-sampled "shared" and Poisson: the shared-event LR with k rows
    (for Poisson with normalise="expected" the random batch size shifts the output by
    mu (K - qn)/(qn), which this score ignores: it is then a valid but not optimal score).
    """
    mu, var = dist.mean, dist.var
    if isinstance(mechanism, ExactMean | NoisyMean):
        nv = mechanism.noise_var(dist)
        return lambda o, z: sc.oracle_lr(o, z, mu, var, mechanism.n, nv)
    if isinstance(mechanism, SubsampledMean):
        if mechanism.mode == "independent":
            return lambda o, z: sc.subsampled_lr_paper(o, z, mu, var, mechanism.n, mechanism.rho)
        return lambda o, z: sc.subsampled_lr_shared(o, z, mu, var, mechanism.k, mechanism.rate)
    if isinstance(mechanism, PoissonSubsampledMean):
        k = mechanism.q * mechanism.n
        return lambda o, z: sc.subsampled_lr_shared(o, z, mu, var, k, mechanism.q)
    raise ValueError(f"no oracle score for mechanism {type(mechanism).__name__}")


def _run(dist, mechanism, members, target_of, scores, score_target, rng, chunk, keep):
    rounds = members.size
    out = {name: np.empty(rounds) for name in scores}
    kept = np.empty((rounds, dist.d)) if keep else None
    for lo in range(0, rounds, chunk):
        hi = min(lo + chunk, rounds)
        z = target_of(lo, hi)
        o = mechanism.sample(dist, z, members[lo:hi], rng)
        zs = z if score_target is None else score_target
        for name, fn in scores.items():
            s = np.asarray(fn(o, zs), dtype=np.float64)
            if s.shape != (hi - lo,):
                raise ValueError(f"score {name!r} returned shape {s.shape}, expected {(hi - lo,)}")
            out[name][lo:hi] = s
        if keep:
            kept[lo:hi] = o
    return out, kept


def _check_scores(scores) -> Mapping[str, ScoreFn]:
    if not isinstance(scores, Mapping) or not scores:
        raise ValueError("scores must be a non-empty mapping name -> fn(outputs, target)")
    return scores


def fixed_target_game(
    dist: ProductDistribution,
    mechanism,
    target,
    rounds: int,
    scores: Mapping[str, ScoreFn] | None = None,
    seed: int | np.random.Generator = 0,
    *,
    score_target=None,
    balanced: bool = False,
    chunk: int = 500,
    keep_outputs: bool = False,
) -> GameResult:
    """Fixed-target MI game: the same z* in every round; b_t ~ Bern(1/2) (or balanced).

    ``scores`` default to {"lr": oracle_score(dist, mechanism)}. With ``score_target`` the
    scores see z_targ instead of z* (the misspecified adversary of Thm 4.3).
    """
    rng = as_generator(seed)
    z = as_target(dist, target)
    zt = None if score_target is None else as_target(dist, score_target)
    scores = _check_scores(scores if scores is not None else {"lr": oracle_score(dist, mechanism)})
    if int(chunk) < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    members = membership_bits(rounds, rng, balanced)
    out, kept = _run(
        dist, mechanism, members, lambda lo, hi: z, scores, zt, rng, int(chunk), keep_outputs
    )
    return GameResult(members, out, kept)


def average_target_game(
    dist: ProductDistribution,
    mechanism,
    rounds: int,
    scores: Mapping[str, ScoreFn] | None = None,
    seed: int | np.random.Generator = 0,
    *,
    balanced: bool = False,
    chunk: int = 500,
    keep_outputs: bool = False,
) -> GameResult:
    """Average-target game (Yeom et al.; seed 001 App. B.1): a fresh z ~ D every round.

    Under b = 1 the target replaces one row of the dataset; under b = 0 it is an independent
    draw. The per-round targets are returned in ``targets``.
    """
    rng = as_generator(seed)
    scores = _check_scores(scores if scores is not None else {"lr": oracle_score(dist, mechanism)})
    if int(chunk) < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    members = membership_bits(rounds, rng, balanced)
    targets = dist.sample(rng, members.size)
    out, kept = _run(
        dist,
        mechanism,
        members,
        lambda lo, hi: targets[lo:hi],
        scores,
        None,
        rng,
        int(chunk),
        keep_outputs,
    )
    return GameResult(members, out, kept, targets)
