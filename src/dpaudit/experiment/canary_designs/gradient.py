"""Gradient canaries: vectors the capture hook adds to the clipped sum (DESIGN 3, step 2).

Dirac vectors on the coordinates where the mean absolute clipped gradient of the training
data at theta_0 is smallest (exactly zero on, e.g., weights of pixels that are blank in every
image: 3 pixels x 10 classes on digits logreg, 3 x width first-layer weights of an MLP), the
structurally dead ones first (``capture.structural``: no data gradient reaches them at any
step, where a coordinate dead only at theta_0, e.g. a weight of a ReLU unit no example
activates, can come alive; the build counts both kinds), or random directions; norm <= C.
Members are inserted by the hook (every step, or Bernoulli(q_c) per step); non-members are
only scored. ``view="auto"`` records and scores Dirac canaries in
the coordinate view of their own coordinates, stored sparsely (``GradientCanaries.dirac``: K
indices, never a K x K matrix), so K = 10^5 canaries cost O(K) per step (the hook's
``DiracRows``), not O(K d); a warning says when K exceeds the dead coordinates.

What they realise: the gradient-canary threat model, a member entering every step (q = 1) or
at q_c; Dirac canaries all on coordinates no data gradient touches are independent
experiments (each sees only its own coordinate's noise), so they certify in one run.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from dpaudit import seeds
from dpaudit.experiment.canary_designs.base import (
    BuildContext,
    CanaryDesign,
    CanarySetup,
    DesignContext,
    Realisation,
    tensors,
)
from dpaudit.names import CANARY_POLICIES

DIRECTIONS = ("dirac", "random")
PLACEMENTS = ("least_active", "random_live")
GRADIENT_POLICIES = tuple(p for p in CANARY_POLICIES if p != "never")  # what members use
VIEWS = ("full", "auto")


@dataclass(frozen=True)
class GradientOptions:
    """``canary.direction`` / ``placement`` / ``norm`` / ``policy`` / ``inclusion_prob`` /
    ``view`` (the ``canary`` group's help says what each means)."""

    direction: str = "dirac"
    placement: str = "least_active"
    norm: float | None = None
    policy: str = "every_step"
    inclusion_prob: float | None = None
    view: str = "auto"


class GradientDesign(CanaryDesign):
    """Gradient canaries (module doc): Dirac or random directions, every step or Bernoulli."""

    threat_kind = "gradient"
    Options = GradientOptions

    def build(self, ctx: BuildContext) -> CanarySetup:
        o = ctx.options
        # Bernoulli canaries enter a step at the threat model's canary rate (one rule,
        # ``member_rate``; the data's q: gradient canaries leave the training data as it is)
        q_c = member_rate(o, ctx.data_sample_rate) if o.policy == "bernoulli" else None
        return _build(ctx, o, q_c)

    def realises(self, options, ctx: DesignContext,
                 setup: CanarySetup | None = None) -> Realisation:
        """Gradient canaries of norm ``canary.norm`` (default C) entering at ``member_rate``;
        Dirac canaries may share a run; on dead coordinates when every one sits where the
        data's gradient is exactly zero at theta_0 (the build counts them, and how many of
        them are structurally dead, i.e. at every step)."""
        rate = member_rate(options, ctx.data_sample_rate)
        dead = None
        if setup is not None:
            dead = options.direction == "dirac" and setup.info.get(
                "canaries_on_zero_gradient_coordinates") == ctx.count
        return Realisation(
            kind=self.threat_kind, member_rate=rate, norm=canary_norm(options, ctx),
            shares_a_run=options.direction == "dirac", on_dead_coordinates=dead,
        )

    def default_scores(self, options) -> list[str]:
        # Bernoulli canaries: the per-step mixture likelihood ratio, the Neyman-Pearson test
        # of the subsampled Gaussian (the epoch-summed scalar product has almost no power
        # there: a claim of sigma x 0.8 at q = 0.1 was rejected in 0-0.5% of audits)
        if options.policy == "bernoulli":
            return ["mixture_lr"]
        return ["scalar"]


def member_rate(o: GradientOptions, data_rate: float | None) -> float | None:
    """The members' per-step rate (capture's ``policy_sample_rate``: 1 every step, q_c
    Bernoulli); q_c is ``canary.inclusion_prob``, by default the data's rate (None while
    that rate is not known: the settings check, before the data are loaded)."""
    from dpaudit.capture.gradient_canaries import policy_sample_rate

    q_c = o.inclusion_prob if o.inclusion_prob is not None else data_rate
    if o.policy == "bernoulli" and q_c is None:
        return None
    return policy_sample_rate(o.policy, None if q_c is None else float(q_c))


def canary_norm(o: GradientOptions, ctx: DesignContext) -> float:
    """The canaries' norm: ``canary.norm``, by default the clip norm C."""
    return ctx.max_grad_norm if o.norm is None else float(o.norm)


def _build(ctx: BuildContext, o: GradientOptions, q_c: float | None) -> CanarySetup:

    from dpaudit.canaries import dirac_canaries, random_direction_canaries
    from dpaudit.capture import GradientCanaries
    from dpaudit.capture.gradient_canaries import NORM_SLACK
    from dpaudit.gradients import per_sample_clipped_grads
    from dpaudit.models import LOSS

    count, C = ctx.count, ctx.max_grad_norm
    norm = canary_norm(o, ctx.context)
    if norm > C * (1 + NORM_SLACK):
        raise ValueError(
            f"canary.norm={norm} exceeds the clip norm dp.max_grad_norm={C}: such a canary "
            "is not a valid neighbouring record and can exceed the true epsilon"
        )
    params = ctx.param_names
    ref_grads = per_sample_clipped_grads(ctx.model, *ctx.references, LOSS, C, param_names=params)
    dim = ref_grads.shape[1]
    if count > dim:
        raise ValueError(
            f"canary.count={count} is larger than the candidate pool: the selected "
            f"parameters {params} have only {dim} coordinates"
        )
    info: dict = {"dim": dim, "norm": norm, "view": "full"}
    view = None
    if o.direction == "dirac":
        activity = data_gradient_activity(ctx.model, ctx.train_set, C, params)
        structural = structurally_dead_coordinates(ctx.model, ctx.train_set, params)
        tiebreak = seeds.stream(ctx.seed, seeds.DIRAC_TIEBREAK).random(dim)
        dead = int((activity == 0).sum())
        if o.placement == "random_live":
            live = np.flatnonzero(activity > 0)
            if count > len(live):
                raise ValueError(
                    f"canary.count={count} exceeds the {len(live)} live coordinates of "
                    f"{params} (canary.placement=random_live): lower canary.count"
                )
            pick = seeds.stream(ctx.seed, seeds.LIVE_PLACEMENT).choice(
                len(live), count, False
            )
            coords = np.sort(live[pick])
        else:
            # structurally dead first (where a model has both kinds), then the least active:
            # with none, or with every zero-activity coordinate structural, the order is that
            # of the activity alone
            coords = np.lexsort((tiebreak, activity, ~structural))[:count]
        if count > dead and o.placement == "least_active":
            warnings.warn(
                f"canary.count={count} exceeds the {dead} coordinates whose data gradient is "
                f"exactly zero at theta_0 (parameters {params}): {count - dead} Dirac canaries "
                "sit on coordinates the data touch and the audit is looser; lower canary.count "
                "or use a model with more dead coordinates (e.g. model=mlp, larger model.width)",
                stacklevel=2,
            )
        if o.view == "auto":  # in the view of their own coordinates: e_1 ... e_K, sparse
            view = coords
            vectors = None
            info["view"] = "auto"
        else:
            vectors = dirac_canaries(dim, coords, norm, ref_grads.device, ref_grads.dtype)
        info["coordinates"] = coords.tolist()
        info["data_gradient_activity_max"] = float(activity[coords].max())
        info["zero_gradient_coordinates"] = dead
        info["canaries_on_zero_gradient_coordinates"] = int((activity[coords] == 0).sum())
        info["structurally_dead_coordinates"] = int(structural.sum())
        info["canaries_on_structurally_dead_coordinates"] = int(structural[coords].sum())
        # where the released gradient is noise plus canaries only: the noise probes of the
        # white-box checks (coordinates of the selection, e.g. weights of always-blank pixels)
        info["noise_probes"] = np.sort(coords[activity[coords] == 0]).tolist()
    else:
        vectors = random_direction_canaries(dim=dim, num=count, norm=norm, seed=ctx.seed)
        vectors = vectors.to(ref_grads.device, ref_grads.dtype)
    policies = [o.policy if b else "never" for b in ctx.membership]
    inclusion_seed = [ctx.seed, seeds.BERNOULLI_INCLUSION]
    if vectors is None:  # view auto: the same canaries as the dense e_1 ... e_K, O(K) memory
        canaries = GradientCanaries.dirac(np.arange(count), norm, count, policy=policies,
                                          inclusion_prob=q_c, seed=inclusion_seed,
                                          dtype=ref_grads.dtype)
    else:
        canaries = GradientCanaries(vectors, policy=policies, inclusion_prob=q_c,
                                    seed=inclusion_seed)
    probes = info.get("noise_probes") or []
    return ctx.setup(canaries, inclusion_prob=q_c, info=info, coordinates=view,
                     noise_probes=probes if len(probes) >= 3 else None)


def structurally_dead_coordinates(model, train_set, params: list[str],
                                  chunk: int = 512) -> np.ndarray:
    """(d,) booleans over the selection: True where no data gradient can ever reach, by the
    model's structure (``dpaudit.capture.structural``)."""
    from dpaudit.capture.structural import structurally_dead

    device = next(model.parameters()).device
    n = len(train_set)
    batches = (tensors(train_set, np.arange(s, min(n, s + chunk)))[0].to(device)
               for s in range(0, n, chunk))
    return structurally_dead(model, batches, params)


def data_gradient_activity(model, train_set, max_grad_norm: float, params: list[str],
                           chunk: int = 512) -> np.ndarray:
    """(d,) mean |clipped per-example gradient| of the whole training set at the current
    parameters, coordinate by coordinate (exactly 0 where no example's gradient reaches)."""
    from dpaudit.gradients import per_sample_clipped_grads
    from dpaudit.models import LOSS

    device = next(model.parameters()).device
    total = None
    n = len(train_set)
    for start in range(0, n, chunk):
        x, y = tensors(train_set, np.arange(start, min(n, start + chunk)))
        g = per_sample_clipped_grads(
            model, x.to(device), y.to(device), LOSS, max_grad_norm, param_names=params
        )
        part = g.abs_().sum(0).double()  # in place (g is ours): exact zeros stay exact
        total = part if total is None else total + part
    return (total / n).cpu().numpy()
