"""Typed, versioned audit results: what ``results.json`` holds (docs/results.md).

``AuditResult`` is one audit's result; its ``verdict`` is a ``Verdict``, its ``bounds``
``BoundRow`` s and its claim tests ``ClaimRow`` s, all frozen dataclasses. ``to_dict`` is the
serialisation ``results.json`` is written from (every field, None as null, keys not part of
the schema kept in ``extra`` and written back; non-finite floats are written as "nan" /
"inf" and read back as floats in typed fields); ``from_dict`` reads it back, also from files of
older schema versions (``READS_FROM``), and refuses a file of a newer one or one without the
keys every audit has, naming the key. ``run_audit`` returns ``AuditResult.to_dict()`` of the
same object, so the Python API and the file agree.

The verdict statuses are defined here once (``STATUSES``): the evaluation sets them, the plots
colour them, ``dpaudit-aggregate`` tabulates them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from dpaudit.report.provenance import SCHEMA_VERSION

# the user's claim's status (schema 6), worst first: certified evidence refutes it; an
# estimate (or an uncertified claim test) exceeds it; a premise of it could not be observed;
# nothing refutes it and every premise was measured
PRIVACY_BUG, ESTIMATE_ABOVE_CLAIM, NOT_VERIFIED, CONSISTENT = STATUSES = (
    "privacy_bug", "estimate_above_claim", "not_verified", "consistent",
)
KINDS = ("certified", "estimate", "not applicable")
READS_FROM = 2  # the oldest schema version from_dict reads (release 0.1.0's results.json)
_NON_FINITE = ("nan", "inf", "-inf")  # how results.json writes non-finite floats


def _typed(cls, d: Any, where: str) -> tuple[dict, dict]:
    """``d`` split into (the dataclass's fields, every other key), refusing a non-mapping."""
    if not isinstance(d, dict):
        raise ValueError(f"{where} must be a mapping, got {type(d).__name__}")
    floats = {f.name for f in fields(cls) if "float" in str(f.type)}
    names = {f.name for f in fields(cls)} - {"extra"}
    known = {k: (float(v) if k in floats and v in _NON_FINITE else v)
             for k, v in d.items() if k in names}
    return known, {k: v for k, v in d.items() if k not in names}


def _require(d: dict, keys: tuple[str, ...], where: str) -> None:
    missing = [k for k in keys if k not in d]
    if missing:
        raise ValueError(f"{where} lacks {', '.join(missing)}")


class _Record:
    """``to_dict``: every field (None as null), then ``extra``'s keys."""

    def to_dict(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "extra"}
        out.update(getattr(self, "extra", {}) or {})
        return out


@dataclass(frozen=True)
class BoundRow(_Record):
    """One (attack, method) epsilon bound: ``kind`` ``"certified"`` / ``"estimate"`` /
    ``"not applicable"``; ``assumption`` the model an estimate is computed under (None for a
    certified row); ``result`` the method's full ``EpsilonBound`` (None when it failed, then
    ``error`` says why); ``confidence`` the row's share of the audit's confidence."""

    attack: str
    method: str
    confidence: float
    epsilon: float
    kind: str
    valid: bool = False
    mu_lower: float | None = None
    assumption: str | None = None
    result: dict | None = None
    error: str | None = None
    confidence_is: str | None = None
    extra: dict = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: dict) -> BoundRow:
        known, extra = _typed(cls, d, "a bound row")
        _require(known, ("attack", "method", "confidence", "epsilon", "kind"), "a bound row")
        if known["kind"] not in KINDS:
            raise ValueError(f"a bound row's kind must be one of {KINDS}, got {known['kind']!r}")
        return cls(**known, extra=extra)

    @property
    def certified(self) -> bool:
        return self.kind == "certified"


@dataclass(frozen=True)
class ClaimRow(_Record):
    """One attack's claim test: ``rejected`` (the claimed trade-off curve is violated),
    ``certified`` (whether that statement is certified), ``mu_lower`` / ``sigma_upper`` and the
    accountant's epsilon at ``sigma_upper``; ``test`` the threshold test's details. One-run
    claim tests (canaries trained together) also name their ``method`` and may be not
    ``applicable`` (``error`` says why)."""

    rejected: bool
    certified: bool
    mu_lower: float | None
    sigma_upper: float | None
    noise_multiplier: float | None = None
    epsilon_at_sigma_upper: float | None = None
    epsilon_at_sigma_upper_kind: str | None = None
    test: dict | None = None
    method: str | None = None
    applicable: bool | None = None
    error: str | None = None
    refuted: bool | None = None
    refutation_level: float | None = None
    extra: dict = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: dict) -> ClaimRow:
        known, extra = _typed(cls, d, "a claim row")
        _require(known, ("rejected", "certified", "mu_lower", "sigma_upper"), "a claim row")
        return cls(**known, extra=extra)


@dataclass(frozen=True)
class Verdict(_Record):
    """The audit's verdict (docs/evidence.md): ``status`` one of ``STATUSES``; the best
    certified epsilon (``best_lower_bound``, 0 when none applies) and the best estimate next to
    ``claimed_epsilon``; the attacks whose certified claim test rejects the claim
    (``claim_rejected_by``), the white-box checks that fired, and the effective-noise bound
    ``sigma_upper``. ``message`` says it in one paragraph. A PRIVACY BUG needs a refutation at
    ``refutation_level`` (its failure probability, far below the bounds' 1 - ``confidence``);
    evidence at the bounds' level only is listed in ``warnings`` (and the white-box checks
    behind it in ``white_box_warned``). ``training_data`` (schema 5) answers the user's
    question in their numbers: the training's epsilon claimed (``epsilon_claimed``), as
    measured at most (``epsilon_upper``) and certified at least (``epsilon_lower``), null
    where not measured, with every ``premises`` entry (name, measured value or interval,
    status) and the ``sentence`` that opens ``message`` (docs/results.md)."""

    status: str
    privacy_bug: bool
    message: str
    confidence: float
    threat_model: str
    accountant: str
    claimed_epsilon: float
    best_lower_bound: float
    certified_bound_applies: bool
    best_attack: str | None
    best_method: str | None
    ratio: float
    best_estimate: float
    estimate_attack: str | None
    estimate_method: str | None
    estimate_assumption: str | None
    estimate_ratio: float
    claim_rejected_by: list
    white_box_fired: list
    claim_rejected_uncertified: list
    sigma_upper: float
    sigma_upper_attack: str | None
    sigma_upper_certified: bool
    noise_multiplier: float
    training_data_note: str = ""
    refutation_level: float | None = None  # schema 4; None: read from an older file
    warnings: list = field(default_factory=list)
    white_box_warned: list = field(default_factory=list)
    training_data: dict | None = None  # schema 5; None: not measured, or an older file
    # schema 6: the user's claim as resolved (accountant, history, delta, target), whether
    # its upper side is verified, and the canaries of another threat model (the every-step
    # stress test of the mechanism), reported apart with their own claim and numbers
    claim: dict | None = None
    verified: bool | None = None
    stress_test: dict | None = None
    extra: dict = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: dict, schema_version: int = SCHEMA_VERSION) -> Verdict:
        if schema_version <= 2 and isinstance(d, dict):  # 0.1.0: "upper_bound" = the claim
            d = {k: v for k, v in d.items() if k != "upper_bound"}
        known, extra = _typed(cls, d, "the verdict")
        optional = ("extra", "training_data_note", "refutation_level", "warnings",
                    "white_box_warned", "training_data", "claim", "verified", "stress_test")
        required = tuple(f.name for f in fields(cls) if f.name not in optional)
        _require(known, required, "the verdict")
        if known["status"] not in STATUSES:
            raise ValueError(f"verdict status must be one of {STATUSES}, got "
                             f"{known['status']!r}")
        if known["privacy_bug"] != (known["status"] == PRIVACY_BUG):
            raise ValueError("the verdict's privacy_bug disagrees with its status")
        return cls(**known, extra=extra)


@dataclass(frozen=True)
class AuditResult(_Record):
    """One audit's result, as ``results.json`` holds it (docs/results.md lists every key).

    ``settings``: the resolved settings; ``attacks``: AUC and TPR at low FPR per attack;
    ``claim`` / ``one_run_claim``: attack -> ``ClaimRow``; ``bounds``: the ``BoundRow`` s;
    ``theory``: the threat model and its accountants (``claimed_epsilon``); ``white_box``: the
    per-step invariant checks; ``verdict``: the ``Verdict``; ``confidence``: how the
    confidence is split over the statements; ``canary_info``, ``engine_accountants``,
    ``timing``, ``plots`` / ``plot_sha256`` (when written to a directory), ``provenance``.
    Keys of other origins (``wall_seconds``, a multi-run audit's ``runs_done`` ...) are in
    ``extra``."""

    settings: dict | None
    verdict: Verdict
    bounds: tuple[BoundRow, ...]
    claim: dict[str, ClaimRow]
    one_run_claim: dict[str, ClaimRow] = field(default_factory=dict)
    attacks: dict = field(default_factory=dict)
    theory: dict = field(default_factory=dict)
    white_box: dict | None = None
    audit_mode: dict | None = None
    steps: int | None = None
    sample_rate: float | None = None
    test_accuracy: float | None = None
    per_test_confidence: float | None = None
    refutation_per_statement: float | None = None
    independent_canaries: bool | None = None
    canary_info: dict | None = None
    engine_accountants: dict | None = None
    timing: dict | None = None
    confidence: dict | None = None
    plots: dict | None = None
    plot_sha256: dict | None = None
    schema_version: int = SCHEMA_VERSION
    provenance: dict | None = None
    extra: dict = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: dict) -> AuditResult:
        """Read a result (``json.load`` of ``results.json``, or ``run_audit``'s dict).

        Raises:
            ValueError: not an audit's result (no verdict, bounds or claim: another task's
                file), a file of a newer schema than this dpaudit reads, or a malformed part,
                each named."""
        known, extra = _typed(cls, d, "a result")
        _require(known, ("verdict", "bounds", "claim"), "an audit result")
        version = known.get("schema_version", READS_FROM)
        if not isinstance(version, int) or version > SCHEMA_VERSION:
            raise ValueError(f"schema_version {version!r} is newer than this dpaudit reads "
                             f"({READS_FROM} to {SCHEMA_VERSION}): upgrade dpaudit")
        theory = known.get("theory") or {}
        if version <= 2:  # 0.1.0 repeated the claim as theory.upper_bound
            theory = {k: v for k, v in theory.items() if k != "upper_bound"}
        if not isinstance(known["bounds"], list):
            raise ValueError("a result's bounds must be a list of rows")
        return cls(**{
            **known,
            "settings": known.get("settings"),
            "verdict": Verdict.from_dict(known["verdict"], version),
            "bounds": tuple(BoundRow.from_dict(b) for b in known["bounds"]),
            "claim": {a: ClaimRow.from_dict(c) for a, c in known["claim"].items()},
            "one_run_claim": {a: ClaimRow.from_dict(c)
                              for a, c in (known.get("one_run_claim") or {}).items()},
            "theory": theory,
            "schema_version": SCHEMA_VERSION,
        }, extra=extra)

    @classmethod
    def read(cls, path: str | Path) -> AuditResult:
        """``from_dict`` of the ``results.json`` at ``path`` (ValueError naming the file)."""
        try:
            return cls.from_dict(json.loads(Path(path).read_text()))
        except (ValueError, TypeError) as err:
            raise ValueError(f"{path}: {err}") from err

    def to_dict(self) -> dict:
        out = super().to_dict()
        out["verdict"] = self.verdict.to_dict()
        out["bounds"] = [b.to_dict() for b in self.bounds]
        out["claim"] = {a: c.to_dict() for a, c in self.claim.items()}
        out["one_run_claim"] = {a: c.to_dict() for a, c in self.one_run_claim.items()}
        return out

    @property
    def status(self) -> str:
        return self.verdict.status

    def bound(self, attack: str, method: str) -> BoundRow:
        """The bound row of ``attack`` and ``method`` (KeyError naming both if absent)."""
        for b in self.bounds:
            if b.attack == attack and b.method == method:
                return b
        raise KeyError(f"no bound row for attack {attack!r} and method {method!r}")
