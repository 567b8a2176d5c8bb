"""model.init=pretrained: the worst-case initial model, pre-trained on records the audit does
not train on (data's unused_train), seeded and refused where there are none."""

import numpy as np
import pytest
import torch

from dpaudit.data import load_dataset
from dpaudit.experiment.trainings.pretrain import pretrain
from dpaudit.models import build_model


def test_unused_train_is_the_rest_of_the_training_split():
    train, test, info = load_dataset("digits", seed=2, n_train=300)
    full, _, _ = load_dataset("digits", seed=2)
    rest = info.extra["unused_train"]
    assert len(rest) + len(train) == len(full)
    # standardised with the audited subset's statistics: the same map as the subset's rows
    x_sub = train.tensors[0].reshape(len(train), -1)
    assert torch.allclose(x_sub.mean(0)[x_sub.std(0) > 0], torch.zeros(1), atol=1e-5)
    # disjoint from the audited and the test rows (raw images compared through labels and
    # the ranks of their standardised values is fiddly: compare counts of exact duplicates)
    y_all = np.concatenate([train.tensors[1].numpy(), rest.tensors[1].numpy()])
    assert np.array_equal(np.sort(y_all), np.sort(full.tensors[1].numpy()))
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

    with pytest.raises(ValueError, match="data.n_train"):
        run_audit(model={"init": "pretrained"}, progress=False)
    with pytest.raises(ValueError, match="no records to pre-train on"):
        pretrain(build_model("logreg", (4,), 2), torch.utils.data.TensorDataset(
            torch.zeros(0, 4), torch.zeros(0, dtype=torch.long)), epochs=1, lr=0.1,
                 batch_size=2, seed=0)
