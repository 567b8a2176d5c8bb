"""Canaries and their membership for one audit (DESIGN 3, steps 2-3).

Gradient canaries: Dirac vectors on the coordinates where the mean absolute clipped gradient
of the training data at theta_0 is smallest (exactly zero on, e.g., weights of pixels that are
blank in every image: 3 pixels x 10 classes on digits logreg, 3 x width first-layer weights of
an MLP), or random directions; norm <= C. Members are inserted by the hook (every step, or
Bernoulli(q_c) per step); non-members are only scored. ``canary.view="auto"`` records and
scores Dirac canaries in the coordinate view of their own coordinates, so K = 10^4 canaries
cost O(K^2) per step, not O(K d); a warning says when K exceeds the dead coordinates.

Input canaries: candidates (mislabeled copies, blank images, held-out real examples, or crafted
one-hot images on features no training input uses, see ``crafted_inputs``) ranked
by seed 001 Algorithm 3 at theta_0 and selected (top / easy / medium / hard / stratified /
random). Members are appended to the training set; the hook scores every canary.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn
from torch.utils.data import ConcatDataset, Dataset, Subset, TensorDataset

from dpaudit import seeds
from dpaudit.canaries import (
    INPUT_SOURCES,
    InputCandidates,
    random_direction_canaries,
    rank_candidates,
    select_canaries,
)
from dpaudit.capture import GradientCanaries, InputCanaries
from dpaudit.capture.gradient_canaries import NORM_SLACK
from dpaudit.covariance import PrecisionOperator
from dpaudit.experiment.settings import STRATA, AuditSettings
from dpaudit.experiment.trainings.threat import canary_sample_rate
from dpaudit.gradients import per_sample_clipped_grads, resolve_parameter_names

LOSS = nn.functional.cross_entropy


@dataclass
class CanarySetup:
    """The canaries of one run, who is a member, and the data the model trains on."""

    canaries: GradientCanaries | InputCanaries
    membership: np.ndarray
    train_set: Dataset
    param_names: list[str]
    references: tuple[torch.Tensor, torch.Tensor]
    inclusion_prob: float | None = None
    n_base: int = 0  # training examples besides the canaries (same in every run)
    info: dict = field(default_factory=dict)
    candidate_scores: np.ndarray | None = None
    chosen: np.ndarray | None = None
    coordinates: np.ndarray | None = None  # the hook's coordinate view (None: full selection)
    precision: PrecisionOperator | None = None  # Algorithm 3's reference estimator (input)


def _tensors(ds: Dataset, idx: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    xs, ys = zip(*(ds[int(i)] for i in idx), strict=True)
    return torch.stack(xs), torch.stack([torch.as_tensor(y) for y in ys])


def draw_membership(count: int, inclusion: float, seed: int) -> np.ndarray:
    """Independent Bernoulli(inclusion) membership bits, one per canary (one-run audits)."""
    rng = seeds.stream(seed, seeds.MEMBERSHIP)
    return rng.random(count) < inclusion


def setup_canaries(
    settings: AuditSettings,
    model: nn.Module,
    train_set: Dataset,
    sample_rate: float,
    membership: np.ndarray | None = None,
) -> CanarySetup:
    """Build the canaries of ``settings.canary`` at the model's current (initial) parameters."""
    c, seed = settings.canary, settings.seed
    device = next(model.parameters()).device
    rng = seeds.stream(seed, seeds.CANARY_SETUP)
    n = len(train_set)
    n_ref = min(c.n_references, n)
    ref_idx = rng.choice(n, size=n_ref, replace=False)
    references = tuple(t.to(device) for t in _tensors(train_set, ref_idx))
    params = resolve_parameter_names(model, c.params)
    C = settings.dp.max_grad_norm
    if membership is None:
        membership = draw_membership(c.count, settings.audit.inclusion, seed)
    if len(membership) != c.count:
        raise ValueError(f"membership has {len(membership)} bits for canary.count={c.count}")
    if c.kind == "gradient":
        return _gradient(settings, model, train_set, references, params, sample_rate, membership)
    return _input(settings, model, train_set, references, params, membership, rng, device, C)


def _gradient(settings, model, train_set, references, params, sample_rate, membership):
    c, C = settings.canary, settings.dp.max_grad_norm
    norm = C if c.norm is None else float(c.norm)
    if norm > C * (1 + NORM_SLACK):
        raise ValueError(
            f"canary.norm={norm} exceeds the clip norm dp.max_grad_norm={C}: such a canary "
            "is not a valid neighbouring record and can exceed the true epsilon"
        )
    ref_grads = per_sample_clipped_grads(model, *references, LOSS, C, param_names=params)
    dim = ref_grads.shape[1]
    if c.count > dim:
        raise ValueError(
            f"canary.count={c.count} is larger than the candidate pool: the selected "
            f"parameters {params} have only {dim} coordinates"
        )
    info: dict = {"dim": dim, "norm": norm, "view": "full"}
    view = None
    if c.direction == "dirac":
        activity = data_gradient_activity(model, train_set, C, params)
        tiebreak = seeds.stream(settings.seed, seeds.DIRAC_TIEBREAK).random(dim)
        dead = int((activity == 0).sum())
        if c.placement == "random_live":
            live = np.flatnonzero(activity > 0)
            if c.count > len(live):
                raise ValueError(
                    f"canary.count={c.count} exceeds the {len(live)} live coordinates of "
                    f"{params} (canary.placement=random_live): lower canary.count"
                )
            pick = seeds.stream(settings.seed, seeds.LIVE_PLACEMENT).choice(
                len(live), c.count, False
            )
            coords = np.sort(live[pick])
        else:
            coords = np.lexsort((tiebreak, activity))[: c.count]
        if c.count > dead and c.placement == "least_active":
            warnings.warn(
                f"canary.count={c.count} exceeds the {dead} coordinates whose data gradient is "
                f"exactly zero at theta_0 (parameters {params}): {c.count - dead} Dirac canaries "
                "sit on coordinates the data touch and the audit is looser; lower canary.count "
                "or use a model with more dead coordinates (e.g. model=mlp, larger model.width)",
                stacklevel=2,
            )
        if c.view == "auto":
            view = coords
            vectors = norm * torch.eye(c.count, dtype=ref_grads.dtype, device=ref_grads.device)
            info["view"] = "auto"
        else:
            vectors = torch.zeros(c.count, dim, dtype=ref_grads.dtype, device=ref_grads.device)
            vectors[torch.arange(c.count), torch.as_tensor(coords, device=vectors.device)] = norm
        info["coordinates"] = coords.tolist()
        info["data_gradient_activity_max"] = float(activity[coords].max())
        info["zero_gradient_coordinates"] = dead
        info["canaries_on_zero_gradient_coordinates"] = int((activity[coords] == 0).sum())
        # where the released gradient is noise plus canaries only: the noise probes of the
        # white-box checks (coordinates of the selection, e.g. weights of always-blank pixels)
        info["noise_probes"] = np.sort(coords[activity[coords] == 0]).tolist()
    else:
        vectors = random_direction_canaries(dim=dim, num=c.count, norm=norm, seed=settings.seed)
        vectors = vectors.to(ref_grads.device, ref_grads.dtype)
    # Bernoulli canaries enter a step with the threat model's canary sample rate (one rule,
    # ``threat.canary_sample_rate``; the data's q here: gradient canaries leave the data as is).
    q_c = canary_sample_rate(settings, sample_rate) if c.policy == "bernoulli" else None
    policies = [c.policy if b else "never" for b in membership]
    inclusion_seed = [settings.seed, seeds.BERNOULLI_INCLUSION]
    canaries = GradientCanaries(vectors, policy=policies, inclusion_prob=q_c, seed=inclusion_seed)
    return CanarySetup(
        canaries,
        membership,
        train_set,
        params,
        references,
        q_c,
        len(train_set),
        info,
        coordinates=view,
    )


def data_gradient_activity(
    model: nn.Module, train_set: Dataset, max_grad_norm: float, params: list[str], chunk: int = 512
) -> np.ndarray:
    """(d,) mean |clipped per-example gradient| of the whole training set at the current
    parameters, coordinate by coordinate (exactly 0 where no example's gradient reaches)."""
    device = next(model.parameters()).device
    total = None
    n = len(train_set)
    for start in range(0, n, chunk):
        x, y = _tensors(train_set, np.arange(start, min(n, start + chunk)))
        g = per_sample_clipped_grads(
            model, x.to(device), y.to(device), LOSS, max_grad_norm, param_names=params
        )
        part = g.abs_().sum(0).double()  # in place (g is ours): exact zeros stay exact
        total = part if total is None else total + part
    return (total / n).cpu().numpy()


def _candidates(c, train_set, num_classes, rng) -> tuple[InputCandidates, np.ndarray]:
    """Candidate pool of ``canary.source`` (``canaries.INPUT_SOURCES``) and the training
    indices it consumed (held out of the base data)."""
    x, y = _tensors(train_set, np.arange(len(train_set)))
    source = INPUT_SOURCES[c.source]
    cand = source.make(x, y, num_classes, c.candidates, rng, c.crafted_value)
    return cand, np.asarray(cand.source) if source.held_out else np.array([], int)


def _input(settings, model, train_set, references, params, membership, rng, device, C):
    c = settings.canary
    num_classes = int(model(references[0][:1]).shape[1])
    cand, held_out = _candidates(c, train_set, num_classes, rng)
    cand = InputCandidates(cand.inputs.to(device), cand.targets.to(device), cand.kind, cand.source)
    ranking = rank_candidates(
        model,
        references,
        (cand.inputs, cand.targets),
        LOSS,
        C,
        method=c.estimator,
        param_names=params,
        keep_grads=False,
    )
    k = c.count
    if k > len(cand):
        fix = (
            "raise canary.candidates or lower canary.count"
            if len(cand) >= c.candidates
            else f"the {c.source} source makes at most {len(cand)} here, whatever "
            "canary.candidates says: lower canary.count or choose another canary.source"
        )
        raise ValueError(
            f"canary.count={k} is larger than the candidate pool ({len(cand)} "
            f"{c.source} candidates; {fix})"
        )
    if c.selection in ("easy", "medium", "hard"):
        if 3 * k > len(cand):
            raise ValueError(
                f"canary.selection={c.selection!r} with count={k} needs 3 x count = {3 * k} "
                f"candidates, the pool has {len(cand)}"
            )
        chosen = select_canaries(ranking.scores, "easy_medium_hard", k=k).by_label()[c.selection]
    elif c.selection == "random":
        chosen = rng.choice(len(cand), size=k, replace=False)
    elif c.selection == "stratified":  # count / STRATA at random from each score quantile
        chosen = select_canaries(
            ranking.scores, "stratified", k=k // STRATA, num_strata=STRATA, seed=rng
        ).indices
    else:
        chosen = select_canaries(ranking.scores, c.selection, k=k, seed=rng).indices
    chosen = np.asarray(chosen)
    picked = cand.subset(chosen)
    canaries = InputCanaries(picked.inputs, picked.targets, LOSS)
    base_idx = np.setdiff1d(np.arange(len(train_set)), held_out)
    members = TensorDataset(picked.inputs[membership].cpu(), picked.targets[membership].cpu())
    train = ConcatDataset([Subset(train_set, base_idx.tolist()), members])
    info = {
        "source": c.source,
        "selection": c.selection,
        "mahalanobis": ranking.scores[chosen].tolist(),
        "candidate_pool": len(cand),
    }
    return CanarySetup(
        canaries,
        membership,
        train,
        params,
        references,
        None,
        len(base_idx),
        info,
        ranking.scores,
        chosen,
        precision=ranking.precision,
    )
