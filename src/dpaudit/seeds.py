"""The seed streams of an audit, named in one place, and the one RNG helper.

Every random draw derives its own numpy generator from the user's ``seed`` and a tag,
``np.random.default_rng([seed, TAG])`` (``[seed, r, RUN_BIT]`` for run ``r``), so the streams
never overlap, a draw can be traced to its stream, and no draw touches the global RNGs that
the user's training uses. The tag values are those the published numbers were produced with:
changing one changes every audit's numbers. A leaf: imports nothing from dpaudit.
"""

from __future__ import annotations

import numbers

import numpy as np

# One-run audits: the canaries' membership bits (``canary_setup.draw_membership``).
MEMBERSHIP = 0xC0FFEE
# Canary set-up: reference points, candidate pools, input canaries (``setup_canaries``).
CANARY_SETUP = 1
# Dirac placement: the tie-break among equally active coordinates.
DIRAC_TIEBREAK = 2
# Gradient canaries: the per-step Bernoulli inclusion draws (``policy="bernoulli"``).
BERNOULLI_INCLUSION = 3
# Dirac placement ``random_live``: which live coordinates carry the canaries.
LIVE_PLACEMENT = 4
# Multi-run audits: the membership bit of run r, ``[seed, r, RUN_BIT]``.
RUN_BIT = 7
# Figure 3's game (references, candidates, memberships, subsamples). The same value as
# BERNOULLI_INCLUSION, kept for the published Figure 3 numbers: the two never meet, since
# Figure 3 audits input canaries and draws no Bernoulli inclusions.
FIGURE3_GAME = 3
# The simulated Clopper-Pearson bound that says before training what an audit can show.
POWER_SIMULATION = 0xB0B
# Statistics: the random order in which tied scores are broken (``stats.ties``), drawn
# independently of membership, so that tied scores neither inflate nor hide evidence.
TIE_BREAK = 0x71E
# One-run audits with inclusion probability p != 1/2: the auditor's virtual fair-coin
# labels (``stats.inclusion.virtual_labels``).
VIRTUAL_LABELS = 0x1AB
# The hook's clipping check: which examples are probed and on which steps.
CLIP_CHECK = 0xC11
# The hook's noise sketch: which coordinates are sampled for the marginal law, which steps'
# alignment is also tested alone.
NOISE_SKETCH = 0x5EED
# The hook's noise probe: which steps after the first run add_noise on zero clipped sums.
NOISE_PROBE = 0x9B0E
# One-run audits' canaries inserted like an example (``canary.lower_side``): which of the
# canary block's coordinates are members, and their per-step Bernoulli(q) inclusion draws.
DATA_RATE_MEMBERSHIP = 0xDA7A
DATA_RATE_INCLUSION = 0xDA7B


def stream(seed, tag: int) -> np.random.Generator:
    """The generator of stream ``tag`` for the user's ``seed``: ``default_rng([seed, tag])``."""
    return np.random.default_rng([seed, tag])


def run_bit(seed: int, r: int, inclusion: float) -> bool:
    """Membership bit of run ``r`` of a multi-run audit: a Bernoulli(``inclusion``) draw from
    ``[seed, r, RUN_BIT]``, independent of the order in which runs are made."""
    return bool(np.random.default_rng([seed, r, RUN_BIT]).random() < inclusion)


def run_seed(seed: int, r: int) -> int:
    """The training seed of run ``r`` of a multi-run audit or experiment (a 32-bit integer)."""
    return int(np.random.SeedSequence([seed, r]).generate_state(1)[0])


def as_generator(seed, name: str = "seed") -> np.random.Generator:
    """A numpy Generator from a Generator (returned as is), an integer seed or a sequence of
    them. ``None`` (an unseeded draw) raises ValueError naming ``name``: every draw is seeded."""
    if isinstance(seed, np.random.Generator):
        return seed
    if seed is None or isinstance(seed, bool):
        raise ValueError(
            f"{name} must be a numpy.random.Generator or an integer seed (every draw is "
            f"seeded), got {seed!r}"
        )
    return np.random.default_rng(int(seed) if isinstance(seed, numbers.Number) else seed)
