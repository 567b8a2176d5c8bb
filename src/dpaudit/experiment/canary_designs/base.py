"""What a canary design is: the interface every design implements, and what it builds.

A design turns the audit's settings into canaries at theta_0 (``build`` -> ``CanarySetup``)
and says what it realises: the kind of canary of the ``ThreatModel`` (``threat_kind``), the
per-step rate at which a member enters the noisy sum (``sample_rate``), the canary's norm
(``canary_norm``), whether its canaries are independent one-canary experiments
(``independent``), which attack scores it refuses and which it scores by default. Its own
settings are a typed record (``Options``), read from the ``canary`` group's fields of the same
names and from ``canary.options`` (the open mapping a registered design reads).

Torch-free at import: the settings check (and ``dpaudit --help``) uses designs before torch is
loaded; ``build`` imports what it needs.
"""

from __future__ import annotations

import abc
import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class CanarySetup:
    """The canaries of one run, who is a member, and the data the model trains on.

    ``canaries``: what the capture hook inserts and scores (``GradientCanaries`` /
    ``InputCanaries``); ``train_set``: the training data with the member canaries a design adds
    to it; ``n_base``: training examples besides the canaries (the same in every run);
    ``inclusion_prob``: the per-step rate of Bernoulli gradient canaries (None otherwise);
    ``info``: what the report shows about the canaries (written once, by the design and the
    run's set-up); ``candidate_scores`` / ``chosen``: a ranked candidate pool and the chosen
    indices; ``coordinates``: the hook's coordinate view (None: the full selection);
    ``precision``: the reference estimator of a design that ranked candidates with one."""

    canaries: Any
    membership: np.ndarray
    train_set: Any
    param_names: list[str]
    references: tuple
    inclusion_prob: float | None = None
    n_base: int = 0
    info: dict = field(default_factory=dict)
    candidate_scores: np.ndarray | None = None
    chosen: np.ndarray | None = None
    coordinates: np.ndarray | None = None
    precision: Any = None


@dataclass(frozen=True)
class BuildContext:
    """What a design builds its canaries from: the audit's ``settings``, the ``model`` at
    theta_0 (on its device), the training data (without canaries), reference examples for
    gradient statistics, the parameters the canaries live in, the membership bits, the canary
    set-up's seeded generator and the device."""

    settings: Any
    model: Any
    train_set: Any
    references: tuple
    param_names: list[str]
    membership: np.ndarray
    rng: np.random.Generator
    device: Any

    def setup(self, canaries, **kw) -> CanarySetup:
        """A ``CanarySetup`` of these canaries with this context's membership, references and
        parameters (``kw``: the other ``CanarySetup`` fields)."""
        kw.setdefault("train_set", self.train_set)
        kw.setdefault("n_base", len(self.train_set))
        return CanarySetup(canaries, self.membership, param_names=self.param_names,
                           references=self.references, **kw)


def tensors(ds, idx: np.ndarray) -> tuple:
    """The (inputs, targets) tensors of the examples ``idx`` of a dataset of (x, y) pairs."""
    import torch

    xs, ys = zip(*(ds[int(i)] for i in idx), strict=True)
    return torch.stack(xs), torch.stack([torch.as_tensor(y) for y in ys])


@dataclass(frozen=True)
class NoOptions:
    """The options of a design that has none."""


class CanaryDesign(abc.ABC):
    """One canary design (module doc). Subclass it, implement ``build``, and register an
    instance with ``register_canary_design``; ``canary.kind=<name>`` selects it."""

    threat_kind: str = "gradient"  # the ThreatModel's canary: "gradient" or "input"
    Options: type = NoOptions
    # attack score -> why this design cannot use it (every other registered score is allowed)
    refused_scores: dict[str, str] = {}  # noqa: RUF012 - read-only class table

    def options(self, canary) -> Any:
        """This design's typed settings: ``Options`` from the canary group's fields of the
        same names, then ``canary.options`` (unknown keys there are an error naming them)."""
        names = {f.name for f in dataclasses.fields(self.Options)}
        extra = dict(getattr(canary, "options", None) or {})
        unknown = sorted(set(extra) - names)
        if unknown:
            raise ValueError(f"canary.options has {unknown}, which canary.kind="
                             f"{canary.kind} does not take (its options: {sorted(names)})")
        values = {n: getattr(canary, n) for n in names if hasattr(canary, n)}
        return self.Options(**{**values, **extra})

    def check(self, settings) -> None:
        """Refuse settings this design cannot audit, naming the field (default: its options
        must build)."""
        self.options(settings.canary)

    @abc.abstractmethod
    def build(self, ctx: BuildContext) -> CanarySetup:
        """The canaries at the model's current (initial) parameters."""

    def sample_rate(self, settings, data_rate: float) -> float:
        """Per-step probability that a member canary enters the noisy sum (default: with the
        data, at the data's Poisson rate)."""
        return float(data_rate)

    def canary_norm(self, settings, measured: float | None) -> float | None:
        """A gradient canary's norm (``measured``: the one it was built with, when known);
        None for input canaries, whose sensitivity is the clip norm."""
        return None

    def independent(self, settings, canary_info: dict) -> bool:
        """Whether each canary's (score, membership) is an independent one-canary experiment
        although the canaries are trained together in one run (default: no)."""
        return False

    def default_scores(self, settings) -> list[str]:
        """The attack scores of ``attack.scores: null``."""
        return ["scalar"]

    def shares_a_run(self, settings) -> bool:
        """Whether several canaries may share one run's membership bit in a multi-run audit
        (they must not see each other: default no)."""
        return False
