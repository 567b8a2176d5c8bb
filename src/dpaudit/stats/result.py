"""The result object every epsilon lower bound returns (one shape for all methods)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dpaudit._jsonable import to_jsonable as _jsonable


@dataclass(frozen=True)
class EpsilonBound:
    """An empirical epsilon lower bound at a given delta and confidence.

    ``epsilon`` is 0.0 when nothing can be certified. ``threshold``, ``fpr_upper``,
    ``fnr_upper`` and ``mu_lower`` are filled by the methods that use them (None otherwise);
    ``details`` holds method-specific numbers (counts, bins, guess counts, ...).
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
                "details": dict(self.details),
            }
        )
