"""Canary designs as plug-ins: ``canary.kind`` names one (DESIGN 3 step 2, DESIGN 4.5).

Each design is one module: its typed options (``Options``), how it builds its canaries at
theta_0 from a ``BuildContext``, what it realises of the ``ThreatModel`` (a ``Realisation``:
kind of canary, per-step rate, norm, whether canaries share a run, whether they sit on
coordinates no data touch), and which attack scores it refuses or scores by default
(``base.CanaryDesign``). It never sees the audit's settings: the rules are in
docs/plugins.md. Built in: ``gradient`` (``gradient.py``: Dirac or
random-direction vectors the hook inserts) and ``input`` (``inputs.py``: examples from a
candidate source, ranked by seed 001 Algorithm 3). A new design is one module plus one line
in ``DESIGNS`` below, or ``register_canary_design`` from user code.
"""

from __future__ import annotations

from dpaudit._validate import require_choice
from dpaudit.experiment.canary_designs.base import (
    BuildContext,
    CanaryDesign,
    CanarySetup,
    DesignContext,
    NoOptions,
    Realisation,
)
from dpaudit.experiment.canary_designs.gradient import GradientDesign
from dpaudit.experiment.canary_designs.inputs import InputDesign
from dpaudit.registry import Registry


def _check_design(name: str, design) -> None:
    from dpaudit.names import CANARY_KINDS  # the kinds of canary a threat model knows

    if not isinstance(design, CanaryDesign):
        raise TypeError(f"canary design {name!r} must be a CanaryDesign instance, got "
                        f"{type(design).__name__}")
    require_choice(f"canary design {name!r}: threat_kind", design.threat_kind, CANARY_KINDS)


DESIGNS = Registry("canary design", {"gradient": GradientDesign(), "input": InputDesign()},
                   check=_check_design)


def register_canary_design(name: str, design: CanaryDesign | None = None, *,
                           replace: bool = False):
    """Make ``canary.kind=<name>`` audit with ``design`` (a ``CanaryDesign`` instance).

    Args:
        name: the new design's name.
        design: an instance of a ``CanaryDesign`` subclass: ``build(ctx)`` returns the
            canaries' ``CanarySetup``; its ``Options`` dataclass is read from
            ``canary.options``; ``realises(options, ctx, setup)``, ``refused_scores`` and
            ``default_scores(options)`` say what it realises. A design written for release
            0.1 (hooks taking the settings) still works, with a ``DeprecationWarning``.
        replace: allow replacing an existing entry.
    """
    return DESIGNS.register(name, design, replace=replace)


def design_of(canary, settings_view=None) -> CanaryDesign:
    """The design ``canary.kind`` names (ValueError naming canary.kind otherwise), seen
    through the typed interface: a dpaudit-0.1 design is wrapped (``legacy.adapt``; its old
    hooks get ``settings_view``)."""
    from dpaudit.experiment.canary_designs.legacy import adapt

    return adapt(DESIGNS.get_or_fail(canary.kind, "canary.kind"), settings_view)


__all__ = [
    "DESIGNS",
    "BuildContext",
    "CanaryDesign",
    "CanarySetup",
    "DesignContext",
    "GradientDesign",
    "InputDesign",
    "NoOptions",
    "Realisation",
    "design_of",
    "register_canary_design",
]
