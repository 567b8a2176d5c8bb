"""Canaries that stay independent for the whole training, picked for any model in one call.

``pick_canaries(model, data)`` gives Dirac gradient canaries on coordinates no data gradient
can reach at any step, each a member (inserted at every step) with probability 1/2,
independently (seeded): the design the one-run bounds and the claim test assume. In order:

1. the audit's own block, when the model has one (``add_canary_block``, before
   ``make_private``): no data can reach it by construction;
2. else coordinates the model's structure keeps dead whatever the parameters
   (``dead_coordinates(kind="structural")``: weights of inputs that are zero in every
   example, embedding rows of ids the data never use), when ``data`` is given;
3. else none: the error says how to get some (``add_canary_block``).

Coordinates dead only at the initial parameters are never picked: training revives them. The
hook checks at every step that the data's clipped sum stays exactly zero on the canaries'
coordinates (``capture.independence``); ``AuditHook(canaries=None)`` picks them this way.
"""

from __future__ import annotations

import numpy as np
from torch import nn

from dpaudit.capture.canary_block import BLOCK_SIZE, NAME, STRESS_COUNT, CanaryBlock
from dpaudit.capture.gradient_canaries import GradientCanaries
from dpaudit.names import DATA_RATE_PER_SIDE

DEFAULT_COUNT = 1000  # the CLI's default number of gradient canaries
# the hook's default canaries (``default_canaries``): STRESS_COUNT every-step canaries, the
# stress test of the mechanism, and the canaries inserted like an example (the training
# data's threat model), sized for power: at least DATA_RATE_PER_SIDE per side where the
# coordinates allow; add_canary_block's default size (BLOCK_SIZE) holds both


def canary_block_of(model: nn.Module) -> CanaryBlock | None:
    """The model's canary block (``add_canary_block``), wrapped by Opacus or not, or None."""
    for module in model.modules():
        if isinstance(module, CanaryBlock):
            return module
    return None


def available_coordinates(model: nn.Module, data=None, params=None) -> tuple[np.ndarray, str]:
    """The coordinates no data gradient can reach at any step, and where they are: the
    model's canary block, else the structurally dead ones (module doc); a ValueError saying
    how to get some when there are none."""
    from dpaudit.capture.coordinates import dead_coordinates

    block = canary_block_of(model)
    if block is not None and params is None:
        return np.asarray(block.coordinates(model), dtype=np.int64), "the model's canary block"
    coords = np.zeros(0, dtype=np.int64)
    if data is not None:
        coords = dead_coordinates(model, data, params=params, kind="structural")
    if coords.size == 0:
        if block is not None:
            why = "params= leaves the model's canary block out"
        elif data is None:
            why = ("the model has no canary block, and no data was given to look for "
                   "coordinates its structure keeps dead")
        else:
            why = "the model has no canary block, and its structure keeps no coordinate dead"
        raise ValueError(
            f"no coordinates that no data gradient can reach ({why}): call "
            "dpaudit.capture.add_canary_block(model) before make_private (and before building "
            f"the optimizer) to give the audit a block of its own ({NAME}), or pass canaries "
            "(docs/python_api.md)")
    return coords, "coordinates the model's structure keeps dead on the data"


def default_canaries(model: nn.Module, data=None, *, sample_rate: float, seed: int = 0,
                     norm: float = 1.0, params=None) -> tuple[list[GradientCanaries], str]:
    """The hook's default canaries, two sets on disjoint coordinates no data gradient can
    reach (``available_coordinates``), each canary a member with probability 1/2:

    * the stress test: ``STRESS_COUNT`` Dirac canaries inserted at every step (the q = 1
      composition: a strong test of the mechanism, in another threat model than the data's);
    * the training data's threat model: Dirac canaries of norm C inserted like an example,
      each member independently with probability ``sample_rate`` (the data's q) at every
      step, ``DATA_RATE_PER_SIDE`` per side where the coordinates allow (the lower side of
      the user's epsilon; its power grows with their number).

    Returns the sets and a note: empty, or why the coordinates held fewer than that."""
    if not 0.0 < float(sample_rate) <= 1.0:
        raise ValueError(f"sample_rate must be in (0, 1], got {sample_rate!r}")
    from dpaudit.capture.coordinates import trainable_dim

    coords, where = available_coordinates(model, data, params)
    rng = np.random.default_rng(seed)
    coords = rng.permutation(coords)
    stress = min(STRESS_COUNT, max(1, coords.size // 3))
    rate = min(2 * DATA_RATE_PER_SIDE, coords.size - stress)
    dim = trainable_dim(model, params=params)
    sets = [GradientCanaries.dirac(
        np.sort(coords[:stress]).tolist(), norm=norm, dim=dim,
        policy=["every_step" if m else "never" for m in rng.random(stress) < 0.5])]
    note = ""
    if rate >= 2:
        members = rng.random(rate) < 0.5
        sets.append(GradientCanaries.dirac(
            np.sort(coords[stress:stress + rate]).tolist(), norm=norm, dim=dim,
            policy=["bernoulli" if m else "never" for m in members],
            inclusion_prob=float(sample_rate), seed=int(rng.integers(2**31))))
    if rate < 2 * DATA_RATE_PER_SIDE:
        note = (f"{where} holds {coords.size:,} coordinates: {rate // 2:,} canaries per side "
                f"inserted like an example, fewer than the {DATA_RATE_PER_SIDE:,} the lower side "
                f"needs for power (add_canary_block(model, size={BLOCK_SIZE}) gives them)")
    return sets, note


def pick_canaries(model: nn.Module, data=None, count: int | None = None, *, seed: int = 0,
                  norm: float = 1.0, params=None, inclusion: float = 0.5) -> GradientCanaries:
    """Dirac gradient canaries that stay independent for the whole training (module doc).

    Args:
        model: the model (after ``make_private`` or not; with ``add_canary_block`` before it).
        data: the training data (a ``Dataset``, a ``DataLoader`` or (inputs, targets)), read
            to find structurally dead coordinates when the model has no canary block.
        count: how many canaries (default: ``DEFAULT_COUNT``, at most what is available).
        seed: seeds the coordinates chosen and the memberships.
        norm: the canaries' norm (at most the clip bound C).
        params: the hook's parameter selection (coordinates are numbered in it), or None.
        inclusion: each canary's probability of being a member.
    """
    from dpaudit.capture.coordinates import trainable_dim

    if count is not None and (isinstance(count, bool) or not isinstance(count, int)
                              or count < 1):
        raise ValueError(f"count must be a positive integer, got {count!r}")
    block = canary_block_of(model)
    if block is not None and params is None:
        available = block.size
        k = min(count or DEFAULT_COUNT, available)
        return block.canaries(model, k, norm=norm, seed=seed, inclusion=inclusion)
    coords, _ = available_coordinates(model, data, params)
    rng = np.random.default_rng(seed)
    k = min(count or DEFAULT_COUNT, coords.size)
    chosen = np.sort(rng.choice(coords, k, replace=False))
    members = rng.random(k) < inclusion
    return GradientCanaries.dirac(chosen.tolist(), norm=norm,
                                  dim=trainable_dim(model, params=params),
                                  policy=["every_step" if m else "never" for m in members])
