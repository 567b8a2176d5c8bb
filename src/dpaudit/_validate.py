"""Input checks shared across the package (statistics, estimators, canaries, the lab): clear
errors naming the parameter. A leaf: imports nothing from dpaudit."""

from __future__ import annotations

import numpy as np


def check_scores(x, name: str) -> np.ndarray:
    """Return ``x`` as a 1-d float64 array; reject empty or non-finite input."""
    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim != 1:
        arr = arr.reshape(-1)
    if arr.size == 0:
        raise ValueError(f"{name} is empty: expected at least one score")
    if not np.all(np.isfinite(arr)):
        bad = int(np.sum(~np.isfinite(arr)))
        raise ValueError(
            f"{name} contains {bad} non-finite value(s) (NaN or inf): scores must be finite"
        )
    return arr


def check_open_unit(value: float, name: str) -> float:
    """Require ``0 < value < 1`` (probabilities such as delta, confidence, FPR targets)."""
    v = float(value)
    if not np.isfinite(v) or not 0.0 < v < 1.0:
        raise ValueError(f"{name} must lie in the open interval (0, 1), got {value!r}")
    return v


def check_positive(value: float, name: str) -> float:
    """Require a finite ``value > 0``."""
    v = float(value)
    if not np.isfinite(v) or v <= 0.0:
        raise ValueError(f"{name} must be a finite positive number, got {value!r}")
    return v


def check_nonnegative(value: float, name: str) -> float:
    """Require a finite ``value >= 0``."""
    v = float(value)
    if not np.isfinite(v) or v < 0.0:
        raise ValueError(f"{name} must be a finite non-negative number, got {value!r}")
    return v
