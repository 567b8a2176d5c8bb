"""The result object every epsilon lower bound returns (one shape for all methods)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dpaudit._jsonable import to_jsonable as _jsonable

# The models that estimates assume (the ``assumption`` of an ``EpsilonBound``).
ASSUME_GDP = (
    "GDP-shaped trade-off curve (epsilon of the mu-GDP curve at the lower confidence value of mu)"
)
ASSUME_GAUSSIAN_SCORES = "Gaussian equal-variance scores (mu from means and variances)"


@dataclass(frozen=True)
class EpsilonBound:
    """An empirical epsilon lower bound at a given delta and confidence.

    ``epsilon`` is 0.0 when nothing can be certified. ``threshold``, ``fpr_upper``,
    ``fnr_upper`` and ``mu_lower`` are filled by the methods that use them (None otherwise);
    ``details`` holds method-specific numbers (counts, bins, guess counts, ...).

    Two kinds of evidence (DESIGN 4.5): ``assumption is None`` means the number is
    *certified*: it holds at ``confidence`` whatever the mechanism's score distribution.
    Otherwise ``assumption`` names the model the number is computed under (e.g. a GDP-shaped
    trade-off curve): an *estimate*, tight when the model holds, never a bound.

    ``applicable=False`` marks a method whose bound degenerates on this input for a reason
    other than the scores (e.g. ``one_run`` when m * delta is not << 1): ``epsilon`` is then
    the trivial 0.0, ``kind`` is ``"not applicable"``, it is not evidence, and ``note`` says
    why. ``note`` may also carry a caveat on an applicable result.
    """

    epsilon: float
    method: str
    confidence: float
    delta: float
    n_in: int
    n_out: int
    threshold: float | None = None
    fpr_upper: float | None = None
    fnr_upper: float | None = None
    mu_lower: float | None = None
    valid: bool = True
    details: dict[str, Any] = field(default_factory=dict)
    assumption: str | None = None
    applicable: bool = True
    note: str | None = None

    @property
    def certified(self) -> bool:
        """True when the number holds without a distributional assumption (and is valid)."""
        return self.assumption is None and self.valid and self.applicable

    @property
    def kind(self) -> str:
        """``"certified"``, ``"estimate"`` or ``"not applicable"`` (class docstring)."""
        if not self.applicable:
            return "not applicable"
        return "certified" if self.assumption is None else "estimate"

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON dictionary (non-finite floats become the strings "inf", "-inf", "nan")."""
        return _jsonable(
            {
                "epsilon": self.epsilon,
                "method": self.method,
                "confidence": self.confidence,
                "delta": self.delta,
                "n_in": self.n_in,
                "n_out": self.n_out,
                "threshold": self.threshold,
                "fpr_upper": self.fpr_upper,
                "fnr_upper": self.fnr_upper,
                "mu_lower": self.mu_lower,
                "valid": self.valid,
                "kind": self.kind,
                "assumption": self.assumption,
                "applicable": self.applicable,
                "note": self.note,
                "details": dict(self.details),
            }
        )
