"""Attack scores for an audit, built from ``attack.scores`` names (DESIGN 4.3).

``SCORES`` maps each name ``attack.scores`` accepts to a builder; a new attack is its
``StepScore`` in ``dpaudit.attacks`` plus one line here, or ``register_score`` from user code
(the settings read the names from it).
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace

import torch
from torch import nn

from dpaudit.attacks import (
    BatchSizeScore,
    CovarianceScore,
    GLiRScore,
    MixtureLR,
    ScalarProduct,
    StepScore,
)
from dpaudit.covariance import PrecisionOperator, estimate_precision, noise_ridge
from dpaudit.experiment.canary_designs import CanarySetup
from dpaudit.experiment.settings import AttackSettings
from dpaudit.gradients import per_sample_clipped_grads
from dpaudit.models import LOSS
from dpaudit.registry import Registry, callable_entry
from dpaudit.threat_model import ThreatModel


@dataclass
class ScoreContext:
    """What a score builder may use: the model at theta_0, the canary setup, Opacus' expected
    batch size, the run's threat model (its noise multiplier, clip norm, rate, steps) and the
    ``attack`` group's options (estimator, references, ridge, explained variance). A builder
    never sees the audit's settings (docs/plugins.md)."""

    attack: AttackSettings
    model: nn.Module
    setup: CanarySetup
    expected_batch_size: float
    threat: ThreatModel
    precision_info: dict | None = None  # what ``precision`` built, once it was asked for

    @property
    def settings(self) -> SimpleNamespace:
        """Deprecated (dpaudit 0.1's ``ctx.settings``; removed in 0.3): the groups a score
        read, ``attack`` and ``dp``'s noise multiplier, clip norm and delta (the threat
        model's). Read ``ctx.attack`` and ``ctx.threat`` instead; any other settings field is
        an AttributeError."""
        warnings.warn("ScoreContext.settings is the dpaudit-0.1 score interface, deprecated "
                      "and removed in 0.3: read ctx.attack and ctx.threat (docs/plugins.md)",
                      DeprecationWarning, stacklevel=2)
        t = self.threat
        dp = SimpleNamespace(noise_multiplier=t.noise_multiplier, max_grad_norm=t.max_grad_norm,
                             delta=t.delta)
        return SimpleNamespace(attack=self.attack, dp=dp)

    @functools.cached_property
    def precision(self) -> PrecisionOperator:
        """Noise-aware precision, estimated once for all scores that need it: the inverse of
        the ``attack.estimator``'s covariance of the clipped reference gradients at theta_0
        plus (sigma^2 C^2 / b + ``attack.ridge``) I, what the released mean's covariance is
        (DESIGN 4.3). With sigma > 0 (the settings' rule) it is never singular, also where every
        reference gradient is the same (Dirac canaries on dead coordinates). What was built is
        kept in ``precision_info`` (estimator, references, b, the two ridges, woodbury's rank),
        which ``build_scores`` adds to the canary info."""
        a, threat, setup = self.attack, self.threat, self.setup
        x, y = setup.references
        k = min(a.n_references, len(x))
        grads = per_sample_clipped_grads(
            self.model, x[:k], y[:k], LOSS, threat.max_grad_norm, param_names=setup.param_names
        )
        if setup.coordinates is not None:  # the hook's coordinate view
            grads = grads[:, torch.as_tensor(setup.coordinates, device=grads.device)]
        noise = noise_ridge(threat.noise_multiplier, threat.max_grad_norm,
                            self.expected_batch_size)
        extra = {"explained_variance": a.explained_variance} if a.estimator == "woodbury" else {}
        try:
            op = estimate_precision(grads, a.estimator, ridge=noise + a.ridge, **extra)
        except ValueError as err:  # e.g. dense beyond its dimension: name the setting
            raise ValueError(f"attack.estimator={a.estimator}: {err}") from err
        summary = op.summary() if hasattr(op, "summary") else {}
        self.precision_info = {
            "estimator": a.estimator,
            "n_refs": k,
            "dim": int(grads.shape[1]),
            "batch_size": self.expected_batch_size,
            "noise_ridge": noise,
            "ridge": a.ridge,
            **{key: v for key, v in summary.items() if key not in ("n_refs", "ridge")},
        }
        return op


def _mixture_lr(ctx: ScoreContext) -> StepScore:
    """Mixture likelihood ratio at the canaries' per-step sample rate (the threat model's);
    gradient canaries only (the settings refuse it for input canaries)."""
    return MixtureLR(inclusion_prob=ctx.threat.sample_rate)


SCORES: Registry = Registry("attack score", {
    "scalar": lambda ctx: ScalarProduct(),
    "covariance": lambda ctx: CovarianceScore(ctx.precision),
    "mixture_lr": _mixture_lr,
    "glir": lambda ctx: GLiRScore(ctx.precision),
    "batch_size": lambda ctx: BatchSizeScore(),
}, check=callable_entry("attack score"))


def register_score(
    name: str, builder: Callable[[ScoreContext], StepScore] | None = None, *,
    replace: bool = False,
):
    """Make ``attack.scores=[<name>]`` score canaries with ``builder`` (also a decorator).

    Args:
        name: the new score's name.
        builder: ``builder(ctx)`` returning a fresh ``dpaudit.attacks.StepScore`` (its
            ``update`` sees each step's released gradient and the canaries' gradients; higher
            score means "member"); ``ctx`` is a ``ScoreContext`` (model at theta_0, canary
            setup, Opacus' expected batch size, threat model, the ``attack`` group's options,
            and ``ctx.precision``).
        replace: allow replacing an existing entry.
    """
    return SCORES.register(name, builder, replace=replace)


def build_scores(
    names: tuple[str, ...],
    attack: AttackSettings,
    model,
    setup: CanarySetup,
    expected_batch_size: float,
    threat: ThreatModel,
) -> list[StepScore]:
    """One ``StepScore`` per attack of ``names`` (``SCORES``), in that order; covariance-type
    scores share one precision estimated from references at theta_0."""
    ctx = ScoreContext(attack, model, setup, expected_batch_size, threat)
    out = []
    for name in names:
        score = SCORES.get_or_fail(name, "attack.scores")(ctx)
        if not isinstance(score, StepScore):
            raise TypeError(f"the builder of attack score {name!r} must return a StepScore, "
                            f"got {type(score).__name__}")
        if score.name == StepScore.name:  # a user's score reports under its registered name
            score.name = name
        elif score.name != name:
            raise ValueError(f"attack score {name!r} builds a StepScore named {score.name!r}; "
                             "its name must be the registered one (or left unset)")
        out.append(score)
    if ctx.precision_info is not None:  # the report says which precision the scores used
        setup.info["precision"] = ctx.precision_info
    return out
