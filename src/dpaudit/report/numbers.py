"""One formatter for every number a user reads (the message, the console, the banner, the
report's bracket picture): bounds rounded outward, levels said where they are used.

A bound shown rounded to the nearest digit can lie on the wrong side of what was computed: an
upper bound of 3.065 printed as "3.06" claims more than was shown. So an upper bound is
rounded up (``upper``), a lower bound down (``lower``), and only a point value (a claim, an
estimate) to the nearest (``point``); all to the same number of significant figures, so the
picture and the sentence never disagree on one number. ``level`` says a confidence or a
failure probability in one way everywhere.
"""

from __future__ import annotations

import math
from decimal import ROUND_CEILING, ROUND_FLOOR, ROUND_HALF_EVEN, Decimal

DIGITS = 3  # significant figures of every number a user reads


def _rounded(x: float, digits: int, mode: str) -> str:
    if x is None:
        return "n/a"
    x = float(x)
    if math.isnan(x):
        return "n/a"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if x == 0:
        return "0"
    # the shortest decimal that reads back as x: the number the user would type, so that an
    # exact 3.06 is not pushed to 3.07 by its binary representation's last bits
    d = Decimal(repr(x))
    exponent = d.adjusted() - digits + 1
    q = d.quantize(Decimal(1).scaleb(exponent), rounding=mode)
    text = f"{q:f}" if -6 <= q.adjusted() < 7 else f"{q:.{digits - 1}e}"
    if "." in text and "e" not in text:
        text = text.rstrip("0").rstrip(".")
    return text


def upper(x: float | None, digits: int = DIGITS) -> str:
    """An upper bound, rounded up to ``digits`` significant figures ("n/a" for None)."""
    return _rounded(x, digits, ROUND_CEILING)


def lower(x: float | None, digits: int = DIGITS) -> str:
    """A lower bound, rounded down to ``digits`` significant figures ("n/a" for None)."""
    return _rounded(x, digits, ROUND_FLOOR)


def point(x: float | None, digits: int = DIGITS) -> str:
    """A point value (a claim, an estimate), rounded to the nearest ("n/a" for None)."""
    return _rounded(x, digits, ROUND_HALF_EVEN)


def level(confidence: float | None = None, failure: float | None = None) -> str:
    """A level in words: "95%" for a confidence, "failure probability 1e-06" for a PRIVACY
    BUG's level (give exactly one)."""
    if (confidence is None) == (failure is None):
        raise ValueError("level: give exactly one of confidence and failure")
    if confidence is not None:
        pct = 100.0 * float(confidence)
        return f"{pct:.0f}%" if abs(pct - round(pct)) < 1e-9 else f"{pct:.3g}%"
    return f"failure probability {float(failure):.2g}"
