"""model.init=pretrained: the worst-case initial model, pre-trained on records the audit does
not train on (data's unused_train), seeded and refused where there are none."""

import numpy as np
import pytest
import torch

from dpaudit.data import load_dataset
from dpaudit.experiment.trainings.pretrain import pretrain
from dpaudit.models import build_model


def test_unused_train_is_the_rest_of_the_training_split():
    """Rows tagged by an id feature (0 .. n-1): the audited subset, unused_train and the test
    rows are standardised by one affine map (the subset's statistics), so distinct values are
    distinct rows: the three are disjoint and together every row."""
    from dpaudit.data import _split_standardised

    n = 120
    x = np.column_stack([np.arange(n, dtype=float),
                         np.random.default_rng(0).normal(size=(n, 3))])
    train, test, info = _split_standardised("toy", x, np.arange(n) % 10, (4,), 7, 0.25, 50)
    rest = info.extra["unused_train"]
    ids = [set(np.round(d.tensors[0].numpy()[:, 0].astype(np.float64), 4))
           for d in (train, rest, test)]
    assert [len(i) for i in ids] == [50, 40, 30]
    assert len(ids[0] | ids[1] | ids[2]) == n  # disjoint, and every row
    xs = train.tensors[0].numpy()[:, 0]
    assert abs(xs.mean()) < 1e-5 and abs(xs.std() - 1) < 1e-5  # the subset's own statistics
    assert "unused_train" not in load_dataset("digits", seed=2)[2].extra


def test_pretraining_is_seeded_and_lowers_the_loss():
    _, _, info = load_dataset("digits", seed=0, n_train=200)
    rest = info.extra["unused_train"]
    models = [build_model("logreg", (1, 8, 8), 10, seed=0) for _ in range(2)]
    out = [pretrain(m, rest, epochs=2, lr=0.05, batch_size=32, seed=5) for m in models]
    assert out[0] == out[1] and out[0]["loss_decreased"] and out[0]["records"] == len(rest)
    assert all(torch.equal(a, b) for a, b in zip(models[0].parameters(),
                                                 models[1].parameters(), strict=True))
    state = torch.random.get_rng_state()
    pretrain(build_model("logreg", (1, 8, 8), 10, seed=0), rest, epochs=1, lr=0.05,
             batch_size=32, seed=5)
    assert torch.equal(state, torch.random.get_rng_state())  # the caller's stream untouched


def test_pretrained_init_needs_records_to_pretrain_on():
    from dpaudit.experiment import run_audit

    with pytest.raises(ValueError, match=r"data\.n_train"):
        run_audit(model={"init": "pretrained"}, progress=False)
    with pytest.raises(ValueError, match="no records to pre-train on"):
        pretrain(build_model("logreg", (4,), 2), torch.utils.data.TensorDataset(
            torch.zeros(0, 4), torch.zeros(0, dtype=torch.long)), epochs=1, lr=0.1,
                 batch_size=2, seed=0)
