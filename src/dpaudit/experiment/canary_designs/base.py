"""What a canary design is: the interface every design implements, and what it builds.

A design sees only typed inputs: its own options (``Options``, a frozen dataclass read from
the ``canary`` group's fields of the same names and from ``canary.options``) and a small
``DesignContext`` (how many canaries, the clip norm, the seed, the audit mode, the data's
sample rate). It builds its canaries at theta_0 from a ``BuildContext`` (``build`` ->
``CanarySetup``) and declares what it realises of the threat model as a ``Realisation``
(``realises``): the kind of canary, the per-step rate at which a member enters the noisy
sum, its norm, whether several canaries may share one run's membership bit, and whether
every canary sits on coordinates no data gradient touches. The rules for writing and for
changing this interface are in docs/plugins.md.

Designs written against the dpaudit-0.1 interface (hooks that took the whole settings:
``check(settings)``, ``sample_rate(settings, q)``, ``canary_norm(settings, measured)``,
``independent(settings, info)``, ``shares_a_run(settings)``, ``default_scores(settings)``,
``ctx.settings`` in ``build``) keep working for this release with a ``DeprecationWarning``
(``legacy.py``).

Torch-free at import: the settings check (and ``dpaudit --help``) uses designs before torch is
loaded; ``build`` imports what it needs.
"""

from __future__ import annotations

import abc
import dataclasses
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dpaudit._validate import require_choice, require_known
from dpaudit.names import CANARY_KINDS

LEGACY_REMOVED_IN = "0.3"  # the release that drops the 0.1 interface (legacy.py)


def warn_legacy(what: str, instead: str) -> None:
    """A ``DeprecationWarning``: ``what`` is dpaudit 0.1's interface; use ``instead``."""
    warnings.warn(f"{what} is the dpaudit-0.1 canary-design interface, deprecated and removed "
                  f"in {LEGACY_REMOVED_IN}: use {instead} (docs/plugins.md)",
                  DeprecationWarning, stacklevel=3)


@dataclass(frozen=True)
class DesignContext:
    """What a design may read besides its own options.

    ``count``: the number of canaries K; ``max_grad_norm``: the clip norm C; ``seed``: the
    audit's seed (a design draws from ``dpaudit.seeds.stream(seed, tag)``, or from the
    ``BuildContext``'s generator); ``mode``: ``"one_run"`` or ``"multi_run"``;
    ``data_sample_rate``: the training data's Poisson rate q, None where the data are not
    loaded yet (the settings check)."""

    count: int
    max_grad_norm: float
    seed: int
    mode: str = "one_run"
    data_sample_rate: float | None = None


@dataclass(frozen=True)
class Realisation:
    """What a design realises of the threat model (``CanaryDesign.realises``).

    ``kind``: the ``ThreatModel``'s canary kind (``"gradient"`` / ``"input"``);
    ``member_rate``: the per-step probability that a member enters the noisy sum (1: every
    step), None for "with the data, at the data's Poisson rate"; ``norm``: a gradient
    canary's norm (None: input canaries, whose sensitivity is the clip norm);
    ``shares_a_run``: several canaries may share one run's membership bit in a multi-run audit
    (they cannot see each other); ``on_dead_coordinates``: every canary sits on coordinates no
    data gradient touches, so each is an independent one-canary experiment although they train
    together (None before the canaries are built; the built-in gradient design checks it at
    theta_0 and counts in its info how many are structurally dead, i.e. at every step:
    ``capture.structural``)."""

    kind: str
    member_rate: float | None = None
    norm: float | None = None
    shares_a_run: bool = False
    on_dead_coordinates: bool | None = None

    def __post_init__(self) -> None:
        require_choice("Realisation.kind", self.kind, CANARY_KINDS)
        rate = self.member_rate
        if rate is not None and not (isinstance(rate, (int, float)) and 0 < rate <= 1):
            raise ValueError(f"Realisation.member_rate must be None or in (0, 1], got {rate!r}")
        if self.norm is not None and not (isinstance(self.norm, (int, float)) and self.norm > 0
                                          and self.norm < float("inf")):
            raise ValueError(f"Realisation.norm must be None or a positive finite number, got "
                             f"{self.norm!r}")
        for name in ("shares_a_run", "on_dead_coordinates"):
            v = getattr(self, name)
            if not (isinstance(v, bool) or (v is None and name == "on_dead_coordinates")):
                raise ValueError(f"Realisation.{name} must be a bool, got {v!r}")


@dataclass
class CanarySetup:
    """The canaries of one run, who is a member, and the data the model trains on.

    ``canaries``: what the capture hook inserts and scores (``GradientCanaries`` /
    ``InputCanaries``); ``train_set``: the training data with the member canaries a design adds
    to it; ``n_base``: training examples besides the canaries (the same in every run);
    ``inclusion_prob``: the per-step rate of Bernoulli gradient canaries (None otherwise);
    ``info``: what the report shows about the canaries (written once, by the design and the
    run's set-up); ``candidate_scores`` / ``chosen`` / ``selection``: a ranked candidate pool,
    the chosen indices and how they were chosen; ``coordinates``: the hook's coordinate view
    (None: the full selection); ``noise_probes``: coordinates of the selection no example's
    gradient touches (the white-box noise probes); ``precision``: the reference estimator of a
    design that ranked candidates with one."""

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
    selection: str = ""
    coordinates: np.ndarray | None = None
    noise_probes: list[int] | None = None
    precision: Any = None


@dataclass(frozen=True)
class BuildContext:
    """What a design builds its canaries from: its typed ``options``, the ``DesignContext``
    (``count``, ``max_grad_norm``, ``seed``, ``data_sample_rate``: read them here), the
    ``model`` at theta_0 (on its device), the training data (without canaries), reference
    examples for gradient statistics, the parameters the canaries live in, the membership
    bits, the canary set-up's seeded generator and the device."""

    options: Any
    context: DesignContext
    model: Any
    train_set: Any
    references: tuple
    param_names: list[str]
    membership: np.ndarray
    rng: np.random.Generator
    device: Any
    legacy_settings: Any = None  # a dpaudit-0.1 design's ``ctx.settings`` (legacy.py)

    @property
    def count(self) -> int:
        return self.context.count

    @property
    def max_grad_norm(self) -> float:
        return self.context.max_grad_norm

    @property
    def seed(self) -> int:
        return self.context.seed

    @property
    def data_sample_rate(self) -> float | None:
        return self.context.data_sample_rate

    @property
    def settings(self) -> Any:
        """Deprecated (dpaudit 0.1's ``ctx.settings``): read ``ctx.options``, ``ctx.count``,
        ``ctx.max_grad_norm``, ``ctx.seed`` instead. A read-only view of the settings groups,
        for one release."""
        warn_legacy("BuildContext.settings", "ctx.options, ctx.count, ctx.max_grad_norm, "
                    "ctx.seed, ctx.data_sample_rate")
        if self.legacy_settings is None:
            raise AttributeError("BuildContext.settings: no settings view (the design was "
                                 "built outside an audit); use the typed fields")
        return self.legacy_settings

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
    from torch.utils.data import TensorDataset

    if type(ds) is TensorDataset and len(ds.tensors) == 2:  # the loaders' data: one gather
        rows = torch.as_tensor(np.asarray(idx, dtype=np.int64))
        return tuple(t[rows.to(t.device)] for t in ds.tensors)
    xs, ys = zip(*(ds[int(i)] for i in idx), strict=True)
    return torch.stack(xs), torch.stack([torch.as_tensor(y) for y in ys])


@dataclass(frozen=True)
class NoOptions:
    """The options of a design that has none."""


class CanaryDesign(abc.ABC):
    """One canary design (module doc). Subclass it, implement ``build`` (and ``realises``
    unless the defaults fit), and register an instance with ``register_canary_design``;
    ``canary.kind=<name>`` selects it."""

    threat_kind: str = "gradient"  # the ThreatModel's canary: "gradient" or "input"
    Options: type = NoOptions
    # attack score -> why this design cannot use it (every other registered score is allowed)
    refused_scores: dict[str, str] = {}  # noqa: RUF012 - read-only class table

    def options(self, canary) -> Any:
        """This design's typed settings: ``Options`` from the canary group's fields of the
        same names, then ``canary.options`` (unknown keys there are an error naming them)."""
        names = {f.name for f in dataclasses.fields(self.Options)}
        extra = dict(getattr(canary, "options", None) or {})
        require_known("canary.options key", sorted(extra), names,
                      allowed=f"{', '.join(sorted(names))} (the options of canary.kind="
                      f"{canary.kind})")
        values = {n: getattr(canary, n) for n in names if hasattr(canary, n)}
        return self.Options(**{**values, **extra})

    def check(self, options, ctx: DesignContext) -> None:  # noqa: B027 - optional hook
        """Refuse options this design cannot audit in ``ctx`` (a ValueError naming the
        field; default: accept)."""

    @abc.abstractmethod
    def build(self, ctx: BuildContext) -> CanarySetup:
        """The canaries at the model's current (initial) parameters."""

    def realises(self, options, ctx: DesignContext,
                 setup: CanarySetup | None = None) -> Realisation:
        """What this design realises (``Realisation``); ``setup``: the canaries built, None
        before the build (then ``on_dead_coordinates`` is None). Default: canaries of
        ``threat_kind`` entering with the data at its rate, norm unknown, not sharing a run,
        not on dead coordinates."""
        return Realisation(kind=self.threat_kind,
                           on_dead_coordinates=None if setup is None else False)

    def default_scores(self, options) -> list[str]:
        """The attack scores of ``attack.scores: null``."""
        return ["scalar"]
