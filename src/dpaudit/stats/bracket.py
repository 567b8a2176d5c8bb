"""The largest parameter a monotone test still accepts, by a bracketed secant search.

The one-run bound (``one_run``) looks for the largest x at which a p-value that grows with x
is still below a level. A bisection to a relative width of 1e-6 - 1e-9 costs 20 - 30
p-values; the Illinois variant of regula falsi on log p (smooth in x) keeps the same bracket,
so the returned end is accepted exactly as a bisection's would be, in a third of the
evaluations.
"""

from __future__ import annotations

import math
from collections.abc import Callable


def largest_accepted(
    p: Callable[[float], float],
    accept: Callable[[float], bool],
    level: float,
    lo: float,
    hi: float,
    tol: float,
    g_ends: tuple[float, float] | None = None,
) -> float:
    """x in [lo, hi) with ``accept(p(x))`` and not ``accept(p(x'))`` for some
    x' <= x + tol * max(1, x).

    ``p``: the p-value, non-decreasing in x; ``accept``: the test at ``level`` (p <= level or
    p < level); ``lo`` must be accepted and ``hi`` not (the caller has checked both, or knows
    them from a cruder bracket). The returned lower end is always an accepted point.
    ``g_ends``: estimates of log(p / level) at lo and hi, when the caller has them (they only
    steer the first secant step; every decision is ``accept`` on an exact p-value).
    """
    log_level = math.log(level)

    def g(x: float) -> tuple[float, bool]:
        value = p(x)
        gx = math.log(value) - log_level if value > 0.0 else -math.inf
        return gx, accept(value)

    g_lo, g_hi = g_ends if g_ends is not None else (g(lo)[0], g(hi)[0])
    side = 0
    while hi - lo > tol * max(1.0, lo):
        width = hi - lo
        if math.isfinite(g_lo) and math.isfinite(g_hi) and g_hi > g_lo:
            mid = hi - g_hi * width / (g_hi - g_lo)
            mid = min(max(mid, lo + 1e-3 * width), hi - 1e-3 * width)  # keep off the ends
        else:
            mid = 0.5 * (lo + hi)
        g_mid, ok = g(mid)
        if ok:
            lo, g_lo = mid, g_mid
            if side == -1:  # Illinois: halve the stale end's weight
                g_hi *= 0.5
            side = -1
        else:
            hi, g_hi = mid, g_mid
            if side == 1:
                g_lo *= 0.5
            side = 1
    return lo
