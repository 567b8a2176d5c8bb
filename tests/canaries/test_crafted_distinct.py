"""crafted_distinct: one-hot canaries on distinct least-used features, one label each."""

import numpy as np
import pytest
import torch

from dpaudit.canaries import INPUT_SOURCES, crafted_distinct_inputs


def test_one_canary_per_unused_feature_labels_in_turn():
    x = torch.zeros(20, 1, 3, 3)
    x[:, 0, 1, 1] = torch.randn(20)  # feature 4 used, 0.5 mean |x| elsewhere below
    x[:5, 0, 2, 2] = 1.0  # feature 8 used a little
    c = crafted_distinct_inputs(x, num_classes=3, num=9, value=7.0)
    assert c.inputs.shape == (9, 1, 3, 3)
    flat = c.inputs.reshape(9, -1)
    assert torch.equal((flat != 0).sum(1), torch.ones(9, dtype=torch.long))
    assert (flat.sum(1) == 7.0).all()
    assert c.source.tolist()[:7] == [0, 1, 2, 3, 5, 6, 7]  # the unused ones first, by index
    assert set(c.source.tolist()[7:]) == {4, 8} and c.source[7] == 8  # then the least used
    assert c.targets.tolist() == [0, 1, 2, 0, 1, 2, 0, 1, 2]
    assert len(set(c.source.tolist())) == 9  # distinct features: no shared weight column


def test_source_registered_and_refuses_more_than_the_features():
    assert "crafted_distinct" in INPUT_SOURCES
    x = torch.zeros(4, 5)
    got = INPUT_SOURCES["crafted_distinct"].make(x, torch.zeros(4), 2, 50, np.random.default_rng(0),
                                                 3.0)
    assert len(got) == 5  # capped at one per feature
    with pytest.raises(ValueError, match="one canary per feature"):
        crafted_distinct_inputs(x, 2, num=6)
