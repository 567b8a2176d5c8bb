"""Repeated audits of mechanisms with known truth: how often does a method exceed the truth?

``validity_study`` draws ``reps`` independent score samples from each scenario
(``dpaudit.validity.scenarios``), runs every method of ``dpaudit.stats.epsilon_lower_bound``
on the same draws, and reports per (method, scenario) the fraction of repetitions whose
epsilon exceeds the true epsilon. A *certified* bound at confidence c must exceed the truth
with probability at most 1 - c on every mechanism; an *estimate* (a number computed under a
named model, ``EpsilonBound.assumption``) promises nothing off its model, and the study shows
how far off it goes.

``claim_study`` does the same for the claim test (``dpaudit.stats.claim.claim_test``): the
scenario's exact trade-off curve is a correct claim, so it may be rejected in at most a
1 - confidence fraction of repetitions; a curve of another (more private) scenario measures
the test's power.

Designs (``Design``): how many member and non-member scores a repetition draws. A fixed
design draws exactly n_in and n_out (what the threshold methods condition on); a Bernoulli
design has m = n_in + n_out canaries, each a member with probability p = n_in / m
independently (what the one-run theorems assume, and how dpaudit's audits draw memberships).
Methods that take an ``inclusion`` option (the one-run methods) are given the design's p
unless the caller sets it; a method that refuses a draw (a ValueError: e.g. a split
implausible under the inclusion it was told, or too few scores for a fit) counts as "not
applicable" for that repetition, with its trivial 0, and the refusal is reported.

Seeding: repetition ``rep`` of scenario ``s`` draws from
``np.random.default_rng([seed, crc32(s.name), rep])`` (under a design other than the
study's ``n_in`` / ``n_out``, ``[seed, crc32(s.name), crc32(design.name), rep]``): every draw
is reproducible, all methods see the same draws (paired comparison), and adding a scenario,
a design or a method changes no other row. Sampling is vectorised within a draw.
"""

from __future__ import annotations

import time
import warnings
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from dpaudit._validate import require_known
from dpaudit.stats import epsilon_lower_bound
from dpaudit.stats.bounds import METHOD_REGISTRY
from dpaudit.validity.scenarios import SCENARIOS, Scenario


def _check_sizes(reps: int, n_in: int, n_out: int) -> None:
    for value, name in ((reps, "reps"), (n_in, "n_in"), (n_out, "n_out")):
        if int(value) != value or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")


@dataclass(frozen=True)
class Design:
    """Member / non-member counts of one repetition (module doc).

    ``bernoulli=False``: exactly ``n_in`` and ``n_out``. ``bernoulli=True``: m = n_in + n_out
    canaries, each a member with probability ``inclusion`` = n_in / m, independently.
    """

    n_in: int
    n_out: int
    bernoulli: bool = False

    def __post_init__(self):
        _check_sizes(1, self.n_in, self.n_out)

    @property
    def m(self) -> int:
        return self.n_in + self.n_out

    @property
    def inclusion(self) -> float:
        """The design's inclusion probability n_in / m (exactly 1/2 for equal sides)."""
        return 0.5 if self.n_in == self.n_out else self.n_in / self.m

    @property
    def name(self) -> str:
        return f"{self.n_in}/{self.n_out}" + (" bernoulli" if self.bernoulli else "")

    def sizes(self, rng: np.random.Generator) -> tuple[int, int]:
        """(members, non-members) of one repetition, drawn from ``rng`` when Bernoulli."""
        if not self.bernoulli:
            return self.n_in, self.n_out
        k = int(rng.binomial(self.m, self.inclusion))
        return k, self.m - k


DESIGNS = {
    d.name: d
    for d in (
        Design(200, 5000, bernoulli=True),
        Design(5000, 200, bernoulli=True),
        Design(200, 5000),
        Design(1, 300),
        Design(10, 10),
    )
}
"""The unequal and small designs of the suite, besides its equal sides (the issue's cases:
200 / 5000 both ways, one member against 300, ten per side)."""


def _scenarios(scenarios) -> list[Scenario]:
    if isinstance(scenarios, Scenario):
        scenarios = [scenarios]
    if isinstance(scenarios, Mapping):
        scenarios = list(scenarios.values())
    out = []
    for s in scenarios:
        if isinstance(s, str):
            require_known("scenario", [s], SCENARIOS)
            s = SCENARIOS[s]
        if not isinstance(s, Scenario):
            raise TypeError(f"scenarios must be Scenario objects or names, got {s!r}")
        out.append(s)
    return out


def _methods(methods) -> list[tuple[str, dict]]:
    if isinstance(methods, str):
        methods = [methods]
    if isinstance(methods, Mapping):
        return [(str(m), dict(opts or {})) for m, opts in methods.items()]
    return [(str(m), {}) for m in methods]


def draw_rng(
    seed: int, scenario: Scenario, rep: int, design: Design | None = None
) -> np.random.Generator:
    """The generator of repetition ``rep`` of ``scenario`` (see the module docstring)."""
    key = [int(seed), zlib.crc32(scenario.name.encode())]
    if design is not None:
        key.append(zlib.crc32(design.name.encode()))
    return np.random.default_rng([*key, int(rep)])


def draw(scenario: Scenario, design: Design, rng: np.random.Generator):
    """One repetition's (member scores, non-member scores) under ``design``."""
    k_in, k_out = design.sizes(rng)
    return scenario.sample(k_in, k_out, rng)


def _se(p: float, n: int) -> float:
    return float(np.sqrt(max(p * (1.0 - p), 0.0) / n)) if n else float("nan")


def _designs(designs, n_in: int | None, n_out: int | None) -> list[tuple[Design, bool]]:
    """(design, keyed) pairs: the study's own n_in / n_out (old seeding) first, then others."""
    out = []
    if n_in is not None or n_out is not None:
        if n_in is None or n_out is None:
            raise ValueError("n_in and n_out go together (or pass designs=...)")
        _check_sizes(1, n_in, n_out)
        out.append((Design(int(n_in), int(n_out)), False))
    for d in designs or ():
        if isinstance(d, str):
            require_known("design", [d], DESIGNS)
            d = DESIGNS[d]
        if not isinstance(d, Design):
            raise ValueError(f"designs must be Design objects or names, got {d!r}")
        out.append((d, True))
    if not out:
        raise ValueError("give n_in and n_out, or designs=[...]")
    return out


def validity_study(
    methods: Iterable[str] | Mapping[str, Mapping[str, Any]],
    scenarios: Iterable[Scenario | str] | Mapping[str, Scenario],
    *,
    reps: int,
    n_in: int | None = None,
    n_out: int | None = None,
    delta: float,
    confidence: float = 0.95,
    seed: int = 0,
    designs: Iterable[Design | str] | None = None,
    keep_epsilons: bool = False,
    progress: Callable[[str], None] | None = None,
) -> list[dict]:
    """Run each method on ``reps`` draws of each scenario and design; one row per triple.

    Args:
        methods: method names of ``dpaudit.stats.METHODS``, or a mapping name -> options
            passed to ``epsilon_lower_bound``.
        scenarios: ``Scenario`` objects or names of ``SCENARIOS`` (or a name -> scenario map).
        reps: repetitions per scenario (independent draws, shared by all methods).
        n_in: member scores per draw (from P): the study's own fixed design.
        n_out: non-member scores per draw (from Q).
        delta: the delta of the bounds and of the truth.
        confidence: the bounds' confidence.
        seed: base seed (see the module docstring).
        designs: further designs (``Design`` objects or names of ``DESIGNS``), each run on
            every scenario after the n_in / n_out one.
        keep_epsilons: also return each repetition's epsilon and valid flag (lists).
        progress: called with a short line after each scenario (e.g. ``print``).

    Returns:
        Rows (dicts, scenario-major, then design, methods in the given order) with:
        ``method``, ``scenario``, ``design`` (its name) and ``inclusion`` (the p the one-run
        methods were given), ``kind`` ("certified" / "estimate", from the applicable returned
        bounds; "mixed" if they differ; "not applicable" if none applied),
        ``frac_not_applicable`` (repetitions whose bound was not applicable, e.g. one_run with
        m * delta not << 1, or refused with a ValueError; their trivial 0 counts as not above
        the truth), ``frac_refused`` (the refusals alone) and ``refusal`` (one refusal
        message), ``assumption``, ``truth``, ``exactness``, ``delta``, ``confidence``,
        ``reps``, ``n_in``, ``n_out``; ``frac_above`` (fraction of repetitions with
        epsilon > truth) and ``frac_above_se`` (its standard error), ``nominal`` (1 -
        confidence) and ``nominal_se`` (s.e. of a fraction at the nominal rate),
        ``median_ratio`` (median epsilon / truth; 0 when the truth is inf),
        ``median_epsilon``, ``frac_valid`` (fraction of bounds marked valid),
        ``frac_valid_above`` (marked valid AND above truth), ``seconds`` (time spent in the
        method).
    """
    _check_sizes(reps, 1, 1)
    meths = _methods(methods)
    scens = _scenarios(scenarios)
    plan = _designs(designs, n_in, n_out)
    rows: list[dict] = []
    for scen in scens:
        truth = float(scen.true_epsilon(delta))
        t_scen = time.perf_counter()
        for design, keyed in plan:
            rows.extend(
                _one_cell(
                    meths, scen, design, keyed, truth, reps, delta, confidence, seed,
                    keep_epsilons,
                )
            )
        if progress is not None:
            progress(f"{scen.name}: truth {truth:.4g}, {time.perf_counter() - t_scen:.1f} s")
    return rows


def _one_cell(meths, scen, design, keyed, truth, reps, delta, confidence, seed, keep) -> list:
    """The rows of every method on ``reps`` draws of one (scenario, design)."""
    eps = np.zeros((len(meths), reps))
    valid = np.zeros((len(meths), reps), dtype=bool)
    kinds: list[set[str]] = [set() for _ in meths]
    not_applicable = np.zeros(len(meths), dtype=int)
    refused = np.zeros(len(meths), dtype=int)
    refusal: list[str | None] = [None] * len(meths)
    assumptions: list[set[str | None]] = [set() for _ in meths]
    seconds = np.zeros(len(meths))
    options = []
    for method, opts in meths:
        o = dict(opts)
        spec = METHOD_REGISTRY.get(method)
        if spec is not None and "inclusion" in spec.options and "inclusion" not in o:
            o["inclusion"] = design.inclusion
        options.append(o)
    for rep in range(reps):
        rng = draw_rng(seed, scen, rep, design if keyed else None)
        s_in, s_out = draw(scen, design, rng)
        for j, (method, _) in enumerate(meths):
            t0 = time.perf_counter()
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    b = epsilon_lower_bound(
                        s_in, s_out, delta=delta, confidence=confidence, method=method,
                        **options[j],
                    )
            except ValueError as err:  # refused on this draw: the trivial 0, not evidence
                seconds[j] += time.perf_counter() - t0
                refused[j] += 1
                not_applicable[j] += 1
                refusal[j] = refusal[j] or str(err)
                continue
            seconds[j] += time.perf_counter() - t0
            eps[j, rep], valid[j, rep] = b.epsilon, b.valid
            if b.applicable:
                kinds[j].add(b.kind)
                assumptions[j].add(b.assumption)
            else:  # the trivial 0, counted as not above the truth
                not_applicable[j] += 1
    rows = []
    for j, (method, _) in enumerate(meths):
        above = eps[j] > truth
        frac = float(np.mean(above))
        nominal = 1.0 - float(confidence)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = eps[j] / truth if np.isfinite(truth) and truth > 0 else np.zeros(reps)
        if not kinds[j]:
            kind = "not applicable"
        else:
            kind = kinds[j].pop() if len(kinds[j]) == 1 else "mixed"
        named = sorted(a for a in assumptions[j] if a is not None)
        row = {
            "method": method,
            "scenario": scen.name,
            "design": design.name,
            "inclusion": options[j].get("inclusion"),
            "kind": kind,
            "assumption": "; ".join(named) if named else None,
            "truth": truth,
            "exactness": scen.exactness,
            "delta": float(delta),
            "confidence": float(confidence),
            "reps": int(reps),
            "frac_not_applicable": float(not_applicable[j]) / reps,
            "frac_refused": float(refused[j]) / reps,
            "refusal": refusal[j],
            "n_in": int(design.n_in),
            "n_out": int(design.n_out),
            "frac_above": frac,
            "frac_above_se": _se(frac, reps),
            "nominal": nominal,
            "nominal_se": _se(nominal, reps),
            "median_ratio": float(np.median(ratio)),
            "median_epsilon": float(np.median(eps[j])),
            "frac_valid": float(np.mean(valid[j])),
            "frac_valid_above": float(np.mean(valid[j] & above)),
            "seconds": float(seconds[j]),
        }
        if keep:
            row["epsilons"] = eps[j].tolist()
            row["valid"] = valid[j].tolist()
        rows.append(row)
    return rows


def claim_study(
    scenarios: Iterable[Scenario | str] | Mapping[str, Scenario],
    *,
    reps: int,
    n_in: int | None = None,
    n_out: int | None = None,
    confidence: float = 0.95,
    seed: int = 0,
    claims: Mapping[str, Scenario | str] | None = None,
    designs: Iterable[Design | str] | None = None,
    progress: Callable[[str], None] | None = None,
    **claim_options: Any,
) -> list[dict]:
    """How often ``dpaudit.stats.claim.claim_test`` rejects a scenario's trade-off curve.

    Args:
        scenarios: the scenarios whose scores are drawn (objects or ``SCENARIOS`` names).
        reps: repetitions per scenario.
        n_in: member scores per draw (the study's own fixed design).
        n_out: non-member scores per draw.
        confidence: the claim test's confidence.
        seed: base seed (same draws as ``validity_study`` with the same seed).
        claims: optional map scenario name -> the scenario whose curves are claimed (default:
            the scenario itself, a correct claim; another one measures power or, when that
            one is less private, what a wrong-but-lenient claim does).
        designs: further designs, as in ``validity_study``.
        progress: called with a short line after each scenario.
        **claim_options: passed to ``claim_test`` (e.g. ``selection``).

    Returns:
        One row per (scenario, design): ``scenario``, ``design``, ``claimed`` (name of the
        claimed scenario), ``correct`` (claimed is the scenario itself), ``confidence``,
        ``reps``, ``n_in``, ``n_out``, ``frac_rejected`` and ``frac_rejected_se``,
        ``nominal`` (1 - confidence) and ``nominal_se``, ``median_margin``, ``seconds``. For a
        correct claim ``frac_rejected`` must be <= nominal + 3 nominal_se.
    """
    from dpaudit.stats.claim import claim_test

    _check_sizes(reps, 1, 1)
    plan = _designs(designs, n_in, n_out)
    rows = []
    for scen in _scenarios(scenarios):
        claimed = scen
        if claims is not None and scen.name in claims:
            claimed = _scenarios([claims[scen.name]])[0]
        for design, keyed in plan:
            rejected = np.zeros(reps, dtype=bool)
            margins = np.zeros(reps)
            t0 = time.perf_counter()
            for rep in range(reps):
                rng = draw_rng(seed, scen, rep, design if keyed else None)
                s_in, s_out = draw(scen, design, rng)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    res = claim_test(
                        s_in,
                        s_out,
                        claimed.tradeoff,
                        confidence=confidence,
                        tradeoff_reverse=claimed.tradeoff_reverse,
                        **claim_options,
                    )
                rejected[rep], margins[rep] = bool(res.rejected), float(res.margin)
            seconds = time.perf_counter() - t0
            frac = float(np.mean(rejected))
            nominal = 1.0 - float(confidence)
            rows.append(
                {
                    "scenario": scen.name,
                    "design": design.name,
                    "claimed": claimed.name,
                    "correct": claimed == scen,
                    "confidence": float(confidence),
                    "reps": int(reps),
                    "n_in": int(design.n_in),
                    "n_out": int(design.n_out),
                    "frac_rejected": frac,
                    "frac_rejected_se": _se(frac, reps),
                    "nominal": nominal,
                    "nominal_se": _se(nominal, reps),
                    "median_margin": float(np.median(margins)),
                    "seconds": seconds,
                }
            )
            if progress is not None:
                progress(
                    f"claim {claimed.name} on {scen.name} ({design.name}): rejected "
                    f"{frac:.3f}, {seconds:.1f} s"
                )
    return rows
