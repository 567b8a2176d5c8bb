"""Input canaries: examples added to the training data (seed 001 Algorithm 3).

Candidates from a source (mislabeled copies, blank images, held-out real examples, or crafted
one-hot images on features no training input uses, ``canaries.INPUT_SOURCES``) ranked by
Algorithm 3 at theta_0 and selected (top / easy / medium / hard / stratified / random).
Members are appended to the training set and pass through Opacus' clipping like any example;
the hook scores every canary. They realise the input-canary threat model at the data's
sample rate, and canaries trained together may influence each other's scores.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dpaudit.experiment.canary_designs.base import (
    BuildContext,
    CanaryDesign,
    CanarySetup,
    DesignContext,
    Realisation,
    tensors,
)

CANARY_SELECTIONS = ("top", "easy", "medium", "hard", "stratified", "random")
STRATA = 5  # selection=stratified: count / STRATA canaries from each score quintile


@dataclass(frozen=True)
class InputOptions:
    """``canary.source`` / ``selection`` / ``candidates`` / ``estimator`` / ``crafted_value``
    (the ``canary`` group's help says what each means)."""

    source: str = "mislabeled"
    selection: str = "top"
    candidates: int = 200
    estimator: str = "ledoit_wolf"
    crafted_value: float = 100.0


class InputDesign(CanaryDesign):
    """Input canaries (module doc)."""

    threat_kind = "input"
    Options = InputOptions
    refused_scores = {  # noqa: RUF012
        "mixture_lr": "it is the likelihood ratio of a gradient canary's per-step inclusion",
    }

    def check(self, options, ctx: DesignContext) -> None:
        count = ctx.count
        if options.selection == "stratified" and count % STRATA:
            raise ValueError(
                f"canary.count must be a multiple of {STRATA} with canary.selection=stratified "
                f"(count / {STRATA} canaries from each of {STRATA} score strata), got {count!r}"
            )

    def build(self, ctx: BuildContext) -> CanarySetup:
        return _build(ctx, ctx.options)

    def realises(self, options, ctx: DesignContext,
                 setup: CanarySetup | None = None) -> Realisation:
        """Input canaries, entering with the data at its rate; canaries trained together may
        influence each other's scores (never on dead coordinates, never sharing a run)."""
        return Realisation(kind=self.threat_kind,
                           on_dead_coordinates=None if setup is None else False)


def _candidates(o: InputOptions, train_set, num_classes, rng):
    """Candidate pool of ``canary.source`` and the training indices it consumed (held out of
    the base data)."""
    from dpaudit.canaries import INPUT_SOURCES

    x, y = tensors(train_set, np.arange(len(train_set)))
    source = INPUT_SOURCES[o.source]
    cand = source.make(x, y, num_classes, o.candidates, rng, o.crafted_value)
    return cand, np.asarray(cand.source) if source.held_out else np.array([], int)


def _build(ctx: BuildContext, o: InputOptions) -> CanarySetup:
    from torch.utils.data import ConcatDataset, Subset, TensorDataset

    from dpaudit.canaries import InputCandidates, rank_candidates, select_canaries
    from dpaudit.capture import InputCanaries
    from dpaudit.models import LOSS

    k, rng, train_set = ctx.count, ctx.rng, ctx.train_set
    num_classes = int(ctx.model(ctx.references[0][:1]).shape[1])
    cand, held_out = _candidates(o, train_set, num_classes, rng)
    cand = InputCandidates(cand.inputs.to(ctx.device), cand.targets.to(ctx.device), cand.kind,
                           cand.source)
    ranking = rank_candidates(
        ctx.model,
        ctx.references,
        (cand.inputs, cand.targets),
        LOSS,
        ctx.max_grad_norm,
        method=o.estimator,
        param_names=ctx.param_names,
        keep_grads=False,
    )
    if k > len(cand):
        fix = (
            "raise canary.candidates or lower canary.count"
            if len(cand) >= o.candidates
            else f"the {o.source} source makes at most {len(cand)} here, whatever "
            "canary.candidates says: lower canary.count or choose another canary.source"
        )
        raise ValueError(
            f"canary.count={k} is larger than the candidate pool ({len(cand)} "
            f"{o.source} candidates; {fix})"
        )
    if o.selection in ("easy", "medium", "hard"):
        if 3 * k > len(cand):
            raise ValueError(
                f"canary.selection={o.selection!r} with count={k} needs 3 x count = {3 * k} "
                f"candidates, the pool has {len(cand)}"
            )
        chosen = select_canaries(ranking.scores, "easy_medium_hard", k=k).by_label()[o.selection]
    elif o.selection == "random":
        chosen = rng.choice(len(cand), size=k, replace=False)
    elif o.selection == "stratified":  # count / STRATA at random from each score quantile
        chosen = select_canaries(
            ranking.scores, "stratified", k=k // STRATA, num_strata=STRATA, seed=rng
        ).indices
    else:
        chosen = select_canaries(ranking.scores, o.selection, k=k, seed=rng).indices
    chosen = np.asarray(chosen)
    picked = cand.subset(chosen)
    canaries = InputCanaries(picked.inputs, picked.targets, LOSS)
    base_idx = np.setdiff1d(np.arange(len(train_set)), held_out)
    member = ctx.membership
    members = TensorDataset(picked.inputs[member].cpu(), picked.targets[member].cpu())
    train = ConcatDataset([Subset(train_set, base_idx.tolist()), members])
    info = {
        "source": o.source,
        "selection": o.selection,
        "mahalanobis": ranking.scores[chosen].tolist(),
        "candidate_pool": len(cand),
    }
    return ctx.setup(canaries, train_set=train, n_base=len(base_idx), info=info,
                     candidate_scores=ranking.scores, chosen=chosen, selection=o.selection,
                     precision=ranking.precision)
