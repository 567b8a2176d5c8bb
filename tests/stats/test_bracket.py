"""bracket.largest_accepted against closed forms."""

import math

import pytest
from scipy.special import ndtr, ndtri

from dpaudit.stats.bracket import largest_accepted


@pytest.mark.parametrize("root,level", [(3.0, 0.5), (0.2, 1e-6), (40.0, 1e-3)])
@pytest.mark.parametrize("strict", [False, True])
def test_finds_the_closed_form_root(root, level, strict):
    # p(x) = level * exp(x - root): accepted (p <= level) exactly for x <= root
    calls = []

    def p(x):
        calls.append(x)
        return level * math.exp(x - root)

    accept = (lambda v: v < level) if strict else (lambda v: v <= level)
    got = largest_accepted(p, accept, level, 0.0, 2 * root + 1, 1e-9)
    assert accept(p(got))
    assert root - 1e-9 * max(1.0, root) * 1.01 <= got <= root
    assert len(calls) < 20  # a bisection from this bracket needs 30 - 40


def test_steep_p_value_keeps_the_invariant():
    level = 0.01
    p = lambda x: ndtr(40 * (x - 1.234))  # noqa: E731  almost a step
    got = largest_accepted(p, lambda v: v <= level, level, 0.0, 5.0, 1e-10)
    root = 1.234 + ndtri(level) / 40  # p(root) = level
    assert p(got) <= level
    assert root - 1e-10 * 1.01 <= got <= root
