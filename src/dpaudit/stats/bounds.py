"""``epsilon_lower_bound``: one entry point for every empirical epsilon lower bound (DESIGN 4.5).

Methods live in ``METHOD_REGISTRY`` below: name -> (function, allowed options, whether delta = 0
is allowed, the model an estimate assumes or None). A new method is one module with
``f(scores_in, scores_out, *, delta, confidence, **options) -> EpsilonBound`` plus one line here.

* ``"clopper_pearson"`` (certified; delta = 0 allowed), ``"gdp"`` (GDP estimate): option
  ``selection``, a threshold strategy from ``threshold_selection`` (default
  ``DEFAULT_SELECTION`` = ``Bonferroni()``; ``Split(seed, fraction)``, ``FixedThreshold(value)``,
  ``Naive()`` for demonstrations only). See ``clopper_pearson``.
* ``"one_run"`` (certified; delta = 0 allowed): grid (the paper's recipe, the default: a
  grid of guess pairs under Bonferroni) or design_mu (one pair fixed by the claim, full
  level), inclusion (the design's inclusion probability, default 1/2; an implausible split is
  refused), seed (ties, virtual labels). See ``one_run`` and ``inclusion``.
* ``"density"`` (certified; delta = 0 allowed), ``"density_tv"`` (GDP estimate): bin_rule
  ("eq4.2" | "eq4.1"), n_bins, end_quantiles, edges. See ``density``.
* ``"gaussian"``: check_level. Parametric fit assuming Gaussian equal-variance scores
  (checked and reported); see ``gaussian_fit``.
* ``"fdp_one_run"`` (GDP estimate): design_mu (one pair of guess counts fixed by the claim,
  one- or two-sided, ``two_sided=False`` for "in" guesses only; default: a count per claim),
  guess_fractions, sides (explicit candidates, Bonferroni), inclusion (1/2
  only; an implausible split is refused), seed (ties). See ``one_run.bounds``.
* ``"anchor_gdp"`` (GDP estimate, never valid as a bound): Annamalai & De Cristofaro's figure,
  the threshold maximised over every score without correction; option alpha (each rate's
  Clopper-Pearson level, their 0.05). See ``anchor_gdp``.
* ``"fdp_one_run_certified"`` (certified; delta = 0 allowed): the same guesses and options;
  the infimum of the epsilons whose (epsilon, delta)-DP they do not refute, valid for canaries
  trained together. See ``one_run.bounds``.

Orientation: the scores are checked once (``thresholds.orientation_test``: one-sided
Mann-Whitney, p < 1e-3). When members score significantly LOWER than non-members every method
returns epsilon 0.0 with ``details["orientation"] = "reversed"``, the AUC and a message, and an
``OrientationWarning`` is raised: the score is almost surely flipped, and a number computed from
it would say nothing about the attack that was meant.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any, NamedTuple

from dpaudit._validate import check_delta, check_open_unit, check_scores, require_known
from dpaudit.registry import Registry
from dpaudit.stats.anchor_gdp import ASSUME_ANCHOR_GDP, anchor_gdp_bound
from dpaudit.stats.clopper_pearson import threshold_bound
from dpaudit.stats.density import density_bound
from dpaudit.stats.gaussian_fit import gaussian_bound
from dpaudit.stats.one_run.bounds import (
    ASSUME_FDP_ONE_RUN,
    fdp_one_run_bound,
    fdp_one_run_certified_bound,
)
from dpaudit.stats.one_run.steinke import one_run_bound
from dpaudit.stats.result import ASSUME_GAUSSIAN_SCORES, ASSUME_GDP, EpsilonBound
from dpaudit.stats.thresholds import OrientationWarning, orientation_test


class MethodSpec(NamedTuple):
    """One registered method: its function, options, delta = 0 support and assumption."""

    function: Callable[..., EpsilonBound]
    options: frozenset[str]
    zero_delta: bool
    assumption: str | None = None
    # certified also when the canaries were trained together and may influence each other
    # (the one-run theorems); the others need independent (score, membership) pairs
    dependent_ok: bool = False


_BIN_OPTIONS = frozenset({"bin_rule", "n_bins", "end_quantiles", "edges"})
_SELECTION = frozenset({"selection"})
def _check_spec(name: str, spec) -> None:
    if not isinstance(spec, MethodSpec) or not callable(spec.function):
        raise TypeError(f"bound method {name!r} must be a MethodSpec with a callable function")


METHOD_REGISTRY: Registry = Registry("bound method", {
    "clopper_pearson": MethodSpec(partial(threshold_bound, "clopper_pearson"), _SELECTION, True),
    "gdp": MethodSpec(partial(threshold_bound, "gdp"), _SELECTION, False, ASSUME_GDP),
    "one_run": MethodSpec(
        one_run_bound, frozenset({"grid", "inclusion", "seed", "design_mu"}), True,
        dependent_ok=True
    ),
    "density": MethodSpec(density_bound, _BIN_OPTIONS, True),
    "density_tv": MethodSpec(partial(density_bound, tv_only=True), _BIN_OPTIONS, False, ASSUME_GDP),
    "gaussian": MethodSpec(
        gaussian_bound, frozenset({"check_level"}), False, ASSUME_GAUSSIAN_SCORES
    ),
    "fdp_one_run": MethodSpec(
        fdp_one_run_bound,
        frozenset({"design_mu", "two_sided", "guess_fractions", "sides", "inclusion", "seed"}),
        False,
        ASSUME_FDP_ONE_RUN,
    ),
    "fdp_one_run_certified": MethodSpec(
        fdp_one_run_certified_bound,
        frozenset({"design_mu", "two_sided", "guess_fractions", "sides", "inclusion", "seed"}),
        True,
        dependent_ok=True,
    ),
    "anchor_gdp": MethodSpec(anchor_gdp_bound, frozenset({"alpha"}), False, ASSUME_ANCHOR_GDP),
}, check=_check_spec)
METHODS = METHOD_REGISTRY.builtin  # the built-in methods; METHOD_REGISTRY has registered ones too


def register_bound(
    name: str,
    function: Callable[..., EpsilonBound],
    *,
    options: Iterable[str] = (),
    zero_delta: bool = False,
    assumption: str | None = None,
    certified: bool = False,
    dependent_ok: bool = False,
    replace: bool = False,
) -> MethodSpec:
    """Make ``audit.methods=[<name>]`` (and ``epsilon_lower_bound(method=<name>)``) use
    ``function``.

    Args:
        name: the new method's name.
        function: ``function(scores_in, scores_out, *, delta, confidence, **options)``
            returning an ``EpsilonBound`` (scores checked finite, higher = member).
        options: the keyword options it accepts besides delta and confidence.
        zero_delta: whether it takes delta = 0 (pure DP).
        assumption: the model its number is computed under; it makes the number an estimate.
        certified: declare the number certified (valid at ``confidence`` for any score
            distribution; a certified number may trigger a PRIVACY BUG verdict). Default
            False: the number is reported as an estimate "registered, not declared
            certified". Check a certified method with ``dpaudit.validity`` first.
        dependent_ok: (certified only) also valid for canaries trained together.
        replace: allow replacing an existing entry.
    """
    if certified and assumption is not None:
        raise ValueError("register_bound: a certified method has no assumption; pass one or "
                         "the other")
    if dependent_ok and not certified:
        raise ValueError("register_bound: dependent_ok is a property of certified methods")
    if not certified and assumption is None:
        assumption = f"registered method {name!r}, not declared certified"
    spec = MethodSpec(function, frozenset(options), bool(zero_delta), assumption,
                      bool(dependent_ok))
    return METHOD_REGISTRY.register(name, spec, replace=replace)
ORIENTATION_P_VALUE = 1e-3


def _check_delta(delta: float, method: str, zero_ok: bool) -> float:
    if zero_ok:
        return check_delta(delta, zero_ok=True, why=f"for method={method!r}")
    pure = [m for m, s in METHOD_REGISTRY.items() if s.zero_delta]
    return check_delta(delta, why=f"for method={method!r} (it needs delta > 0; pure DP, "
                       f"delta = 0, is supported by {pure})")


def epsilon_lower_bound(
    scores_in,
    scores_out,
    *,
    delta: float,
    confidence: float = 0.95,
    method: str,
    **options: Any,
) -> EpsilonBound:
    """Lower bound (certified, or an estimate under a stated model) on epsilon at ``delta``.

    The membership attack is a score per target, higher meaning "member"; the bound says how
    much privacy loss the scores of members and non-members demonstrate. Perfect separation is
    a normal case: the result is the largest epsilon the sample sizes can certify. Reversed
    scores (members significantly lower) give epsilon 0.0 with an ``OrientationWarning``.

    Args:
        scores_in: array-like of finite scores (flattened) of the targets that were members
            (in the training set, or canaries included).
        scores_out: array-like of finite scores (flattened) of the targets that were not
            members.
        delta: the delta of (epsilon, delta)-DP at which epsilon is bounded, in (0, 1);
            ``delta = 0`` (pure DP) is allowed by ``"clopper_pearson"``, ``"one_run"`` and
            ``"density"`` and raises ``ValueError`` naming ``delta`` for the others.
        confidence: probability, in (0, 1), with which a certified bound holds (for an
            estimate: the level of its intervals). Default 0.95.
        method: one of ``METHODS``. Certified: ``"clopper_pearson"`` (threshold attack with
            Clopper-Pearson intervals), ``"one_run"`` (Steinke, Nasr & Jagielski 2023),
            ``"density"`` (Koskela & Mohammadi). Estimates, each with its ``assumption``:
            ``"gdp"`` (a GDP-shaped curve), ``"gaussian"`` (Gaussian equal-variance scores),
            ``"density_tv"`` (a Gaussian mechanism), ``"fdp_one_run"`` (Mahloujifar et al.
            2024).
        **options: the method's own options (any other raises ``ValueError``):
            ``selection`` (a threshold strategy from ``dpaudit.stats.threshold_selection``)
            for ``"clopper_pearson"`` / ``"gdp"``; ``grid``, ``inclusion``, ``seed`` for
            ``"one_run"``; ``bin_rule``, ``n_bins``, ``end_quantiles``, ``edges`` for
            ``"density"`` / ``"density_tv"``; ``check_level`` for ``"gaussian"``;
            ``guess_fractions``, ``sides``, ``inclusion``, ``seed`` for ``"fdp_one_run"``.
            ``inclusion`` is the probability with which each canary was made a member,
            independently (default 1/2): the one-run theorems assume that design, and a
            member count implausible under it raises ``ValueError`` naming ``inclusion``.

    Returns:
        An ``EpsilonBound``: ``epsilon`` (0.0 when nothing can be shown), ``kind``
        (``"certified"`` or ``"estimate"``), the ``assumption`` of an estimate, the
        ``confidence`` and ``delta`` used, the sample sizes and the operating point
        (``threshold``, ``fpr_upper``, ``fnr_upper``, ``mu_lower``) where the method has one.

    Raises:
        ValueError: an unknown method or option, scores that are empty or not finite, or
            ``delta`` / ``confidence`` out of range; the message names the argument.
    """
    spec = METHOD_REGISTRY.get_or_fail(method, "method")
    require_known(f"option of method={method!r}", sorted(options), spec.options,
                  allowed=", ".join(sorted(spec.options)) or "none")
    s_in = check_scores(scores_in, "scores_in")
    s_out = check_scores(scores_out, "scores_out")
    delta = _check_delta(delta, method, spec.zero_delta)
    confidence = check_open_unit(confidence, "confidence")
    auc, z, reversed_ = orientation_test(s_in, s_out, p_value=ORIENTATION_P_VALUE)
    if reversed_:
        message = (
            f"AUC = {auc:.4f} is significantly below 0.5 (z = {z:.2f}): members score LOWER "
            "than non-members; the score looks flipped (higher must mean 'member'), so no "
            "epsilon is reported"
        )
        warnings.warn(message, OrientationWarning, stacklevel=2)
        return EpsilonBound(
            epsilon=0.0,
            method=method,
            confidence=confidence,
            delta=delta,
            n_in=int(s_in.size),
            n_out=int(s_out.size),
            details={"orientation": "reversed", "auc": auc, "z": z, "message": message},
            assumption=spec.assumption,
        )
    res = spec.function(s_in, s_out, delta=delta, confidence=confidence, **options)
    if not isinstance(res, EpsilonBound):
        raise TypeError(f"bound method {method!r} must return an EpsilonBound, "
                        f"got {type(res).__name__}")
    if spec.assumption is not None and res.assumption is None:  # never certified by mistake
        res = dataclasses.replace(res, assumption=spec.assumption)
    return res
