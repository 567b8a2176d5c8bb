"""The hook's ``canaries`` argument: input canaries, gradient canaries, or a list of both.

The two kinds live in ``input_canaries`` and ``gradient_canaries``; this module only names their
union and normalises the argument (DESIGN 3).
"""

from __future__ import annotations

from collections.abc import Sequence

from dpaudit.capture.gradient_canaries import POLICIES, GradientCanaries
from dpaudit.capture.input_canaries import InputCanaries
from dpaudit.gradients import LossFn

__all__ = ["POLICIES", "Canaries", "GradientCanaries", "InputCanaries", "LossFn", "as_canary_list"]

Canaries = InputCanaries | GradientCanaries


def as_canary_list(canaries: Canaries | Sequence[Canaries]) -> list[Canaries]:
    """Normalise the hook's ``canaries`` argument to a non-empty list (index order = list order)."""
    items = [canaries] if isinstance(canaries, InputCanaries | GradientCanaries) else canaries
    try:
        items = list(items)
    except TypeError:
        raise ValueError(
            "canaries must be InputCanaries, GradientCanaries or a list of them, "
            f"got {type(canaries).__name__}"
        ) from None
    if not items:
        raise ValueError("canaries must not be empty")
    for c in items:
        if not isinstance(c, InputCanaries | GradientCanaries):
            raise ValueError(
                f"canaries must be InputCanaries or GradientCanaries, got {type(c).__name__}"
            )
    return items
