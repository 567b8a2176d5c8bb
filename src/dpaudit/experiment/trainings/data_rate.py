"""Canaries inserted like an example beside the audited ones, in the CLI's one-run audits: the
certified lower side of the user's epsilon (DESIGN 4.5, "the user's epsilon, from both sides").

The audited canaries (the design's: e.g. 1,000 every-step Dirac canaries on dead first-layer
weights, the mechanism's stress test) realise another threat model than the training data's.
Beside them, ``canary.lower_side`` = N adds N member and N non-member Dirac gradient canaries
that realise the data's own: each on its own coordinate of a canary block of 2N parameters
that no data gradient can reach (``capture.add_canary_block``, added to the training's model
before ``make_private``), of norm C, each member entering a step with probability q (the
data's rate, drawn per step from its own seeded stream), non-members never; the step clips
and noises them like an example. Scored by the summed per-step mixture log-likelihood ratio
at q (``MixtureLR``, their optimal test), they are the input of ``judging.lower_side``.

Wiring them into the hook without touching the audited set: the hook's parameter selection is
the audited one plus the block's weight (the block is the model's last submodule, so its
coordinates come after every selected one and the audited numbering is unchanged), and its
coordinate view is the audited view followed by the block's 2N coordinates; the audited
canaries keep their positions (0 .. K-1) in a view of K + 2N columns, the data-rate set takes
positions K .. K + 2N - 1. Their score is computed for every canary (O(K + 2N) per step) and
kept for the data-rate set only; the audited scores are kept for the audited set only.

Their statements count only when the hook saw them independent (``capture.independence.
seen_independent``: the data's clipped sum exactly zero on the block at every step); the run
record keeps the scores, the membership, the threat model and that finding
(``DataRateRecord``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dpaudit import seeds
from dpaudit.threat_model import ThreatModel

SCORE = "data_rate_mixture_lr"  # the hook's name of their score (beside the audited scores)


@dataclass(frozen=True)
class DataRateDesign:
    """A run's canaries inserted like an example, fixed from the plan before training:
    ``per_side`` members and as many non-members (``membership``: 2 ``per_side`` booleans in
    the block's coordinate order, exactly ``per_side`` True), of norm ``norm`` (C), each member
    entering a step with probability ``sample_rate`` (the data's q), drawn from the stream
    ``inclusion_seed``."""

    per_side: int
    membership: np.ndarray
    sample_rate: float
    norm: float
    inclusion_seed: tuple[int, int]

    @property
    def size(self) -> int:
        """The canary block's size: one coordinate per canary."""
        return 2 * self.per_side


def data_rate_design(per_side: int, seed: int, sample_rate: float,
                     norm: float) -> DataRateDesign | None:
    """The ``DataRateDesign`` of ``per_side`` canaries per side (None when 0): which block
    coordinates are members, a seeded permutation (``seeds.DATA_RATE_MEMBERSHIP``), so that
    each side has exactly ``per_side`` canaries."""
    if per_side <= 0:
        return None
    order = seeds.stream(seed, seeds.DATA_RATE_MEMBERSHIP).permutation(2 * per_side)
    member = np.zeros(2 * per_side, dtype=bool)
    member[order[:per_side]] = True
    return DataRateDesign(int(per_side), member, float(sample_rate), float(norm),
                          (int(seed), seeds.DATA_RATE_INCLUSION))


def add_block(model, design: DataRateDesign):
    """The canary block of ``design`` added to ``model`` (before ``make_private`` and before the
    optimizer is built: ``capture.add_canary_block``)."""
    from dpaudit.capture import add_canary_block

    return add_canary_block(model, design.size)


def hook_inputs(model, design: DataRateDesign, canaries, params: list[str], coordinates):
    """The hook's (parameter selection, coordinate view, canary sets) with the data-rate set
    beside the audited ``canaries`` (module doc). ``model``: the model with the block (wrapped
    by Opacus or not); ``params``: the audited selection (names, without the block);
    ``coordinates``: the audited view (indices into that selection; required: the audited
    canaries must be sparse in their own view)."""
    from dpaudit.capture import GradientCanaries
    from dpaudit.capture.canary_block import NAME
    from dpaudit.gradients.persample import unwrap_model

    if coordinates is None or not isinstance(canaries, GradientCanaries) or not canaries.is_sparse:
        raise ValueError("canary.lower_side: the audited canaries must be sparse gradient "
                         "canaries in a coordinate view of their own (canary.view=auto)")
    named = dict(unwrap_model(model).named_parameters())
    block = f"{NAME}.linear.weight"
    if list(named)[-1] != block:
        raise ValueError("canary.lower_side: the canary block must be the model's last "
                         "parameter (add it right before make_private)")
    offset = sum(named[n].numel() for n in params)  # the block's first selection coordinate
    view = np.concatenate([np.asarray(coordinates, dtype=np.int64),
                           offset + np.arange(design.size, dtype=np.int64)])
    k = len(canaries)
    dim = k + design.size
    audited = GradientCanaries.sparse(
        canaries.indices, canaries.values, dim, policy=list(canaries.policies),
        inclusion_prob=canaries.inclusion_prob, seed=canaries.seed)
    rate = GradientCanaries.dirac(
        np.arange(k, dim), design.norm, dim,
        policy=["bernoulli" if m else "never" for m in design.membership],
        inclusion_prob=design.sample_rate, seed=list(design.inclusion_seed),
        dtype=canaries.dtype)
    return [*params, block], view, [audited, rate]


def mixture_score(design: DataRateDesign):
    """Their score: the per-step mixture log-LR at the data's q, named ``SCORE``."""
    from dpaudit.attacks import MixtureLR

    score = MixtureLR(inclusion_prob=design.sample_rate)
    score.name = SCORE
    return score


@dataclass
class DataRateRecord:
    """What a run keeps of its canaries inserted like an example (a run file's ``data_rate``):
    their summed mixture log-LR ``scores`` and ``membership`` (1: member) in the block's
    coordinate order, their ``threat_model`` (Poisson at the data's q, norm C: the training
    data's), whether the hook saw them stay ``independent`` experiments and why (not)
    (``independence``)."""

    scores: list[float]
    membership: list[int]
    threat_model: ThreatModel
    independent: bool
    independence: str

    def split(self) -> tuple[np.ndarray, np.ndarray]:
        """(member scores, non-member scores)."""
        s = np.asarray(self.scores, dtype=np.float64)
        m = np.asarray(self.membership, dtype=bool)
        return s[m], s[~m]

    def to_dict(self) -> dict:
        return {"score": "mixture_lr", "scores": list(self.scores),
                "membership": list(self.membership),
                "threat_model": self.threat_model.to_dict(), "independent": self.independent,
                "independence": self.independence}

    @classmethod
    def from_dict(cls, d, where: str = "") -> DataRateRecord:
        """Rebuild from ``to_dict()``; a ValueError names ``where`` and what is wrong."""
        if not isinstance(d, dict):
            raise ValueError(f"{where}data_rate must be an object, got {type(d).__name__}")
        missing = [k for k in ("scores", "membership", "threat_model", "independent",
                               "independence") if k not in d]
        if missing:
            raise ValueError(f"{where}data_rate lacks {missing}")
        scores, member = d["scores"], d["membership"]
        if (not isinstance(scores, list) or not isinstance(member, list)
                or len(scores) != len(member)):
            raise ValueError(f"{where}data_rate's scores and membership must be lists of one "
                             "length")
        try:
            threat = ThreatModel.from_dict(d["threat_model"])
        except (TypeError, ValueError) as err:
            raise ValueError(f"{where}data_rate's threat_model: {err}") from err
        return cls([float(s) for s in scores], [int(m) for m in member], threat,
                   bool(d["independent"]), str(d["independence"]))
