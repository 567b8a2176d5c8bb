"""Canary candidates (DESIGN 3 step 2, 4.4): input candidates and gradient canaries.

Input candidates are (inputs, targets) pairs: in-distribution examples, mislabeled copies,
blank and crafted inputs; ``INPUT_SOURCES`` names each source an audit's ``canary.source``
accepts (a new source is its generator plus one line there). Their gradients are clipped to C
by ``per_sample_clipped_grads`` when ranked and by Opacus when trained on. Gradient canaries
are (K, d) vectors scaled to norm C (Dirac on chosen coordinates, random directions): a
gradient canary above C would let an audit exceed the true epsilon, so ``scale_to_norm`` never
returns one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from dpaudit._validate import check_positive
from dpaudit.seeds import as_generator


@dataclass
class InputCandidates:
    """Candidate input canaries with their origin: ``kind[i]`` and source index ``source[i]``."""

    inputs: torch.Tensor
    targets: torch.Tensor
    kind: list[str]
    source: np.ndarray

    def __len__(self) -> int:
        return int(self.inputs.shape[0])

    def subset(self, idx) -> InputCandidates:
        """The candidates at positions ``idx``."""
        i = np.asarray(idx, dtype=np.int64)
        t = torch.as_tensor(i, device=self.inputs.device)
        return InputCandidates(
            self.inputs[t], self.targets[t], [self.kind[j] for j in i], self.source[i]
        )

    @staticmethod
    def concat(parts: Sequence[InputCandidates]) -> InputCandidates:
        """Stack several candidate sets (same input shape)."""
        if not parts:
            raise ValueError("parts must contain at least one InputCandidates")
        return InputCandidates(
            torch.cat([p.inputs for p in parts]),
            torch.cat([p.targets for p in parts]),
            [k for p in parts for k in p.kind],
            np.concatenate([p.source for p in parts]),
        )


def in_distribution(
    inputs: torch.Tensor,
    targets: torch.Tensor,
    num: int | None = None,
    seed: int | np.random.Generator | None = 0,
) -> InputCandidates:
    """Real examples as candidates: all of them, or ``num`` drawn without replacement."""
    n = int(inputs.shape[0])
    if num is None:
        idx = np.arange(n)
    else:
        if not 1 <= int(num) <= n:
            raise ValueError(f"num must be in [1, {n}], got {num!r}")
        idx = np.sort(as_generator(seed).choice(n, size=int(num), replace=False))
    t = torch.as_tensor(idx, device=inputs.device)
    return InputCandidates(inputs[t], targets[t], ["in_distribution"] * len(idx), idx)


def mislabeled(
    inputs: torch.Tensor,
    targets: torch.Tensor,
    num_classes: int,
    num: int | None = None,
    seed: int | np.random.Generator | None = 0,
) -> InputCandidates:
    """Copies of real examples with the label replaced by a different, uniformly drawn class."""
    if int(num_classes) < 2:
        raise ValueError(f"num_classes must be >= 2, got {num_classes!r}")
    rng = as_generator(seed)
    base = in_distribution(inputs, targets, num, rng)
    old = base.targets.cpu().numpy()
    shift = rng.integers(1, int(num_classes), size=old.shape[0])
    new = torch.as_tensor((old + shift) % int(num_classes), device=targets.device)
    kind = ["mislabeled"] * len(old)
    return InputCandidates(base.inputs, new.to(targets.dtype), kind, base.source)


def blank_inputs(
    input_shape: Sequence[int],
    num_classes: int,
    value: float = 0.0,
    device: torch.device | str | None = None,
) -> InputCandidates:
    """One constant image per class (all pixels ``value``), labelled 0 .. num_classes - 1."""
    if int(num_classes) < 1:
        raise ValueError(f"num_classes must be >= 1, got {num_classes!r}")
    shape = tuple(int(s) for s in input_shape)
    x = torch.full((int(num_classes), *shape), float(value), device=device)
    y = torch.arange(int(num_classes), device=device)
    return InputCandidates(x, y, ["blank"] * int(num_classes), np.full(int(num_classes), -1))


def crafted_inputs(
    inputs: torch.Tensor,
    num_classes: int,
    num: int,
    value: float = 100.0,
) -> InputCandidates:
    """One-hot input canaries on the features the data never use: all zero except ``value``
    on one feature, one candidate per (feature, class) pair, least used features first.

    Features are ordered by mean |x| over ``inputs`` (those zero in every example first, ties
    by index). For a first linear layer the canary's weight gradient is x_j (p - e_y): it lies
    on the weights of feature j, which no data example's gradient touches when x_j is always
    zero, and its norm grows with ``value`` (far above any clip norm for a large value).
    ``source`` holds the feature index of each candidate.
    """
    if int(num_classes) < 1:
        raise ValueError(f"num_classes must be >= 1, got {num_classes!r}")
    check_positive(value, "value")
    flat = inputs.reshape(inputs.shape[0], -1)
    d = int(flat.shape[1])
    if not 1 <= int(num) <= d * int(num_classes):
        pool = d * int(num_classes)
        raise ValueError(f"num must be in [1, {pool}] (features x classes), got {num!r}")
    activity = flat.abs().double().mean(0).cpu().numpy()
    order = np.lexsort((np.arange(d), activity))  # least used first, ties by index
    pairs = [(int(f), c) for f in order for c in range(int(num_classes))][: int(num)]
    feats = np.array([f for f, _ in pairs], dtype=np.int64)
    x = torch.zeros(len(pairs), d, dtype=inputs.dtype, device=inputs.device)
    x[torch.arange(len(pairs)), torch.as_tensor(feats, device=inputs.device)] = float(value)
    y = torch.tensor([c for _, c in pairs], dtype=torch.int64, device=inputs.device)
    x = x.reshape(len(pairs), *inputs.shape[1:])
    return InputCandidates(x, y, ["crafted"] * len(pairs), feats)


def crafted_distinct_inputs(
    inputs: torch.Tensor,
    num_classes: int,
    num: int,
    value: float = 100.0,
) -> InputCandidates:
    """One-hot input canaries on ``num`` DISTINCT least-used features, one label each
    (the classes in turn, least used feature first: class 0, 1, ...): ``crafted_inputs`` with
    one canary per feature, so that no two canaries share their first-layer weight column.
    On features no example uses, each canary's weight gradient lies on its own column, which
    only it and the noise reach (the bias is shared with everything): nearly separate
    experiments trained together, the black box's best case in one run. ``source`` holds the
    feature index of each candidate."""
    if int(num_classes) < 1:
        raise ValueError(f"num_classes must be >= 1, got {num_classes!r}")
    check_positive(value, "value")
    flat = inputs.reshape(inputs.shape[0], -1)
    d = int(flat.shape[1])
    if not 1 <= int(num) <= d:
        raise ValueError(f"num must be in [1, {d}] (one canary per feature), got {num!r}")
    activity = flat.abs().double().mean(0).cpu().numpy()
    feats = np.lexsort((np.arange(d), activity))[: int(num)]  # least used first, ties by index
    x = torch.zeros(len(feats), d, dtype=inputs.dtype, device=inputs.device)
    x[torch.arange(len(feats)), torch.as_tensor(feats, device=inputs.device)] = float(value)
    y = torch.arange(len(feats), device=inputs.device) % int(num_classes)
    x = x.reshape(len(feats), *inputs.shape[1:])
    return InputCandidates(x, y, ["crafted_distinct"] * len(feats), feats.astype(np.int64))


def scale_to_norm(vectors: torch.Tensor, norm: float, clip_only: bool = False) -> torch.Tensor:
    """Rows rescaled to L2 norm ``norm`` (or, with ``clip_only``, only those above it)."""
    c = check_positive(norm, "norm")
    if vectors.ndim != 2:
        raise ValueError(f"vectors must be (K, d), got shape {tuple(vectors.shape)}")
    norms = vectors.norm(dim=1, keepdim=True)
    if bool((norms == 0).any()) and not clip_only:
        raise ValueError("vectors contains a zero row: it cannot be scaled to a norm")
    factor = c / norms if not clip_only else (c / norms.clamp_min(1e-300)).clamp(max=1.0)
    return vectors * factor


def dirac_canaries(
    dim: int,
    coordinates: Sequence[int],
    norm: float,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """(K, d) gradient canaries with a single non-zero coordinate each, of value ``norm``."""
    coords = np.asarray(coordinates, dtype=np.int64).reshape(-1)
    if coords.size == 0 or coords.min() < 0 or coords.max() >= int(dim):
        raise ValueError(f"coordinates must be non-empty indices in [0, {dim}), got {coordinates}")
    out = torch.zeros(coords.size, int(dim), device=device, dtype=dtype)
    out[torch.arange(coords.size), torch.as_tensor(coords)] = check_positive(norm, "norm")
    return out


def random_direction_canaries(
    dim: int,
    num: int,
    norm: float,
    seed: int | torch.Generator,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """(K, d) isotropic random directions of norm ``norm`` (seeded torch generator)."""
    if int(num) < 1 or int(dim) < 1:
        raise ValueError(f"num and dim must be >= 1, got num={num!r}, dim={dim!r}")
    gen = seed if isinstance(seed, torch.Generator) else torch.Generator().manual_seed(int(seed))
    v = torch.randn(int(num), int(dim), generator=gen, dtype=torch.float64)
    return scale_to_norm(v, norm).to(device=device, dtype=dtype)


@dataclass(frozen=True)
class CandidateSource:
    """An input-canary source of the audit: ``make(inputs, targets, num_classes, num, rng,
    value)`` builds the candidates from the training data (``num``: how many are asked for,
    each source caps it; ``value``: the crafted feature value). ``held_out``: the candidates
    are training rows (``source`` holds their indices), which the audit removes from the data.
    """

    make: Callable[..., InputCandidates]
    held_out: bool = False


def _in_distribution_source(inputs, targets, num_classes, num, rng, value) -> InputCandidates:
    return in_distribution(inputs, targets, num=min(num, len(inputs) // 2), seed=rng)


def _mislabeled_source(inputs, targets, num_classes, num, rng, value) -> InputCandidates:
    return mislabeled(inputs, targets, num_classes, num=min(num, len(inputs) // 2), seed=rng)


def _blank_source(inputs, targets, num_classes, num, rng, value) -> InputCandidates:
    return blank_inputs(inputs.shape[1:], num_classes, device=inputs.device)


def _crafted_source(inputs, targets, num_classes, num, rng, value) -> InputCandidates:
    num = min(num, inputs[0].numel() * num_classes)
    return crafted_inputs(inputs, num_classes, num=num, value=value)


def _crafted_distinct_source(inputs, targets, num_classes, num, rng, value) -> InputCandidates:
    return crafted_distinct_inputs(inputs, num_classes, num=min(num, inputs[0].numel()),
                                   value=value)


INPUT_SOURCES: dict[str, CandidateSource] = {
    "in_distribution": CandidateSource(_in_distribution_source, held_out=True),
    "mislabeled": CandidateSource(_mislabeled_source),
    "blank": CandidateSource(_blank_source),
    "crafted": CandidateSource(_crafted_source),
    "crafted_distinct": CandidateSource(_crafted_distinct_source),
}
