"""The bug zoo's sampling bugs: Opacus' Poisson sampler patched as real loaders break it.

Each planter gives the ``UniformWithReplacementSampler`` of a ``DPDataLoader`` (its
``batch_sampler``) a buggy ``__iter__`` (``capture.patching.ClassPatch``: the loader object
stays the one the loop iterates, as when Opacus' sampler itself is patched) and returns the
exact restore. The sizes of every batch keep the law the accountant expects where the real
bug keeps it, so only the records of which examples each step used can tell:

* ``replayed_batches``: a sampler whose generator is re-seeded at the start of a pass (an
  epoch of ``len(sampler)`` steps) replays the previous pass's batches exactly; the fraction
  f of the passes after the first that do (1: every pass replays the first; 0.2: one pass in
  five);
* ``shuffled_binomial_batches``: each pass a random permutation of the data cut into batches
  of Binomial(n, q) sizes (the sizes are exactly Poisson sampling's; each example is used once
  per pass), on a fraction f of the passes (Poisson sampling on the others: f = 0.5, every
  second pass);
* ``shuffled_batches``: each pass a random permutation cut into fixed-size batches of the
  expected size, n q (the classic shuffled loader accounted as Poisson, Opacus #80);
* ``duplicated_examples``: on a fraction f of the steps the batch is drawn at rate q / 2 and
  every drawn example is put in twice (the same mean size; one example, two rows).

One more planter is not a bug of the zoo (``bugs.BUG_ZOO``), whose bugs are all refuted at
the PRIVACY BUG level: ``inflated_rate`` draws Poisson batches at q (1 + f) while the
accountant accounts q (a sampler given a rate a few percent off). At f = 0.05 no test of one
training refutes it; the training's epsilon as measured (``experiment.judging.premises``)
rises above the claim instead. Plant it with ``patch_sampler(loader, "inflated_rate", f)``.

The permutations and seeds are drawn from the sampler's own stream (its ``generator``, or
torch's global one, as the correct sampler draws), so a run is reproducible from its seed.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import numpy as np
import torch

from dpaudit.capture.patching import ClassPatch


def _every(t: int, fraction: float) -> bool:
    """Whether t is one of a fraction of the indices, evenly spread (1: every one)."""
    return math.floor((t + 1) * fraction) > math.floor(t * fraction)


def _seed(sampler) -> int:
    """A seed drawn from the sampler's own stream."""
    return int(torch.randint(0, 2**62, (1,), generator=sampler.generator))


def _poisson(sampler, rate: float) -> list[int]:
    """One Poisson draw at ``rate`` from the sampler's stream (what the correct sampler does)."""
    mask = torch.rand(sampler.num_samples, generator=sampler.generator) < rate
    return mask.nonzero(as_tuple=False).reshape(-1).tolist()


def _replayed(fraction: float):
    state = {"pass": 0, "seed": None}

    def batches(sampler):
        k = state["pass"]
        state["pass"] += 1
        if k == 0 or state["seed"] is None or not _every(k, fraction):
            state["seed"] = _seed(sampler)  # a fresh pass
        g = torch.Generator().manual_seed(state["seed"])  # re-seeded: the pass replays
        for _ in range(len(sampler)):
            mask = torch.rand(sampler.num_samples, generator=g) < sampler.sample_rate
            yield mask.nonzero(as_tuple=False).reshape(-1).tolist()

    return batches


def _permutation_cut(sampler, sizes) -> list[list[int]]:
    """A stream of random permutations of the data cut into consecutive batches of
    ``sizes``. Where a batch runs past the end of one permutation it is completed from the
    next one's examples that it does not hold yet (those it holds wait their turn), so no
    batch holds an example twice."""
    rng = np.random.default_rng(_seed(sampler))
    n = sampler.num_samples
    perm, pos, out = rng.permutation(n), 0, []
    for k in sizes:
        k = min(int(k), n)
        if pos + k <= n:
            out.append(perm[pos : pos + k].tolist())
            pos += k
            continue
        rest = perm[pos:]
        fresh = rng.permutation(n)
        held = np.isin(fresh, rest)
        fresh = np.concatenate([fresh[~held], fresh[held]])  # the held ones last
        need = k - rest.size
        out.append(rest.tolist() + fresh[:need].tolist())
        perm, pos = fresh, need
    return out


def _shuffled_binomial(fraction: float):
    state = {"pass": 0}

    def batches(sampler):
        k = state["pass"]
        state["pass"] += 1
        if not _every(k, fraction):
            for _ in range(len(sampler)):
                yield _poisson(sampler, sampler.sample_rate)
            return
        rng = np.random.default_rng(_seed(sampler))
        sizes = rng.binomial(sampler.num_samples, sampler.sample_rate, len(sampler))
        yield from _permutation_cut(sampler, sizes.tolist())

    return batches


def _shuffled_fixed(_fraction: float):
    def batches(sampler):
        n = sampler.num_samples
        size = max(1, round(n * sampler.sample_rate))
        per_pass = math.ceil(n / size)
        sizes = [size] * (per_pass - 1) + [n - size * (per_pass - 1)]
        rng = np.random.default_rng(_seed(sampler))
        perm = rng.permutation(n)
        cuts = np.cumsum([0, *sizes])
        for a, b in itertools.pairwise(cuts):
            yield perm[a:b].tolist()

    return batches


def _duplicated(fraction: float):
    state = {"t": 0}

    def batches(sampler):
        for _ in range(len(sampler)):
            t = state["t"]
            state["t"] += 1
            if _every(t, fraction):
                drawn = _poisson(sampler, sampler.sample_rate / 2.0)
                yield [i for i in drawn for _ in range(2)]
            else:
                yield _poisson(sampler, sampler.sample_rate)

    return batches


def _inflated(factor: float):
    def batches(sampler):
        rate = min(1.0, sampler.sample_rate * (1.0 + factor))
        for _ in range(len(sampler)):
            yield _poisson(sampler, rate)

    return batches


SAMPLER_PLANTERS: dict[str, Callable[[float], Callable]] = {
    "inflated_rate": _inflated,
    "replayed_batches": _replayed,
    "shuffled_binomial_batches": _shuffled_binomial,
    "shuffled_batches": _shuffled_fixed,
    "duplicated_examples": _duplicated,
}


def patch_sampler(data_loader, bug: str, factor: float) -> Callable[[], None]:
    """Give the Poisson sampler of ``data_loader`` the buggy ``__iter__`` of ``bug`` (module
    doc); returns the restore. A ValueError names ``data_loader`` when its batch sampler is
    not Opacus' ``UniformWithReplacementSampler``."""
    from opacus.utils.uniform_sampler import UniformWithReplacementSampler

    sampler = getattr(data_loader, "batch_sampler", None)
    if not isinstance(sampler, UniformWithReplacementSampler):
        raise ValueError(
            f"data_loader: sampling bug {bug!r} is planted on Opacus' Poisson sampler (a "
            "DPDataLoader's batch_sampler, UniformWithReplacementSampler), got "
            f"{type(sampler).__name__}")
    batches = SAMPLER_PLANTERS[bug](factor)

    def __iter__(self):
        yield from batches(self)

    return ClassPatch(sampler, {"__iter__": __iter__}, owner="plant_sampler_bug").apply().restore
