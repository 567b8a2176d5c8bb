"""The result object every epsilon lower bound returns (one shape for all methods)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np


def _jsonable(value: Any) -> Any:
    """Convert numpy scalars/arrays and non-finite floats to plain JSON values."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return [_jsonable(v) for v in value.tolist()]
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating, float)):
        v = float(value)
        return v if math.isfinite(v) else str(v)  # "inf", "-inf", "nan": strict JSON
    if isinstance(value, np.bool_):
        return bool(value)
    return value


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
        """Plain-JSON dictionary (non-finite floats become the strings "inf"/"-inf")."""
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
